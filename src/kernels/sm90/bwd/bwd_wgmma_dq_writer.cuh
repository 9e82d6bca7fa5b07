// The dQ writers of the wgmma backward kernel (bwd_wgmma_kernel.cuh): each adds the consumer warpgroups' staged
// dQ pieces of its Q tiles into the fp32 (b, h, sq, d) accumulator with TMA reduce-adds, ordered by the (b, h,
// Q tile) semaphore in deterministic mode (bwd_schedule.h).
#pragma once

#include <cstdint>

#include "hw/sm90/fence.cuh"
#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/tma.cuh"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"
#include "kernels/sm90/device_math.cuh"

namespace flash4::sm90::bwd {

// One work item of dQ writer `writer` (lane 0 of warp 1 + writer): Q tiles writer, writer + kDqBuffers, ... of
// the item (the consumers stage tile T in buffer T % kDqBuffers, counting `tiles_before` tiles of the CTA's
// earlier items). `Kernel` gives the tile constants and its SharedStorage the dq pieces and dq_full / dq_empty.
template <class Kernel, bool kMasked, class Storage, class Entry>
__device__ __forceinline__ void write_dq_item(const BwdWgmmaParams& P, Storage& s, const Entry& e, int writer,
                                            int n_block, int slot, int b, QRange range, uint32_t tiles_before) {
  using Tile = typename Kernel::Tile;
  constexpr int kBlockM = Kernel::kBlockM, kConsumers = Kernel::kConsumers, kDqBuffers = Kernel::kDqBuffers;
  const BwdParams& p = P.p;
  constexpr bool kSplitRows = Tile::kDqSplitRows;
  const GroupPart gp = group_part(p, slot);
  const int iterations = gp.heads * range.m_count;
  const int stage = writer;
  // This writer's tiles of the item (bwd_schedule.h: the consumers stage tile T in buffer T % kDqBuffers).
  for (int it = dq_writer_first_tile(writer, tiles_before, kDqBuffers); it < iterations; it += kDqBuffers) {
    const uint32_t phase = dq_phase(tiles_before + static_cast<uint32_t>(it), kDqBuffers);
    const int h = gp.h_first + it / range.m_count;
    const int m_block = range.m_block(it % range.m_count);
    int* semaphore = nullptr;
    if (p.deterministic) {
      semaphore = p.semaphores + (static_cast<int64_t>(b) * p.heads + h) * p.m_blocks + m_block;
      // Each visible (Q tile, earlier n_block) contributes one release per consumer warpgroup.
      const int expected = releases_before<Tile, kMasked>(e, m_block, n_block, kConsumers);
      while (ld_acquire_gpu(semaphore) != expected) __nanosleep(64);
      fence_async_global();  // the acquired additions -> our TMA additions
    }
#pragma unroll
    for (int w = 0; w < kConsumers; ++w) {
      mbarrier::wait(&s.dq_full[stage][w], phase);
      const char* piece = reinterpret_cast<const char*>(&s.dq[stage][w][0][0][0]);
      const int row0 = m_block * kBlockM + (kSplitRows ? w * 64 : 0), col0 = kSplitRows ? 0 : w * 64;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // A half wholly past the accumulator's width (d = 96 on this d = 128 kernel: columns 96 .. 127, zeros from
        // K's padded columns) is not sent; the width is a multiple of 32 (fragment order, bwd_params.h).
        if (col0 + 32 * half < p.dq_accum_cols)
          tma::reduce_add_4d(&P.tma_dq, col0 + 32 * half, e.q_offset + row0, h, e.packed_q ? 0 : b,
                             piece + half * (64 * 128));
      }
      tma::store_commit();
    }
    tma::store_wait_read_all();  // the pieces may be overwritten
#pragma unroll
    for (int w = 0; w < kConsumers; ++w) mbarrier::arrive(&s.dq_empty[stage][w]);
    if (p.deterministic) {
      tma::store_wait_all();             // our additions are performed
      fence_async_global();              // ... and ordered before the generic-proxy release below
      __threadfence();
      red_release_gpu_add(semaphore, kConsumers);
    }
  }
}


}  // namespace flash4::sm90::bwd
