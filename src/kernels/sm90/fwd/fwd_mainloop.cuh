// The forward's consumer mainloop: one warpgroup's 64 query rows of a tile, built from named steps.
//
//   first S     S = Q K(first)^T alone (nothing to overlap with yet), its softmax, P into a fragment buffer.
//   overlap     S(n) = Q K(n)^T issued together with O += P(pending) V; the softmax of S(n) runs while that P V
//               is on the tensor cores (FA3's intra-warpgroup overlap); then the (rare) rescale of O.
//   last P V    O += P(last) V alone.
// Two consumers use them: `consume` below runs one tile (first S, overlap steps, last P V, epilogue);
// FwdStreamMainloop (fwd_mainloop_stream.cuh; kCrossTile, d = 128) runs a warpgroup's tiles as one stream, where the next tile's first S is itself an overlap
// step with this tile's last P V (the next Q already waits in the other Q buffer), so a tile boundary leaves the
// tensor cores no gap. With two P buffers (kDoubleP) P(n) is converted while P(pending) V still runs; which
// buffer is pending alternates in code (two instantiations of the step), never through a flag inside the step.
#pragma once

#include <cstdint>

#include "hw/sm90/fence.cuh"
#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/named_barrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/wgmma.cuh"
#include "kernels/sm90/fwd/fwd_epilogue.cuh"
#include "kernels/sm90/fwd/fwd_mma.cuh"
#include "kernels/sm90/fwd/fwd_params.h"
#include "kernels/sm90/fwd/fwd_tile_scheduler.h"

namespace flash4::sm90 {

template <class Traits>
struct FwdMainloop {
  using SharedStorage = typename Traits::SharedStorage;
  using Softmax = typename Traits::Softmax;
  using TileKeys = typename Traits::TileKeys;
  using Mma = FwdMma<Traits>;
  using Epilogue = FwdEpilogue<Traits>;
  using PFrag = typename Mma::PFrag;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr int kHeadDimV = Traits::kHeadDimV;
  static constexpr int kStages = Traits::kStages, kQBuffers = Traits::kQBuffers, kConsumers = Traits::kConsumers;
  static constexpr int kWgRows = Traits::kWgRows;
  static constexpr bool kMasked = Traits::kMasked, kDoubleP = Traits::kDoubleP;
  using Ring = PipelineState<kStages>;

  // Each consumer warp releases a stage once its own reads are done (wgmma waits are warp-synchronous).
  static __device__ __forceinline__ void release(uint64_t* empty, int lane) {
    __syncwarp();
    if (lane == 0) mbarrier::arrive(empty);
  }

  // Ping-pong: turns to issue matmuls go round the consumers in order 0, 1, .., kConsumers - 1, 0, ...; the last
  // warpgroup does not hand over after its final round, so arrivals stay balanced. No-ops without ping-pong.
  struct Turns {
    uint32_t mine, next;
    bool last_wg;
    int rounds_left;
    __device__ __forceinline__ Turns(int wg, int rounds)
        : mine(barrier_id(NamedBarrier::kPingPongTurnWg0, wg)),
          next(barrier_id(NamedBarrier::kPingPongTurnWg0, (wg + 1) % kConsumers)),
          last_wg(wg == kConsumers - 1),
          rounds_left(rounds) {
      if constexpr (Traits::kPingPong) {
        if (last_wg && rounds > 0) named_barrier_arrive(next, 2 * 128);  // warpgroup 0 goes first
      }
    }
    __device__ __forceinline__ void begin() {
      if constexpr (Traits::kPingPong) named_barrier_sync(mine, 2 * 128);
    }
    __device__ __forceinline__ void end() {
      if constexpr (Traits::kPingPong) {
        --rounds_left;
        if (!last_wg || rounds_left > 0) named_barrier_arrive(next, 2 * 128);
      }
    }
  };
  struct NoTurns {
    __device__ __forceinline__ void begin() {}
    __device__ __forceinline__ void end() {}
  };

