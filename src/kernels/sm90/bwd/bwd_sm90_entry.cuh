// The __global__ entry of the wgmma backward kernels (bwd_sm90_kernel.cuh, bwd_sm90_hd256_kernel.cuh): one CTA of
// `Kernel` on its 1024-byte aligned dynamic shared memory.
#pragma once

#include <cstdint>

#include "kernels/sm90/bwd/bwd_wgmma_params.h"

namespace flash4::sm90::bwd {

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1) bwd_wgmma_kernel(const __grid_constant__ BwdWgmmaParams params) {
  extern __shared__ char smem_unaligned[];
  // 128B-swizzled tiles must start on 1024-byte boundaries.
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_unaligned) + 1023) & ~uintptr_t(1023));
  Kernel::run(params, smem);
}

}  // namespace flash4::sm90::bwd
