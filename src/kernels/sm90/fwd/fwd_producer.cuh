// The forward's producer: one thread of warpgroup 0 issues every TMA load of the CTA.
//
// Per tile: its Q into a Q buffer (after the consumers released that buffer: q_empty), then its K/V tiles, last
// to first, into a ring of `stages` slots (k_full / v_full on arrival; k_empty as soon as S = Q K^T is done and
// v_empty after P V, so the next K load starts a whole softmax earlier). The ring runs on across tiles.
// Tiles are handed out dynamically: a CTA starts with tile blockIdx.x and claims the next unclaimed one from a
// global counter near the end of this one's K/V stream (kClaimLead), then publishes it to the consumers with its
// Q load (tile_id; -1 = no more tiles). With two Q buffers that load is issued right after the claim, so the
// consumers find the next Q in place when they finish this tile; with one, after this tile's last S.
#pragma once

#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/shared_atomic.cuh"
#include "hw/sm90/tma.cuh"
#include "kernels/sm90/fwd/fwd_params.h"
#include "kernels/sm90/fwd/fwd_tile_scheduler.h"

namespace flash4::sm90 {

template <class Traits>
struct FwdProducer {
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kStages = Traits::kStages, kQBuffers = Traits::kQBuffers, kChunks = Traits::kChunks;
  static constexpr int kChunkCols = Traits::kChunkCols;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  // With a mask the next tile is claimed with the key tile this many before the current tile's last: late
  // enough that a CTA busy with a long tile leaves the next long one to a CTA that frees up sooner (claimed with
  // the first, it held it for the whole tile: the longest-first order lost its balance), early enough that the
  // claim's round trip and the next Q's load (two Q buffers) finish before the consumers need them. Tiles without
  // a mask are all alike: claimed with the first key tile.
  static constexpr int kClaimLead = Traits::kMasked ? 1 : 1 << 30;

  // Where key j of entry b lies in a KV cache (FwdParams::kv): (row, slot) coordinates of the cache map. 32-bit
  // and from the parameters directly (the producer runs on few registers). Pages are powers of two (the route
  // requires it: fwd_kvcache.h); page numbers and cache rows are clamped like PagedKeys::at (common/paged_keys.h),
  // so a bad table reads a wrong page, never outside the pool.
  static __device__ __forceinline__ int2 cache_coords(const FwdParams& p, int b, int j) {
    const int last_slot = static_cast<int>(p.kv.num_slots) - 1;
    if (p.kv.paged) {
      const int page = min(j >> p.kv.page_shift, static_cast<int>(p.kv.max_pages) - 1);
      const int slot = p.kv.block_table[b * p.kv.block_table_stride + page];
      return make_int2(j - (page << p.kv.page_shift), min(max(slot, 0), last_slot));
    }
    const int slot = p.kv.cache_batch_idx != nullptr ? p.kv.cache_batch_idx[b] : b;
    return make_int2(j, min(max(slot, 0), last_slot));
  }

  // One K or V tile: keys row0 .. row0 + kBlockN - 1 of batch entry `batch` of the map, or from a KV cache
  // (p.kv_cache, whose batches are dense: entry `batch`, key row0 of its sequence) from the cache row or page
  // its keys lie in (a page holds whole tiles: fwd_kvcache.h). Keys past the cache's capacity come from rows the
  // map zero-fills or from a clamped page; they lie past the entry's keys, where the consumers mask S and zero V
  // (FwdMainloop::clear_v_tail).
  // kNumChunks: the row's 128-byte chunks (K: Traits::kChunks, V: Traits::kChunksV).
  template <int kNumChunks, class Tile>
  static __device__ __forceinline__ void load_keys(const FwdParams& p, const CUtensorMap* map, Tile& dst, int row0,
                                                   int head_kv, int batch, uint64_t* full) {
    int row = row0, slot = batch;
    if (p.kv_cache) {
      const int2 at = cache_coords(p, batch, row0);
      row = at.x;
      slot = at.y;
    }
#pragma unroll
    for (int c = 0; c < kNumChunks; ++c) tma::load_4d(&dst[c][0][0], map, c * kChunkCols, row, head_kv, slot, full);
  }
  // FP8: the V^T tile of keys row0 .. row0 + kBlockN - 1, one box of 128 keys by d rows per chunk from the
  // transposed copy (b, hkv, d, keys) (fwd_fp8.cu).
  template <class Tile>
  static __device__ __forceinline__ void load_vt(const FwdParams& p, Tile& dst, int row0, int head_kv, int batch,
                                                 uint64_t* full) {
#pragma unroll
    for (int c = 0; c < Traits::kVChunks; ++c)
      tma::load_4d(&dst[c][0][0], &p.tma_v, row0 + c * 128, 0, head_kv, batch, full);
  }

