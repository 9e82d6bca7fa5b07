// Host helpers shared by the CUDA entry points: switching to the tensors' device for one call, and a cached
// "is this an sm_90 device" answer (cudaGetDeviceProperties costs far more than a launch, so it must not run
// on every call).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda_check.h"

namespace flash4::detail {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : switched_(false) {
    FLASH4_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) {
      FLASH4_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);  // no driver call per API call when the device is already current
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_;
};

}  // namespace flash4::detail
