// Host launch of the head_dim 256 wgmma backward main kernel (bwd_sm90_hd256_kernel.cuh); both mask variants.
// Instantiated once per dtype in bwd_sm90_<dtype>_hd256.cu.
#pragma once

#include <cuda_runtime.h>

#include "kernels/sm90/bwd/bwd_sm90_entry.cuh"
#include "kernels/sm90/bwd/bwd_sm90_hd256_kernel.cuh"

namespace flash4::sm90 {

// Grid (n_blocks of 64 keys, heads_kv, batch) (launch_bwd_wgmma_kernel); params.p.m_blocks counts 64-row Q tiles.
template <class Element>
void launch_bwd_wgmma_hd256(const bwd::BwdWgmmaParams& params, bool masked, cudaStream_t stream) {
  bwd::launch_bwd_wgmma_kernel<bwd::BwdWgmmaHd256Kernel<Element, true>, bwd::BwdWgmmaHd256Kernel<Element, false>>(
      params, masked, stream);
}

}  // namespace flash4::sm90
