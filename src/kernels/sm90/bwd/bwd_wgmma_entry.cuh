// The __global__ entry of the wgmma backward kernels (bwd_wgmma_kernel.cuh, bwd_wgmma_roles_kernel.cuh): one CTA of
// `Kernel` on its 1024-byte aligned dynamic shared memory.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/sm_count.h"
#include "kernels/smem_opt_in.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"

namespace flash4::sm90::bwd {

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1) bwd_wgmma_kernel(const __grid_constant__ BwdWgmmaParams params) {
  // 128B-swizzled tiles must start on 1024-byte boundaries: the base is declared 1024-aligned, and a kernel whose
  // kSmemBytes has no slack for realigning it (the d = 64 / 128 kernel) stops if it were not (tested:
  // HopperLayer.DynamicSharedMemoryBaseIs1024Aligned). The pointer is advanced from the __shared__ array (not
  // rebuilt from an integer), so the compiler still knows it is shared memory: rebuilt, every plain access
  // through it (LSE / D reads, dQ staging stores) became a generic 64-bit LD / ST, and their precomputed 64-bit
  // addresses spilled.
  extern __shared__ __align__(1024) char smem_base[];
  const uint32_t misalignment = static_cast<uint32_t>(__cvta_generic_to_shared(smem_base)) & 1023u;
  const uint32_t advance = (1024u - misalignment) & 1023u;
  if (advance + sizeof(typename Kernel::SharedStorage) > static_cast<uint32_t>(Kernel::kSmemBytes)) __trap();
  Kernel::run(params, smem_base + advance);
}

// Launches the masked or unmasked kernel. Kernels with kPersistent (launched only with a work counter, outside
// deterministic mode: launch_bwd_wgmma): one CTA per SM on a 1-D grid, each claiming work items until none are
// left (bwd_schedule.h). Otherwise one CTA per item on item_grid: a (n_blocks, kv slots, batch) grid (kv_slots:
// the kv heads times the GQA group's parts) with the key step the fastest index, so that in deterministic mode a
// CTA waits only on CTAs of the same (kv head, batch) with lower linear block indices, which are therefore already
// scheduled; or, where the slots come first (BwdParams::order_section), a 1-D grid in that order.
template <class Masked, class Unmasked>
void launch_bwd_wgmma_kernel(const BwdWgmmaParams& params, bool masked, cudaStream_t stream) {
  static_assert(Masked::kThreads == Unmasked::kThreads);
  // Sizes may differ: d = 64 unmasked one-item launches stage dQ in one buffer (bwd_wgmma_kernel.cuh, kDqBuffers).
  const int smem_bytes = masked ? Masked::kSmemBytes : Unmasked::kSmemBytes;
  auto* kernel = masked ? &bwd_wgmma_kernel<Masked> : &bwd_wgmma_kernel<Unmasked>;
  if (masked) detail::opt_in_shared_memory<&bwd_wgmma_kernel<Masked>>(smem_bytes);
  else detail::opt_in_shared_memory<&bwd_wgmma_kernel<Unmasked>>(smem_bytes);
  const long long items = work_items(params.p);
  if (items >= (1LL << 31)) {  // refused by cuda_can_backward before anything runs
    throw Error(Status::kNotSupported, "flash4::backward: more than 2^31 work items for the GPU");
  }
  const GridDims dims = item_grid(params.p);
  dim3 grid(dims.x, dims.y, dims.z);
  if constexpr (Masked::kPersistent) {
    if (params.p.work_counter == nullptr) {
      throw Error(Status::kInternal, "flash4::backward: a persistent kernel launched without a work counter");
    }
    grid = dim3(static_cast<unsigned>(std::min<long long>(items, detail::current_device_sm_count())));
  }
  kernel<<<grid, Masked::kThreads, smem_bytes, stream>>>(params);
  FLASH4_CUDA_CHECK_LAUNCH();
}

}  // namespace flash4::sm90::bwd
