// Host launch of the head_dim 256 wgmma backward main kernel (bwd_sm90_hd256_kernel.cuh); both mask variants.
// Instantiated once per dtype in bwd_sm90_<dtype>_hd256.cu.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/sm90/bwd/bwd_sm90_entry.cuh"
#include "kernels/sm90/bwd/bwd_sm90_hd256_kernel.cuh"

namespace flash4::sm90 {

// Grid (n_blocks of 64 keys, heads_kv, batch); params.p.m_blocks counts 64-row Q tiles. blockIdx.x (n_block in
// grid_n_block's order) is the fastest grid index: a deterministic CTA waits only on CTAs of the same (kv head,
// batch) with lower linear block indices, which are therefore already scheduled.
template <class Element>
void launch_bwd_wgmma_hd256(const bwd::BwdWgmmaParams& params, bool masked, cudaStream_t stream) {
  using Masked = bwd::BwdWgmmaHd256Kernel<Element, true>;
  using Unmasked = bwd::BwdWgmmaHd256Kernel<Element, false>;
  static_assert(Masked::kSmemBytes == Unmasked::kSmemBytes);
  constexpr int kSmemBytes = Masked::kSmemBytes;
  auto* kernel = masked ? &bwd::bwd_wgmma_kernel<Masked> : &bwd::bwd_wgmma_kernel<Unmasked>;
  FLASH4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid(params.p.n_blocks, params.p.heads_kv, params.p.batch);
  kernel<<<grid, Masked::kThreads, kSmemBytes, stream>>>(params);
  FLASH4_CUDA_CHECK_LAUNCH();
}

}  // namespace flash4::sm90