  static __device__ __forceinline__ void run(const FwdParams& p, SharedStorage& s,
                                             const FwdTileScheduler<Traits::kMasked>& scheduler) {
    tma::prefetch_descriptor(&p.tma_q);
    tma::prefetch_descriptor(&p.tma_k);
    tma::prefetch_descriptor(&p.tma_v);
    PipelineState<kStages> st;
    PipelineState<kQBuffers> qst;
    // Tile t (or -1: no more tiles) and its Q into the next Q buffer, once the consumers are done with its
    // previous tile.
    auto load_q = [&](int t) {
      mbarrier::wait(&s.q_empty[qst.stage], qst.phase ^ 1u);  // a fresh barrier counts as released
      if (t >= scheduler.total()) {
        shared_atomic_exchange(&s.tile_id[qst.stage], -1);
        mbarrier::arrive(&s.q_full[qst.stage]);  // completes the phase without data: consumers see -1 and stop
      } else {
        shared_atomic_exchange(&s.tile_id[qst.stage], t);
        const FwdTile tile = scheduler.tile(t);
        const detail::SequenceInfo si = p.seq.info(tile.batch);
        mbarrier::arrive_expect_tx(&s.q_full[qst.stage], Traits::kQBytes);
        const int row = static_cast<int>(si.q_offset) + tile.m_block * kBlockM;
        const int batch = p.seq.cu_seqlens_q != nullptr ? 0 : tile.batch;  // packed: one batch entry
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma::load_4d(&s.q[qst.stage][c][0][0], &p.tma_q, c * kChunkCols, row, tile.head, batch,
                       &s.q_full[qst.stage]);
      }
      qst.advance();
    };
    int t = static_cast<int>(blockIdx.x);
    if constexpr (kQBuffers == 2) load_q(t);  // then each next one right after it is claimed
    for (;;) {
      if constexpr (kQBuffers == 1) load_q(t);  // after the previous tile's last S
      if (t >= scheduler.total()) break;
      const FwdTile tile = scheduler.tile(t);
      int next = 0;
      bool next_claimed = false, next_published = false;
      // Each tile's CTA claims once more, so the claims number exactly the tiles (claims past the last tile end
      // the CTAs); the last one sets the counter back to zero, as the pool it came from needs (zero_counters.h).
      auto claim_next = [&] {
        const int claim = atomicAdd(p.tile_counter, 1);
        if (claim == scheduler.total() - 1) atomicExch(p.tile_counter, 0);
        next = static_cast<int>(gridDim.x) + claim;
        next_claimed = true;
      };
      const detail::SequenceInfo si = p.seq.info(tile.batch);
      const typename Traits::TileKeys keys =
          Traits::tile_keys(detail::SequenceMask::make(p.mask, si.seqlen_q, si.seqlen_k), tile.m_block);
      const int head_kv = tile.head / p.group;
      const int key0 = static_cast<int>(si.k_offset);
      const int batch = p.seq.cu_seqlens_k != nullptr ? 0 : tile.batch;  // packed: one batch entry
      for (int n = keys.n_max; n >= keys.n_min; --n) {
        if (!next_claimed && n - keys.n_min <= kClaimLead) claim_next();
        mbarrier::wait(&s.k_empty[st.stage], st.phase ^ 1u);  // a fresh barrier counts as released
        mbarrier::arrive_expect_tx(&s.k_full[st.stage], Traits::kKTileBytes);
        load_keys<kChunks>(p, &p.tma_k, s.k[st.stage], key0 + n * kBlockN, head_kv, batch, &s.k_full[st.stage]);
        mbarrier::wait(&s.v_empty[st.stage], st.phase ^ 1u);
        mbarrier::arrive_expect_tx(&s.v_full[st.stage], Traits::kVTileBytes);
        if constexpr (Traits::kFp8) load_vt(p, s.v[st.stage], n * kBlockN, head_kv, batch, &s.v_full[st.stage]);
        else
          load_keys<Traits::kChunksV>(p, &p.tma_v, s.v[st.stage], key0 + n * kBlockN, head_kv, batch,
                                      &s.v_full[st.stage]);
        st.advance();
        if (kQBuffers == 2 && next_claimed && !next_published) {
          load_q(next);  // the other buffer: released by the previous tile's last S
          next_published = true;
        }
      }
      if (!next_claimed) claim_next();  // a tile without keys
      if (kQBuffers == 2 && !next_published) load_q(next);
      t = next;
    }
  }
};

}  // namespace flash4::sm90
