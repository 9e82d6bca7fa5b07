// The consumer of kCrossTile configurations (d = 128): a warpgroup runs its tiles as one stream of
// FwdMainloop's steps. Where FwdMainloop::consume ends a tile with its last P V alone and starts the next with its
// first S alone, here the next tile's first S = Q' K^T is an overlap step with this tile's last P V (the next Q
// is already in the other Q buffer), the next tile's first softmax runs under that P V, and this tile's O is
// stored after it. Within a tile the steps are consume()'s (intra-warpgroup overlap, two P buffers).
#pragma once

#include "hw/sm90/shared_atomic.cuh"
#include "kernels/sm90/fwd/fwd_mainloop.cuh"

namespace flash4::sm90 {

template <class Traits>
struct FwdStreamMainloop {
  using Loop = FwdMainloop<Traits>;
  using SharedStorage = typename Traits::SharedStorage;
  using Softmax = typename Traits::Softmax;
  using TileKeys = typename Traits::TileKeys;
  using Mma = typename Loop::Mma;
  using Epilogue = typename Loop::Epilogue;
  using PFrag = typename Loop::PFrag;
  using Ring = typename Loop::Ring;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr int kHeadDimV = Traits::kHeadDimV;
  static constexpr int kWgRows = Traits::kWgRows;
  static_assert(Traits::kDoubleP && !Traits::kPingPong, "the stream alternates two P buffers and takes no turns");
  static_assert(!Traits::kFp8, "one score transform for every tile: no descale factors");

  // What a consumer warpgroup keeps of one tile in registers (two tiles are live at a tile boundary, so the
  // sequence mask is recomputed from the parameters where needed rather than kept).
  struct ConsumerTile {
    int head, batch, qb;  // qb: the Q buffer holding the tile's Q
    TileKeys keys;        // its K/V tiles and the keys every row sees
    int row0;             // this thread's rows: row0 and row0 + 8
  };
  static __device__ __forceinline__ ConsumerTile consumer_tile(const FwdParams& p, int wg, FwdTile tile, int qb) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    ConsumerTile c;
    c.head = tile.head;
    c.batch = tile.batch;
    c.qb = qb;
    c.keys = Traits::tile_keys(Traits::sequence_mask(p, tile.batch), tile.m_block);
    c.row0 = tile.m_block * kBlockM + wg * kWgRows + warp * 16 + lane / 4;
    return c;
  }
  // The softmax state a tile starts from (the sequence's length is read again: not kept across the loop).
  static __device__ __forceinline__ Softmax fresh_softmax(const FwdParams& p, const ConsumerTile& c) {
    return Softmax::for_rows(c.row0, Traits::sequence_mask(p, c.batch).seqlen_q);
  }