  // First S: S(n) = Q K(n)^T with nothing else in flight; issue, wait, hand K's stage (and after the tile's last
  // S, Q) back.
  template <class TurnsT>
  static __device__ __forceinline__ void first_s(SharedStorage& s, int wg, int qb, const Ring& st, bool last_s,
                                                 float (&acc_s)[kBlockN / 2], TurnsT& turns, int lane) {
    mbarrier::wait(&s.k_full[st.stage], st.phase);
    turns.begin();
    wgmma::fence();
    Mma::issue_qk(s, wg, qb, st.stage, acc_s);
    wgmma::commit_group();
    turns.end();
    wgmma::wait_group<0>();
    wgmma::fence_operand(acc_s);
    release(&s.k_empty[st.stage], lane);
    if (last_s) release(&s.q_empty[qb], lane);
  }

  // Overlap step: S(n) = Q(qb) K(st)^T issued with O += pending V(st_pv); softmax_tile() turns S(n) into P while
  // that P V runs and returns whether O must be rescaled (by `factor`); P(n) into `next`. kSameTile = false when
  // S(n) is the next tile's first: O still holds this tile's rows and is not rescaled.
  template <bool kSameTile, class SoftmaxTile, class TurnsT>
  static __device__ __forceinline__ void overlap_step(SharedStorage& s, int wg, int qb, const Ring& st,
                                                      const Ring& st_pv, bool last_s, const PFrag& pending,
                                                      PFrag& next, float (&acc_s)[kBlockN / 2],
                                                      float (&acc_o)[kHeadDimV / 2], const float (&factor)[2],
                                                      SoftmaxTile&& softmax_tile, TurnsT& turns, int lane) {
    mbarrier::wait(&s.k_full[st.stage], st.phase);
    mbarrier::wait(&s.v_full[st_pv.stage], st_pv.phase);
    turns.begin();
    wgmma::fence();
    Mma::issue_qk(s, wg, qb, st.stage, acc_s);
    wgmma::commit_group();
    Mma::issue_pv(s, st_pv.stage, pending, acc_o);
    wgmma::commit_group();
    turns.end();
    wgmma::wait_group<1>();  // S(n) ready; the pending P V may still run
    wgmma::fence_operand(acc_s);
    release(&s.k_empty[st.stage], lane);
    if (last_s) release(&s.q_empty[qb], lane);
    const bool rescaled = softmax_tile();
    if constexpr (kDoubleP) Mma::convert_p(acc_s, next);
    wgmma::wait_group<0>();
    wgmma::fence_operand(acc_o);
    release(&s.v_empty[st_pv.stage], lane);
    if (kSameTile && rescaled) Mma::rescale_o(acc_o, factor);
    if constexpr (!kDoubleP) Mma::convert_p(acc_s, next);
  }

  // Last P V: O += P V(st_pv) alone.
  template <class TurnsT>
  static __device__ __forceinline__ void last_pv(SharedStorage& s, const Ring& st_pv, const PFrag& pending,
                                                 float (&acc_o)[kHeadDimV / 2], TurnsT& turns, int lane) {
    mbarrier::wait(&s.v_full[st_pv.stage], st_pv.phase);
    turns.begin();
    wgmma::fence();
    Mma::issue_pv(s, st_pv.stage, pending, acc_o);
    wgmma::commit_group();
    turns.end();
    wgmma::wait_group<0>();
    wgmma::fence_operand(acc_o);
    release(&s.v_empty[st_pv.stage], lane);
  }

