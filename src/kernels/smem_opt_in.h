// The dynamic shared-memory opt-in of a kernel (cudaFuncSetAttribute MaxDynamicSharedMemorySize), once per
// (kernel, device): the attribute is per device and stays set, and as a driver call on every launch it is part of
// the per-call cost that small problems (and training steps of small models) pay.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "kernels/cuda_check.h"

namespace flash4::detail {

// kKernel: the __global__ function (its address makes each kernel's flags its own). prefer_max_carveout: also ask
// for the largest shared-memory carveout, for kernels that need it for several resident CTAs per SM (the driver
// sizes the carveout from the launch otherwise, which may leave room for one).
template <auto kKernel>
void opt_in_shared_memory(int bytes, bool prefer_max_carveout = false) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices] = {};
  int device = 0;
  FLASH4_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices && done[device].load(std::memory_order_relaxed)) return;
  FLASH4_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (prefer_max_carveout)
    FLASH4_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
  if (device < kMaxDevices) done[device].store(true, std::memory_order_relaxed);
}

}  // namespace flash4::detail
