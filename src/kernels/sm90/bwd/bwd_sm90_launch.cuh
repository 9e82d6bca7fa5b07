// Host launch of the wgmma backward main kernel for one (dtype, head dim); both mask variants. Instantiated once
// per (dtype, head dim) in bwd_sm90_<dtype>_hd<d>.cu so the matrix compiles in parallel.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/sm90/bwd/bwd_sm90_entry.cuh"
#include "kernels/sm90/bwd/bwd_sm90_kernel.cuh"

namespace flash4::sm90 {

// Launches the kernel on a (n_blocks, heads_kv, batch) grid (n_blocks in units of WgmmaTile::kBlockN); the caller
// guarantees all three are >= 1 and that params.p.m_blocks counts WgmmaTile::kBlockM tiles.
template <class Element, int kHeadDim>
void launch_bwd_wgmma(const bwd::BwdWgmmaParams& params, bool masked, cudaStream_t stream);

template <class Element, int kHeadDim>
void launch_bwd_wgmma(const bwd::BwdWgmmaParams& params, bool masked, cudaStream_t stream) {
  using Masked = bwd::BwdWgmmaKernel<Element, kHeadDim, true>;
  using Unmasked = bwd::BwdWgmmaKernel<Element, kHeadDim, false>;
  static_assert(Masked::kSmemBytes == Unmasked::kSmemBytes);
  constexpr int kSmemBytes = Masked::kSmemBytes;
  auto* kernel = masked ? &bwd::bwd_wgmma_kernel<Masked> : &bwd::bwd_wgmma_kernel<Unmasked>;
  FLASH4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  // blockIdx.x (n_block in grid_n_block's order) is the fastest grid index: in deterministic mode a CTA waits only
  // on CTAs of the same (kv head, batch) with lower linear block indices, which are therefore already scheduled.
  const dim3 grid(params.p.n_blocks, params.p.heads_kv, params.p.batch);
  kernel<<<grid, Masked::kThreads, kSmemBytes, stream>>>(params);
  FLASH4_CUDA_CHECK_LAUNCH();
}

}  // namespace flash4::sm90
