// Host launch of one compiled forward configuration; instantiated once per (dtype, head dim, masked) in
// generated translation units (cmake/kernels.cmake) so the matrix compiles in parallel.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <optional>

#include "kernels/cuda_check.h"
#include "kernels/sm_count.h"
#include "kernels/smem_opt_in.h"
#include "kernels/stream_workspace.h"
#include "kernels/sm90/fwd/fwd_kernel.cuh"
#include "kernels/sm90/zero_counters.h"

namespace flash4::sm90 {

// The library's kernels of one (dtype, head dim, masked): the launch configuration picks the table's or the
// short-problem kernel and the grid (fwd_launch_config, chosen once by dispatch).
template <class Element, int kHeadDim, bool kMasked>
void launch_forward(const FwdParams& params, const FwdLaunchConfig& launch, cudaStream_t stream);

// Any compiled configuration `Config` (FwdTableConfig, or an edited one in the ablation benchmark and tests):
// persistent CTAs (at most one per SM, each claiming tiles until none are left) or one CTA per tile.
template <class Element, int kHeadDim, bool kMasked, class Config>
void launch_forward_kernel(const FwdParams& params, bool persistent, cudaStream_t stream) {
  using Kernel = FwdKernel<Element, kHeadDim, kMasked, Config>;
  auto* kernel = &fwd_kernel<Kernel>;
  detail::opt_in_shared_memory<&fwd_kernel<Kernel>>(Kernel::kSmemBytes);  // once per device
  const int sms = detail::current_device_sm_count();
  const int64_t tiles = int64_t(params.num_m_blocks) * params.heads * params.batch;
  const int grid = static_cast<int>(std::min<int64_t>(tiles, persistent ? sms : tiles));
  // The scheduler's counter, zero at launch and left zero by the kernel: from the stream's slice of the counter
  // pool (concurrent calls on other streams have their own), else zeroed on the stream in a workspace.
  FwdParams launch_params = params;
  launch_params.tile_counter = pooled_zero_counters(1, stream);
  std::optional<detail::StreamWorkspace> counter;
  if (launch_params.tile_counter == nullptr) {
    counter.emplace(sizeof(int), stream);
    launch_params.tile_counter = reinterpret_cast<int*>(counter->data());
    FLASH4_CUDA_CHECK(cudaMemsetAsync(launch_params.tile_counter, 0, sizeof(int), stream));
  }
  kernel<<<grid, Kernel::kThreads, Kernel::kSmemBytes, stream>>>(launch_params);
  FLASH4_CUDA_CHECK(cudaGetLastError());
}

template <class Element, int kHeadDim, bool kMasked>
void launch_forward(const FwdParams& params, const FwdLaunchConfig& launch, cudaStream_t stream) {
  if constexpr (fwd_has_short_config(kHeadDim, kMasked)) {
    if (launch.short_tile)
      return launch_forward_kernel<Element, kHeadDim, kMasked, FwdTableConfig<kHeadDim, kMasked, true>>(
          params, launch.persistent, stream);
  }
  launch_forward_kernel<Element, kHeadDim, kMasked, FwdTableConfig<kHeadDim, kMasked>>(params, launch.persistent,
                                                                                         stream);
}

// The kernel of a v / out head dim narrower than q / k's (fwd_has_split_kernel): its own tile, no short tile.
template <class Element, int kHeadDim, int kHeadDimV, bool kMasked>
void launch_forward_split(const FwdParams& params, const FwdLaunchConfig& launch, cudaStream_t stream) {
  launch_forward_kernel<Element, kHeadDim, kMasked, FwdSplitTableConfig<kHeadDim, kHeadDimV, kMasked>>(
      params, launch.persistent, stream);
}

// The FP8 (e4m3) kernel of one (head dim, masked): its own tile table (fwd_fp8_tile_config), no short tile.
template <int kHeadDim, bool kMasked>
void launch_forward_fp8(const FwdParams& params, bool persistent, cudaStream_t stream) {
  launch_forward_kernel<__nv_fp8_e4m3, kHeadDim, kMasked, FwdFp8TableConfig<kHeadDim>>(params, persistent, stream);
}

}  // namespace flash4::sm90