  static __device__ __forceinline__ void run(const FwdParams& p, SharedStorage& s, int wg,
                                             const FwdTileScheduler<Traits::kMasked>& scheduler, Ring& st) {
    const int lane = threadIdx.x % 32;
    PipelineState<Traits::kQBuffers> qst;
    // The next tile the producer published (its Q buffer's q_full), false when there are no more.
    auto fetch = [&](ConsumerTile& c) {
      mbarrier::wait(&s.q_full[qst.stage], qst.phase);
      int t = 0;
      if (lane == 0) t = shared_atomic_load(&s.tile_id[qst.stage]);  // one read per warp (see FwdKernel::run)
      t = __shfl_sync(0xffffffffu, t, 0);
      if (t < 0) return false;
      c = consumer_tile(p, wg, scheduler.tile(t), qst.stage);
      qst.advance();
      return true;
    };

    Softmax softmax;
    float acc_o[kHeadDimV / 2];
    float acc_s[kBlockN / 2];
    PFrag p_frag, p_frag2;
    bool in_second = false;  // the pending P (whose P V is not issued yet) is in p_frag2
    float factor[2];
    typename Loop::NoTurns no_turns;
    auto softmax_of = [&](const ConsumerTile& c, int n) {
      return Loop::softmax_tile(
          p, p.score, softmax, acc_s, c.keys, [&] { return Traits::tile_band(Traits::sequence_mask(p, c.batch)); },
          n, c.row0, factor, lane);
    };
    // Before a tile's first P V (its first key tile is the only one that can reach past the entry's keys).
    auto clear_tail = [&](const ConsumerTile& c) {
      Loop::clear_first_v_tail(p, s, st, wg, c.keys.n_max, Traits::sequence_mask(p, c.batch).seqlen_k);
    };

    auto store = [&](const ConsumerTile& c, const float(&o)[kHeadDimV / 2], const float(&inv)[2], const float(&lse)[2]) {
      const detail::SequenceInfo si = p.seq.info(c.batch);
      Epilogue::store_rows(p, c.head, c.batch, si.q_offset, static_cast<int>(si.seqlen_q), o, inv, lse, c.row0, lane);
    };

    Ring st_pv;  // stage whose V the pending P multiplies
    ConsumerTile cur;
    bool have = fetch(cur);
    bool running = false;  // cur's first S is done and its P pending (the previous tile issued it)
    while (have) {
      if (!running) {
        if (cur.keys.count() == 0) {  // fully masked tile: Q is not read at all; out = 0, LSE = -inf
          Loop::release(&s.q_empty[cur.qb], lane);
          softmax = fresh_softmax(p, cur);
          Mma::zero_o(acc_o);
          float inv[2], lse[2];
          Epilogue::finish_rows(p, softmax, p.score.log2_scale, cur.head, inv, lse);
          store(cur, acc_o, inv, lse);
          have = fetch(cur);
          continue;
        }
        // The tile's first S alone.
        softmax = fresh_softmax(p, cur);
        Mma::zero_o(acc_o);
        const int n = cur.keys.n_max;
        Loop::first_s(s, wg, cur.qb, st, n == cur.keys.n_min, acc_s, no_turns, lane);
        clear_tail(cur);
        softmax_of(cur, n);  // first tile: O is zero, nothing to rescale
        in_second = !in_second;  // P goes into the free buffer, which becomes the pending one
        if (in_second) Mma::convert_p(acc_s, p_frag2);
        else Mma::convert_p(acc_s, p_frag);
        st_pv = st;
        st.advance();
      }
      // The tile's remaining K/V tiles.
      auto step = [&](const PFrag& pending, PFrag& next, int n) {
        Loop::template overlap_step<true>(s, wg, cur.qb, st, st_pv, n == cur.keys.n_min, pending, next, acc_s,
                                          acc_o, factor, [&] { return softmax_of(cur, n); }, no_turns, lane);
        st_pv = st;
        st.advance();
      };
      for (int n = cur.keys.n_max - 1; n >= cur.keys.n_min; --n) {
        if (in_second) step(p_frag2, p_frag, n);
        else step(p_frag, p_frag2, n);
        in_second = !in_second;
      }
      // Tile end: its softmax is complete; the last P V is pending.
      float inv[2], lse[2];
      Epilogue::finish_rows(p, softmax, p.score.log2_scale, cur.head, inv, lse);
      ConsumerTile next;
      const bool have_next = fetch(next);
      if (have_next && next.keys.count() > 0) {
        // The next tile's first S with this tile's last P V; the next softmax under that P V; then this O.
        auto cross_step = [&](const PFrag& pending, PFrag& free) {
          const int n = next.keys.n_max;
          Loop::template overlap_step<false>(s, wg, next.qb, st, st_pv, n == next.keys.n_min, pending, free, acc_s,
                                             acc_o, factor,
                                             [&] {
                                               softmax = fresh_softmax(p, next);
                                               clear_tail(next);
                                               return softmax_of(next, n);  // the next tile's first: no rescale
                                             },
                                             no_turns, lane);
        };
        if (in_second) cross_step(p_frag2, p_frag);
        else cross_step(p_frag, p_frag2);
        store(cur, acc_o, inv, lse);
        Mma::zero_o(acc_o);
        in_second = !in_second;
        st_pv = st;
        st.advance();
        cur = next;
        running = true;
      } else {
        // No next tile to overlap with: the last P V alone.
        if (in_second) Loop::last_pv(s, st_pv, p_frag2, acc_o, no_turns, lane);
        else Loop::last_pv(s, st_pv, p_frag, acc_o, no_turns, lane);
        store(cur, acc_o, inv, lse);
        if (have_next) cur = next;
        have = have_next;
        running = false;
      }
    }
  }
};

}  // namespace flash4::sm90