  // Keys past an entry's end inside its last K/V tile can be rows of the caller's tensors that belong to no
  // sequence (past seqused_k, a KV cache's unwritten rows): any bits, NaN included. S hides them by a select, but
  // P V multiplies them by P = 0, and 0 * NaN is NaN. So where such rows can occur (p.clear_key_tail) the
  // consumers zero V(st)'s rows from `valid_rows` on before reading it. Every consumer warpgroup writes the
  // same zeros, so none can read anything else once its own are written; the barrier orders its 128 threads'
  // stores (made visible to wgmma's async proxy by the fence) before its P V.
  static __device__ __forceinline__ void clear_v_tail(SharedStorage& s, const Ring& st, int wg, int valid_rows) {
    mbarrier::wait(&s.v_full[st.stage], st.phase);  // TMA has written the tile
    const int unit = threadIdx.x % 8;  // 16-byte unit of a 128-byte chunk row; 16 rows per pass
    for (int row = max(valid_rows, 0) + static_cast<int>(threadIdx.x % 128) / 8; row < kBlockN; row += 16) {
#pragma unroll
      for (int c = 0; c < Traits::kChunksV; ++c)
        reinterpret_cast<uint4*>(&s.v[st.stage][c][row][0])[unit] = make_uint4(0u, 0u, 0u, 0u);
    }
    fence_async_shared();
    named_barrier_sync(barrier_id(NamedBarrier::kConsumerWg0, wg), 128);
  }
  // The key tiles of a query tile run downwards from n_max, so only the first can reach past the entry's keys:
  // its V tail is cleared once per tile, before the first P V, outside the per-tile steps (kept out of the loop,
  // it costs the steps no registers).
  static __device__ __forceinline__ void clear_first_v_tail(const FwdParams& p, SharedStorage& s, const Ring& st,
                                                            int wg, int n_max, int64_t seqlen_k) {
    const int64_t valid_rows = seqlen_k - static_cast<int64_t>(n_max) * kBlockN;
    if constexpr (!Traits::kFp8) {  // FP8's V^T is written whole, zeros past the keys (fwd_fp8.cu)
      if (p.clear_key_tail && valid_rows < kBlockN) clear_v_tail(s, st, wg, static_cast<int>(valid_rows));
    }
  }

  // Softcap, element mask (only on the key tiles that need it) and online softmax of a fresh S tile, in place.
  // The rows' key windows are computed inside the masked branch (kept live across the loop they made ptxas
  // if-convert the mask into predicated instructions that every tile paid for), from the band `band_of()` returns:
  // kept in registers where that measured faster (Traits::kKeepBand), else recomputed from the parameters.
  // `score`: p.score, or for FP8 the tile's with its descale factors folded in (tile_score).
  template <class BandOf>
  static __device__ __forceinline__ bool softmax_tile(const FwdParams& p, const detail::ScoreTransform& score,
                                                      Softmax& softmax, float (&acc_s)[kBlockN / 2],
                                                      const TileKeys& keys, BandOf&& band_of, int n, int row0,
                                                      float (&factor)[2], int lane) {
    if (score.softcap > 0.0f) Softmax::apply_softcap(acc_s, score.tanh_scale);
    if (keys.needs_mask(n)) {
      const typename Traits::TileBand band = band_of();
      int lo[2], hi[2];  // the key window of the thread's two rows (row0, row0 + 8)
#pragma unroll
      for (int r = 0; r < 2; ++r) band.row_window(row0 + 8 * r, lo[r], hi[r]);
      Softmax::apply_mask(acc_s, n * kBlockN, lo, hi, lane);
    }
    return softmax.template step<Traits::kPolyPer8>(acc_s, score.log2_scale, p.conditional_rescale, p.exp2_poly,
                                                    factor);
  }

  // FP8: S holds the FP8 values' dot products, so q_descale * k_descale of the tile's (batch, kv head) scales
  // them first: folded into the factor that multiplies q·k (the tanh's argument with softcap). 16-bit kernels
  // read p.score itself (a reference: a copy kept in registers across the loop made them spill).
  static __device__ __forceinline__ decltype(auto) tile_score(const FwdParams& p, FwdTile tile) {
    if constexpr (Traits::kFp8) {
      detail::ScoreTransform score = p.score;
      const int head_kv = tile.head / p.group;
      const float qk = p.q_descale.at(tile.batch, head_kv) * p.k_descale.at(tile.batch, head_kv);
      if (score.softcap > 0.0f) score.tanh_scale *= qk;
      else score.log2_scale *= qk;
      return score;
    } else {
      return (p.score);
    }
  }
  // FP8: O = P V is in units of v's FP8 values: v_descale joins 1 / l.
  static __device__ __forceinline__ void descale_rows(const FwdParams& p, FwdTile tile, float (&inv)[2]) {
    if constexpr (Traits::kFp8) {
      const float v = p.v_descale.at(tile.batch, tile.head / p.group);
      inv[0] *= v;
      inv[1] *= v;
    }
  }

