// Host launch of the backward main kernel for one (dtype, head dim); both mask variants. Instantiated once per
// (dtype, head dim) in bwd_main_<dtype>_hd<d>.cu so the matrix compiles in parallel.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/smem_opt_in.h"
#include "kernels/sm90/bwd/bwd_kernel.cuh"
#include "kernels/sm90/bwd/bwd_params.h"

namespace flash4::sm90 {

// Launches bwd_main_kernel on a (n_blocks * column slices, heads_kv, batch) grid; the caller guarantees all three
// are >= 1 and, in deterministic mode, semaphores for every column slice (Tile::kColSlices).
template <class Element, int kHeadDim>
void launch_bwd_main(const BwdParams& params, bool masked, cudaStream_t stream);

template <class Element, int kHeadDim>
void launch_bwd_main(const BwdParams& params, bool masked, cudaStream_t stream) {
  using Tile = bwd::BwdTile<kHeadDim>;
  auto* kernel = masked ? &bwd::bwd_main_kernel<Element, kHeadDim, true> : &bwd::bwd_main_kernel<Element, kHeadDim, false>;
  if (masked) {
    detail::opt_in_shared_memory<&bwd::bwd_main_kernel<Element, kHeadDim, true>>(Tile::kSmemBytes);
  } else {
    detail::opt_in_shared_memory<&bwd::bwd_main_kernel<Element, kHeadDim, false>>(Tile::kSmemBytes);
  }
  // (n_block, column slice) is the fastest grid index: in deterministic mode a CTA waits only on CTAs of lower
  // n_block of the same (slice, kv head, batch), which have lower linear block indices and are therefore already
  // scheduled. The slices of one K/V tile are neighbours, so they share its K/V/Q/dO reads in L2.
  const dim3 grid(params.n_blocks * Tile::kColSlices, params.heads_kv, params.batch);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(params);
  FLASH4_CUDA_CHECK_LAUNCH();
}

}  // namespace flash4::sm90
