// The producer warp shared by the wgmma backward kernels (bwd_wgmma_kernel.cuh, bwd_wgmma_roles_kernel.cuh).
#pragma once

#include <cstdint>

#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/tma.cuh"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"

namespace flash4::sm90::bwd {

// The barriers of produce_item's ring (one thread, before the kernel's fence_init and __syncthreads): kv_full
// completes on K, V's TMA bytes; full[stage] on the Q / dO TMA bytes plus the 32 LSE / D lanes; empty[stage] on
// one arrival per consumer thread (each orders its own LSE / D reads before the next refill); with
// Kernel::kPersistent, kv_empty on one arrival per consumer thread once it has finished the item's K, V reads.
template <class Kernel, class Storage>
__device__ __forceinline__ void init_producer_barriers(Storage& s) {
  mbarrier::init(&s.kv_full, 1);
  for (int i = 0; i < Kernel::kStages; ++i) {
    mbarrier::init(&s.full[i], 1 + 32);
    mbarrier::init(&s.empty[i], Kernel::kConsumers * 128);
  }
  if constexpr (Kernel::kPersistent) mbarrier::init(&s.kv_empty, Kernel::kConsumers * 128);
}

// The producer warp of the wgmma backward kernels, one work item (key tile n_block, kv slot `slot`: GroupPart):
// K, V (TMA) on kv_full; then per Q tile Q and dO
// (TMA) into the ring and LSE * log2e and D by the 32 lanes (+inf / 0 past the sequence). `Kernel` gives the tile
// constants and its SharedStorage the k, v, q, dout, lse, dsum tiles and the kv_full / full / empty barriers.
// `ring` and `kv_loads` carry over from the CTA's previous item (a persistent CTA): with Kernel::kPersistent, K and
// V are loaded again only once the consumers have released the previous ones (kv_empty), while the ring already
// takes the new item's first Q tiles. `e`: the item's batch entry (BwdParams itself in a dense launch, its
// BwdSequence in a packed one: rows from its offsets, LSE / D valid for its own queries).
template <class Kernel, class Storage, class Entry>
__device__ __forceinline__ void produce_item(const BwdWgmmaParams& P, Storage& s, const Entry& e, int n_block,
                                             int slot, int b, QRange range, PipelineState<Kernel::kStages>& ring,
                                             uint32_t& kv_loads) {
  // K, Q: kChunks 64-column chunks per row; V, dO: the first kChunksV of them (fewer where v is narrower).
  constexpr int kChunks = Kernel::kChunks, kChunksV = Kernel::kChunksV;
  constexpr int kBlockM = Kernel::kBlockM, kBlockN = Kernel::kBlockN;
  const BwdParams& p = P.p;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const GroupPart gp = group_part(p, slot);  // the kv head and the item's query heads
  const int iterations = gp.heads * range.m_count;
  if (iterations == 0) return;  // the consumers write dK = dV = 0 and touch no shared tile
  auto load_kv = [&] {
    if (lane != 0) return;
    if constexpr (Kernel::kPersistent) {
      mbarrier::wait(&s.kv_empty, (kv_loads & 1u) ^ 1u);  // the previous item's K, V are no longer read
    }
    mbarrier::arrive_expect_tx(&s.kv_full, Kernel::kKBytes + Kernel::kVBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int key0 = e.k_offset + n_block * kBlockN, kb = e.packed_k ? 0 : b;
      tma::load_4d(&s.k[c][0][0], &P.tma_k, c * 64, key0, gp.hkv, kb, &s.kv_full);
      if (c < kChunksV) tma::load_4d(&s.v[c][0][0], &P.tma_v, c * 64, key0, gp.hkv, kb, &s.kv_full);
    }
  };
  if (lane == 0 && kv_loads == 0) {
    tma::prefetch_descriptor(&P.tma_q);
    tma::prefetch_descriptor(&P.tma_do);
  }
  // The first item loads K, V first. A later one first puts its first Q tile into the stage that the consumers
  // freed while they still work on the previous item's last tile, and only then waits for them to release K, V.
  auto load_tile = [&](int it) {
    const int h = gp.h_first + it / range.m_count;
    const int m0 = range.m_block(it % range.m_count) * kBlockM;
    mbarrier::wait(&s.empty[ring.stage], ring.phase ^ 1u);  // a fresh barrier counts as released
    if (lane == 0) {
      mbarrier::arrive_expect_tx(&s.full[ring.stage], Kernel::kQBytes + Kernel::kDoBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int row = e.q_offset + m0, qb = e.packed_q ? 0 : b;
        tma::load_4d(&s.q[ring.stage][c][0][0], &P.tma_q, c * 64, row, h, qb, &s.full[ring.stage]);
        if (c < kChunksV)
          tma::load_4d(&s.dout[ring.stage][c][0][0], &P.tma_do, c * 64, row, h, qb, &s.full[ring.stage]);
      }
    }
    const int64_t row0 = workspace_row0(p, e, b, h);
#pragma unroll
    for (int r = lane; r < kBlockM; r += 32) {
      const int i = m0 + r;
      const bool valid = i < e.seqlen_q;
      s.lse[ring.stage][r] = valid ? p.lse_log2[row0 + i] : __int_as_float(0x7f800000);
      s.dsum[ring.stage][r] = valid ? p.dsum[row0 + i] : 0.0f;
    }
    mbarrier::arrive(&s.full[ring.stage]);  // release: this lane's LSE / D stores
    ring.advance();
  };
  if constexpr (Kernel::kPersistent) {
    // The first tile is peeled so that the loop below holds none of load_kv's state (K, V coordinates, kv_loads).
    if (kv_loads == 0) load_kv();
    load_tile(0);
    if (kv_loads > 0) load_kv();
    for (int it = 1; it < iterations; ++it) load_tile(it);
  } else {
    load_kv();
    for (int it = 0; it < iterations; ++it) load_tile(it);
  }
  ++kv_loads;
}

// One CTA, one work item (a kernel without kPersistent).
template <class Kernel, class Storage, class Entry>
__device__ __forceinline__ void produce_tiles(const BwdWgmmaParams& P, Storage& s, const Entry& e, int n_block,
                                              int slot, int b, QRange range) {
  PipelineState<Kernel::kStages> ring;
  uint32_t kv_loads = 0;
  produce_item<Kernel>(P, s, e, n_block, slot, b, range, ring, kv_loads);
}

}  // namespace flash4::sm90::bwd