  // One tile of this warpgroup's 64 rows, once its Q has arrived in Q buffer `qb`; `st` (K/V ring position)
  // carries over from tile to tile.
  static __device__ __forceinline__ void consume(const FwdParams& p, SharedStorage& s, int wg, FwdTile tile, int qb,
                                                 Ring& st) {
    // The mask ranges are per CTA, not per warpgroup: control values that differ between warpgroups made these
    // kernels spill.
    const detail::SequenceMask mask = Traits::sequence_mask(p, tile.batch);
    const TileKeys keys = Traits::tile_keys(mask, tile.m_block);
    const typename Traits::TileBand kept_band = Traits::kKeepBand ? Traits::tile_band(mask) : typename Traits::TileBand{};
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    const int row0 = tile.m_block * kBlockM + wg * kWgRows + warp * 16 + lane / 4;  // rows row0 and row0 + 8

    const int num_tiles = keys.count();
    Turns turns(wg, Traits::kIntraWgOverlap ? num_tiles + 1 : num_tiles);  // matmul issue rounds
    Softmax softmax = Softmax::for_rows(row0, mask.seqlen_q);
    float acc_o[kHeadDimV / 2];
    Mma::zero_o(acc_o);
    float acc_s[kBlockN / 2];
    PFrag p_frag;
    float factor[2];
    decltype(auto) score = tile_score(p, tile);
    auto softmax_of = [&](int n) {
      auto band_of = [&] {
        if constexpr (Traits::kKeepBand) return kept_band;
        else return Traits::tile_band(Traits::sequence_mask(p, tile.batch));
      };
      return softmax_tile(p, score, softmax, acc_s, keys, band_of, n, row0, factor, lane);
    };

    if (num_tiles == 0) release(&s.q_empty[qb], lane);  // fully masked tile: Q is not read at all
    if (num_tiles > 0) {
      if constexpr (Traits::kIntraWgOverlap) {
        int n = keys.n_max;
        first_s(s, wg, qb, st, n == keys.n_min, acc_s, turns, lane);
        clear_first_v_tail(p, s, st, wg, n, mask.seqlen_k);
        softmax_of(n);  // first tile: O is zero, nothing to rescale
        Mma::convert_p(acc_s, p_frag);
        Ring st_pv = st;  // stage whose V the pending P multiplies
        st.advance();
        auto step = [&](const PFrag& pending, PFrag& next, int n) {
          overlap_step<true>(s, wg, qb, st, st_pv, n == keys.n_min, pending, next, acc_s, acc_o, factor,
                             [&] { return softmax_of(n); }, turns, lane);
          st_pv = st;
          st.advance();
        };
        if constexpr (kDoubleP) {
          PFrag p_frag2;
          bool in_second = false;  // the pending P is in p_frag2
          for (--n; n >= keys.n_min; --n) {
            if (in_second) step(p_frag2, p_frag, n);
            else step(p_frag, p_frag2, n);
            in_second = !in_second;
          }
          if (in_second) last_pv(s, st_pv, p_frag2, acc_o, turns, lane);
          else last_pv(s, st_pv, p_frag, acc_o, turns, lane);
        } else {
          for (--n; n >= keys.n_min; --n) step(p_frag, p_frag, n);
          last_pv(s, st_pv, p_frag, acc_o, turns, lane);
        }
      } else {
        NoTurns no_turns;
        for (int n = keys.n_max; n >= keys.n_min; --n) {
          first_s(s, wg, qb, st, n == keys.n_min, acc_s, turns, lane);
          if (n == keys.n_max) clear_first_v_tail(p, s, st, wg, n, mask.seqlen_k);
          if (softmax_of(n)) Mma::rescale_o(acc_o, factor);
          Mma::convert_p(acc_s, p_frag);
          last_pv(s, st, p_frag, acc_o, no_turns, lane);
          st.advance();
        }
      }
    }
    float inv[2], lse[2];
    Epilogue::finish_rows(p, softmax, score.log2_scale, tile.head, inv, lse);
    descale_rows(p, tile, inv);
    const detail::SequenceInfo si = p.seq.info(tile.batch);  // read again: not kept live across the loop
    Epilogue::store_rows(p, tile.head, tile.batch, si.q_offset, static_cast<int>(si.seqlen_q), acc_o, inv, lse, row0,
                         lane);
  }
};

}  // namespace flash4::sm90
