// Host launch of the wgmma backward main kernel for one (dtype, head dim); both mask variants. Instantiated once
// per (dtype, head dim) in bwd_sm90_<dtype>_hd<d>.cu so the matrix compiles in parallel.
#pragma once

#include <cuda_runtime.h>

#include "kernels/sm90/bwd/bwd_wgmma_entry.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_kernel.cuh"

namespace flash4::sm90 {

// Launches the kernel on a (n_blocks, heads_kv, batch) grid (n_blocks in units of WgmmaTile::kBlockN); the caller
// guarantees all three are >= 1 and that params.p.m_blocks counts WgmmaTile::kBlockM tiles.
template <class Element, int kHeadDim>
void launch_bwd_wgmma(const bwd::BwdWgmmaParams& params, bool masked, cudaStream_t stream);

// Persistent CTAs when the caller set a work counter (bwd_api.cu: outside deterministic mode, where
// bwd_persistent_pays), else one CTA per work item.
template <class Element, int kHeadDim>
void launch_bwd_wgmma(const bwd::BwdWgmmaParams& params, bool masked, cudaStream_t stream) {
  if (params.p.work_counter != nullptr) {
    bwd::launch_bwd_wgmma_kernel<bwd::BwdWgmmaKernel<Element, kHeadDim, true, true>,
                                 bwd::BwdWgmmaKernel<Element, kHeadDim, false, true>>(params, masked, stream);
  } else {
    bwd::launch_bwd_wgmma_kernel<bwd::BwdWgmmaKernel<Element, kHeadDim, true, false>,
                                 bwd::BwdWgmmaKernel<Element, kHeadDim, false, false>>(params, masked, stream);
  }
}

}  // namespace flash4::sm90
