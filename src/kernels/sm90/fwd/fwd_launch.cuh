// Host launch of one forward configuration; instantiated once per (dtype, head dim, masked) in generated
// translation units (cmake/kernels.cmake) so the matrix compiles in parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/sm_count.h"
#include "kernels/smem_opt_in.h"
#include "kernels/sm90/fwd/fwd_kernel.cuh"

namespace flash4::sm90 {

template <class Element, int kHeadDim, bool kMasked>
void launch_forward(const FwdParams& params, cudaStream_t stream);

template <class Element, int kHeadDim, bool kMasked, class Variant>
void launch_forward_variant(const FwdParams& params, cudaStream_t stream) {
  using Kernel = FwdKernel<Element, kHeadDim, kMasked, Variant>;
  constexpr int kSmemBytes = static_cast<int>(sizeof(typename Kernel::SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 232448, "forward tile configuration exceeds the 227 KB shared-memory limit");
  auto* kernel = &fwd_kernel<Kernel>;
  detail::opt_in_shared_memory<&fwd_kernel<Kernel>>(kSmemBytes);  // once per device
  // Persistent: at most one CTA per SM (one fits), each claiming tiles until none are left. Otherwise one CTA per
  // tile, and the hardware's block scheduler balances them.
  const int sms = detail::current_device_sm_count();
  const int64_t tiles = int64_t(params.num_m_blocks) * params.heads * params.batch;
  const bool persistent = Variant::persistent >= 0 ? Variant::persistent != 0
                                                  : fwd_launch_persistent(kHeadDim, kMasked, params.seqlen_q);
  const int grid = static_cast<int>(std::min<int64_t>(tiles, persistent ? sms : tiles));
  // The scheduler's counter: stream-ordered, so concurrent calls on other streams each get their own.
  FwdParams launch_params = params;
  FLASH4_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&launch_params.tile_counter), sizeof(int), stream));
  FLASH4_CUDA_CHECK(cudaMemsetAsync(launch_params.tile_counter, 0, sizeof(int), stream));
  kernel<<<grid, Kernel::kThreads, kSmemBytes, stream>>>(launch_params);
  const cudaError_t launch_status = cudaGetLastError();
  FLASH4_CUDA_CHECK(cudaFreeAsync(launch_params.tile_counter, stream));
  FLASH4_CUDA_CHECK(launch_status);
}

// The library's kernels: the table's configuration, or its short-problem one (fwd_config.h; the parameters
// were built for the same choice by make_fwd_params).
template <class Element, int kHeadDim, bool kMasked>
void launch_forward(const FwdParams& params, cudaStream_t stream) {
  if constexpr (fwd_has_short_config(kHeadDim, kMasked)) {
    if (fwd_use_short_config(kHeadDim, kMasked, params.seqlen_q)) {
      using Short = FwdVariant<-1, -1, 0, -1, -1, 0, 0, /*short_tiles=*/true>;
      return launch_forward_variant<Element, kHeadDim, kMasked, Short>(params, stream);
    }
  }
  launch_forward_variant<Element, kHeadDim, kMasked, FwdVariant<>>(params, stream);
}

}  // namespace flash4::sm90
