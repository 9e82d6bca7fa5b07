// The SM count of the current device, queried once per device: persistent launches size their grid with it on
// every call, and the attribute query is a driver call.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "kernels/cuda_check.h"

namespace flash4::detail {

inline int current_device_sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};
  int device = 0;
  FLASH4_CUDA_CHECK(cudaGetDevice(&device));
  int sms = device < kMaxDevices ? cache[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    FLASH4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (device < kMaxDevices) cache[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

}  // namespace flash4::detail
