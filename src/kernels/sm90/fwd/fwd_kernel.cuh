// The Hopper forward kernel: warp-specialized FlashAttention with FlashAttention-4's softmax.
//
// Roles (persistent CTAs, one per SM, where fwd_launch_persistent says so, else one CTA per tile; a CTA computes
// tiles of block_m query rows of one (batch, head), handed out dynamically in fwd_tile_scheduler.cuh's order):
//   warpgroup 0, one thread   producer: TMA loads of each tile's Q (once the previous tile's last S = Q K^T is
//                             done: q_empty; at d = 128 into two Q buffers, a tile ahead, right after the
//                             current tile's first K, V), then K and V tiles into a ring of `stages` slots
//                             (k_full / v_full on arrival; k_empty as soon as S is done, v_empty after P V, so
//                             the next K load starts a whole softmax earlier). The ring runs on across tiles.
//   warpgroups 1 .. 2 or 3    consumers: 64 query rows each. S = Q K^T (wgmma, both operands in shared memory),
//                             online softmax in registers, O += P V (wgmma, P from registers).
// Pipelining inside a consumer (intra-warpgroup overlap): the matmul S(j+1) = Q K(j+1)^T is issued together with
// O += P(j) V(j), and the softmax of S(j+1) runs while P(j) V(j) is still on the tensor cores.
// Ping-pong across consumers (where the tile table enables it): named barriers hand the "issue matmuls" turn
// round the consumers, so one warpgroup's softmax (MUFU + FMA pipes) overlaps the other's matmuls.
// Epilogue: O / l converted to the input type and stored straight from registers (the quad of lanes that shares
// a row writes 16 contiguous bytes per instruction), LSE stored by one lane per row. It needs no shared memory,
// so the producer is already loading the next tile's Q and K/V while a consumer finishes this one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/problem.h"
#include "hw/sm90/fence.cuh"
#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/named_barrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/setmaxnreg.cuh"
#include "hw/sm90/tma.cuh"
#include "hw/sm90/wgmma.cuh"
#include "kernels/sm90/fwd/fwd_config.h"
#include "kernels/sm90/fwd/fwd_params.h"
#include "kernels/sm90/fwd/fwd_softmax.cuh"
#include "kernels/sm90/fwd/fwd_tile_scheduler.cuh"

namespace flash4::sm90 {

// Two fp32 values -> one register of two 16-bit values (first in the low half, as wgmma's A fragment wants).
template <class Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Pipeline choices default to the tile-config table; FwdVariant overrides them for the ablation benchmark
// (the library compiles the defaults only). -1 / 0 = take the table's value.
template <int kOverlap = -1, int kPingPong = -1, int kStages = 0, int kPolyPer8 = -1, int kPersistent = -1,
          int kBlockM = 0, int kBlockN = 0, bool kShortTiles = false, int kDoubleP = -1>
struct FwdVariant {
  static constexpr int double_p = kDoubleP;
  static constexpr int overlap = kOverlap, pingpong = kPingPong, stages = kStages, poly_per_8 = kPolyPer8;
  // 1: one CTA per SM claiming tiles; 0: one CTA per tile; -1: the launch rule (fwd_launch_persistent)
  static constexpr int persistent = kPersistent;
  static constexpr int block_m = kBlockM, block_n = kBlockN;
  static constexpr bool short_tiles = kShortTiles;  // start from fwd_short_tile_config instead of the table
};

// The table's configuration with a variant's overrides applied.
template <class Variant>
constexpr FwdTileConfig apply_variant(FwdTileConfig c) {
  if (Variant::block_m > 0) c.block_m = Variant::block_m;
  if (Variant::block_n > 0) c.block_n = Variant::block_n;
  if (Variant::stages > 0) c.stages = Variant::stages;
  if (Variant::poly_per_8 >= 0) c.poly_exp2_per_8 = Variant::poly_per_8;
  if (Variant::overlap >= 0) c.intra_wg_overlap = Variant::overlap != 0;
  if (Variant::pingpong >= 0) c.pingpong = Variant::pingpong != 0;
  if (Variant::double_p >= 0) c.double_p = Variant::double_p != 0;
  return c;
}

template <class Element, int kHeadDim, bool kMasked, class Variant = FwdVariant<>>
struct FwdKernel {
  static constexpr FwdTileConfig kCfg = apply_variant<Variant>(
      Variant::short_tiles ? fwd_short_tile_config(kHeadDim) : fwd_tile_config(kHeadDim, kMasked));
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr bool kIntraWgOverlap = kCfg.intra_wg_overlap;
  static constexpr bool kPingPong = kCfg.pingpong;
  static constexpr bool kDoubleP = kCfg.double_p && kCfg.intra_wg_overlap;
  static constexpr int kStages = kCfg.stages;
  // Cross-tile overlap (consume_stream; d = 128): a consumer issues the next tile's first S with this tile's last
  // P V, so the next tile's Q loads into a second Q buffer during this tile.
  static constexpr bool kCrossTile = fwd_cross_tile(kCfg, kHeadDim);
  static constexpr int kQBuffers = fwd_q_buffers(kCfg, kHeadDim);
  static constexpr int kPolyPer8 = kCfg.poly_exp2_per_8;
  static constexpr int kChunks = kHeadDim / 64;  // 64-column (128-byte) swizzle chunks per row
  static constexpr int kWgRows = 64;
  static constexpr int kConsumers = fwd_consumer_warpgroups(kCfg);
  static constexpr int kThreads = fwd_threads(kCfg);
  // wgmma k-step descriptors as offsets from one base descriptor per operand (a 32-bit add each) instead of built
  // from each k-step's address (~6 instructions on the path to the next issue). Measured per configuration (bench/
  // results/2026-11-29-h200-fwd-kstep-descriptors.json): d = 64 with three consumers +1..+6 % (most causal 4k-16k),
  // d = 128 +0..+4 % (one shape -2 %); the two-consumer d = 64 configuration lost 2-5 % and d = 256 -3..+3 %, so
  // they keep the per-k-step descriptors (why is not understood: their instruction count drops too).
  static constexpr bool kKStepsFromBase = kConsumers == 3 || kHeadDim == 128;
  static_assert(kBlockM == kWgRows * kConsumers && (kConsumers == 2 || kConsumers == 3));
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N and TMA box rows");
  static_assert(kHeadDim % 64 == 0, "head_dim must be a multiple of 64 for the 128B-swizzled tiles");

  // Registers per thread after setmaxnreg (64K per SM). Two consumers: 232 each and 40 for the producer's tile
  // bookkeeping (scheduler, mask ranges), unless the accumulators are large (d = 256: O alone is 128 registers;
  // block_n > 128): then 240 and 24. Three consumers (d = 64, block_m 192): 160 each, the producer 32.
  static constexpr bool kLargeAccumulators = kHeadDim > 128 || kBlockN > 128;
  static constexpr int kProducerRegisters = kConsumers == 3 ? 32 : kLargeAccumulators ? 24 : 40;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 160 : kLargeAccumulators ? 240 : 232;
  using Softmax = FwdSoftmax<kBlockN>;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2;
  static constexpr uint32_t kKVTileBytes = kBlockN * kHeadDim * 2;

  struct SharedStorage {
    alignas(1024) Element q[kQBuffers][kChunks][kBlockM][64];  // smem, 128B swizzle, K-major A of Q K^T
    alignas(1024) Element k[kStages][kChunks][kBlockN][64];  // smem, 128B swizzle, K-major B of Q K^T
    alignas(1024) Element v[kStages][kChunks][kBlockN][64];  // smem, 128B swizzle, MN-major B of P V
    uint64_t q_full[kQBuffers];
    uint64_t q_empty[kQBuffers];
    int tile_id[kQBuffers];  // tile whose Q the buffer's current q_full phase delivers; -1 = no more tiles
    uint64_t k_full[kStages];
    uint64_t v_full[kStages];
    uint64_t k_empty[kStages];
    uint64_t v_empty[kStages];
  };

  // The K/V tiles this CTA visits: [n_min, n_max], mask-aware (tiles entirely outside every row's window are
  // skipped). Producer and consumers compute the same range.
  struct TileRange {
    int n_min, n_max;
    __device__ int count() const { return n_max >= n_min ? n_max - n_min + 1 : 0; }
  };
  static __device__ __forceinline__ TileRange tile_range(const FwdParams& p, int m_block) {
    const int m_first = m_block * kBlockM;
    const int m_last = min(m_first + kBlockM, p.seqlen_q) - 1;
    int lo = 0, hi = p.seqlen_k - 1;
    if constexpr (kMasked) {
      lo = static_cast<int>(detail::key_range(m_first, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right).lo);
      hi = static_cast<int>(detail::key_range(m_last, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right).hi);
    }
    if (hi < lo || hi < 0) return {0, -1};
    return {lo / kBlockN, hi / kBlockN};
  }

  static __device__ __forceinline__ void run(const FwdParams& p, char* smem_raw) {
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warpgroup = threadIdx.x / 128;
    if (threadIdx.x == 0) {
      for (int i = 0; i < kQBuffers; ++i) {
        mbarrier::init(&s.q_full[i], 1);
        mbarrier::init(&s.q_empty[i], kConsumers * 4);  // one arrival per consumer warp
      }
      for (int i = 0; i < kStages; ++i) {
        mbarrier::init(&s.k_full[i], 1);
        mbarrier::init(&s.v_full[i], 1);
        mbarrier::init(&s.k_empty[i], kConsumers * 4);
        mbarrier::init(&s.v_empty[i], kConsumers * 4);
      }
      mbarrier::fence_init();
    }
    __syncthreads();

    const FwdTileScheduler<kMasked> scheduler{p.num_m_blocks, p.heads, p.batch};
    static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumers <= 65536);
    if (warpgroup == 0) {
      setmaxnreg_dec<kProducerRegisters>();
      if (threadIdx.x == 0) produce(p, s, scheduler);
    } else {
      setmaxnreg_inc<kConsumerRegisters>();
      PipelineState<kStages> st;
      if constexpr (kCrossTile) {
        consume_stream(p, s, warpgroup - 1, scheduler, st);
      } else {
        for (PipelineState<kQBuffers> qst;; qst.advance()) {
          mbarrier::wait(&s.q_full[qst.stage], qst.phase);
          // Published before q_full completed (the mbarrier orders it). One atomic read per warp, broadcast: the
          // producer rewrites the buffer's tile_id for a later tile after q_empty, and atomics keep racecheck from
          // flagging the (mbarrier-ordered) reuse.
          int t = 0;
          if (threadIdx.x % 32 == 0) t = atomicAdd(&s.tile_id[qst.stage], 0);
          t = __shfl_sync(0xffffffffu, t, 0);
          if (t < 0) break;
          consume(p, s, warpgroup - 1, scheduler.tile(t), qst.stage, st);
        }
      }
    }
  }

  // Tiles are handed out dynamically: each CTA starts with tile blockIdx.x and then takes the next unclaimed one
  // from a global counter, so CTAs that drew short (causal) tiles simply take more. The producer claims the
  // next tile while this one's K/V stream, and publishes it to the consumers with its Q load (tile_id, -1 =
  // done). With two Q buffers that load is issued right after this tile's first K, V loads, so the consumers find
  // the next Q in place when they finish this tile; with one, after this tile's last S (as it must).
  static __device__ __forceinline__ void produce(const FwdParams& p, SharedStorage& s,
                                                 const FwdTileScheduler<kMasked>& scheduler) {
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
        atomicExch(&s.tile_id[qst.stage], -1);
        mbarrier::arrive(&s.q_full[qst.stage]);  // completes the phase without data: consumers see -1 and stop
      } else {
        atomicExch(&s.tile_id[qst.stage], t);
        const FwdTile tile = scheduler.tile(t);
        mbarrier::arrive_expect_tx(&s.q_full[qst.stage], kQBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma::load_4d(&s.q[qst.stage][c][0][0], &p.tma_q, c * 64, tile.m_block * kBlockM, tile.head, tile.batch,
                       &s.q_full[qst.stage]);
      }
      qst.advance();
    };
    int t = static_cast<int>(blockIdx.x);
    if constexpr (kQBuffers == 2) load_q(t);  // then each next one after the current tile's first K, V
    for (;;) {
      if constexpr (kQBuffers == 1) load_q(t);  // after the previous tile's last S
      if (t >= scheduler.total()) break;
      const int next = static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);
      const FwdTile tile = scheduler.tile(t);
      bool next_published = false;
      const TileRange range = tile_range(p, tile.m_block);
      const int head_kv = tile.head / p.group;
      for (int n = range.n_max; n >= range.n_min; --n) {
        mbarrier::wait(&s.k_empty[st.stage], st.phase ^ 1u);  // a fresh barrier counts as released
        mbarrier::arrive_expect_tx(&s.k_full[st.stage], kKVTileBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma::load_4d(&s.k[st.stage][c][0][0], &p.tma_k, c * 64, n * kBlockN, head_kv, tile.batch, &s.k_full[st.stage]);
        mbarrier::wait(&s.v_empty[st.stage], st.phase ^ 1u);
        mbarrier::arrive_expect_tx(&s.v_full[st.stage], kKVTileBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma::load_4d(&s.v[st.stage][c][0][0], &p.tma_v, c * 64, n * kBlockN, head_kv, tile.batch, &s.v_full[st.stage]);
        st.advance();
        if (kQBuffers == 2 && !next_published) {
          load_q(next);  // the other buffer: released by the previous tile's last S
          next_published = true;
        }
      }
      if (kQBuffers == 2 && !next_published) load_q(next);
      t = next;
    }
  }

  // S (64 x kBlockN) = Q rows of this warpgroup x K(stage)^T; issued, not waited for.
  static __device__ __forceinline__ void issue_qk(SharedStorage& s, int wg, int qb, int stage,
                                                  float (&acc_s)[kBlockN / 2]) {
    if constexpr (kKStepsFromBase) {
      // One descriptor per operand, each k-step an offset from it (a 64-column chunk is rows * 128 bytes on, a
      // k-step of 16 columns 32 bytes).
      const uint64_t q_base = wgmma::make_desc_sw128(&s.q[qb][0][wg * kWgRows][0], 16, 1024);
      const uint64_t k_base = wgmma::make_desc_sw128(&s.k[stage][0][0][0], 16, 1024);
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const uint32_t step = (ks % 4) * 32;
        wgmma::mma_ss<kBlockN, 0, Element>(acc_s, wgmma::desc_advance_lo(q_base, (ks / 4) * kBlockM * 128 + step),
                                           wgmma::desc_advance_lo(k_base, (ks / 4) * kBlockN * 128 + step), ks > 0);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const uint64_t desc_q = wgmma::make_desc_sw128(&s.q[qb][ks / 4][wg * kWgRows][(ks % 4) * 16], 16, 1024);
        const uint64_t desc_k = wgmma::make_desc_sw128(&s.k[stage][ks / 4][0][(ks % 4) * 16], 16, 1024);
        wgmma::mma_ss<kBlockN, 0, Element>(acc_s, desc_q, desc_k, ks > 0);
      }
    }
  }

  // O (64 x kHeadDim) += P (64 x kBlockN, registers) x V(stage) (kBlockN x kHeadDim, MN-major).
  static __device__ __forceinline__ void issue_pv(SharedStorage& s, int stage, const uint32_t (&p_frag)[kBlockN / 16][4],
                                                  float (&acc_o)[kHeadDim / 2]) {
    if constexpr (kKStepsFromBase) {
      const uint64_t v_base = wgmma::make_desc_sw128(&s.v[stage][0][0][0], kBlockN * 128, 1024);
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks)  // a k-step is 16 rows of 128 bytes
        wgmma::mma_rs<kHeadDim, 1, Element>(acc_o, p_frag[ks], wgmma::desc_advance_lo(v_base, ks * 16 * 128), true);
    } else {
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        const uint64_t desc_v = wgmma::make_desc_sw128(&s.v[stage][0][ks * 16][0], kBlockN * 128, 1024);
        wgmma::mma_rs<kHeadDim, 1, Element>(acc_o, p_frag[ks], desc_v, true);
      }
    }
  }

  // P in fp32 accumulator layout -> 16-bit A fragments: k-step j takes accumulator elements 8j .. 8j+7 in order.
  static __device__ __forceinline__ void convert_p(const float (&acc_s)[kBlockN / 2], uint32_t (&p_frag)[kBlockN / 16][4]) {
#pragma unroll
    for (int j = 0; j < kBlockN / 16; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) p_frag[j][r] = pack2<Element>(acc_s[8 * j + 2 * r], acc_s[8 * j + 2 * r + 1]);
  }

  static __device__ __forceinline__ void rescale_o(float (&acc_o)[kHeadDim / 2], const float (&factor)[2]) {
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] *= factor[(i / 2) % 2];
  }

  // One tile of this warpgroup's 64 rows, once its Q has arrived in Q buffer `qb`. `st` (K/V ring position)
  // carries over.
  static __device__ __forceinline__ void consume(const FwdParams& p, SharedStorage& s, int wg, FwdTile tile, int qb,
                                                 PipelineState<kStages>& st) {
    const int m_block = tile.m_block, head = tile.head, batch = tile.batch;
    const TileRange range = tile_range(p, m_block);
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int row0 = m_block * kBlockM + wg * kWgRows + warp * 16 + lane / 4;  // rows row0 and row0 + 8
    const int m_first = m_block * kBlockM;
    const int m_last = min(m_first + kBlockM, p.seqlen_q) - 1;

    // Per-row key windows (inclusive), for the tiles that need masking.
    int lo[2], hi[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const detail::KeyRange kr = detail::key_range(row0 + 8 * r, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right);
      lo[r] = static_cast<int>(kr.lo);
      hi[r] = static_cast<int>(kr.hi);
    }
    // Tiles whose keys every row of the CTA may see need no mask (interior tiles pay nothing for causal).
    const int unmasked_lo = kMasked ? static_cast<int>(detail::key_range(m_last, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right).lo) : 0;
    const int unmasked_hi = kMasked ? static_cast<int>(detail::key_range(m_first, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right).hi)
                                    : p.seqlen_k - 1;
    // Per CTA, not per warpgroup, on purpose: per-warpgroup mask ranges and skipping the diagonal tiles a
    // warpgroup sees masked whole measured 2-26 % slower (docs/performance.md, "Measured and rejected: per-warpgroup
    // diagonal skip"): control values that differ between warpgroups made these kernels spill.
    auto needs_mask = [&](int n) { return n * kBlockN < unmasked_lo || n * kBlockN + kBlockN - 1 > unmasked_hi; };

    // Turns go round the consumers in order 0, 1, .., kConsumers - 1, 0, ...
    const uint32_t my_turn = barrier_id(NamedBarrier::kPingPongTurnWg0, wg);
    const uint32_t next_turn = barrier_id(NamedBarrier::kPingPongTurnWg0, (wg + 1) % kConsumers);
    const bool last_wg = wg == kConsumers - 1;
    const int num_tiles = range.count();
    int turns_left = kIntraWgOverlap ? num_tiles + 1 : num_tiles;  // matmul issue rounds of this warpgroup
    auto begin_turn = [&] {
      if constexpr (kPingPong) named_barrier_sync(my_turn, 2 * 128);
    };
    auto end_turn = [&] {
      // The last warpgroup does not hand over after its final round: arrivals stay balanced (every consumer
      // has the same number of rounds).
      if constexpr (kPingPong) {
        --turns_left;
        if (!last_wg || turns_left > 0) named_barrier_arrive(next_turn, 2 * 128);
      }
    };
    if constexpr (kPingPong) {
      if (last_wg && num_tiles > 0) named_barrier_arrive(next_turn, 2 * 128);  // warpgroup 0 goes first
    }

    Softmax softmax;
    float acc_o[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.0f;
    float acc_s[kBlockN / 2];
    uint32_t p_frag[kBlockN / 16][4];
    float factor[2];

    // Masks, softcap and softmax of a freshly computed S tile (in place: S becomes P in fp32).
    auto softmax_tile = [&](int n) {
      if (p.softcap > 0.0f) Softmax::apply_softcap(acc_s, p.softcap_pre_scale, p.softcap);
      if (needs_mask(n)) Softmax::apply_mask(acc_s, n * kBlockN, lo, hi, lane);
      return softmax.template step<kPolyPer8>(acc_s, p.scale_log2, p.conditional_rescale, p.exp2_poly, factor);
    };

    // Each consumer warp releases a stage once its own reads are done (wgmma waits are warp-synchronous).
    auto release = [&](uint64_t* empty) {
      __syncwarp();
      if (lane == 0) mbarrier::arrive(empty);
    };

    // S(n) = Q K(n)^T with nothing else in flight: issue, wait, hand K's stage (and after the tile's last S, Q) back.
    auto compute_s_alone = [&](int n) {
      mbarrier::wait(&s.k_full[st.stage], st.phase);
      begin_turn();
      wgmma::fence();
      issue_qk(s, wg, qb, st.stage, acc_s);
      wgmma::commit_group();
      end_turn();
      wgmma::wait_group<0>();
      wgmma::fence_operand(acc_s);
      release(&s.k_empty[st.stage]);
      if (n == range.n_min) release(&s.q_empty[qb]);  // the last S of this tile is done with Q
    };

    if (num_tiles == 0) release(&s.q_empty[qb]);  // fully masked tile: Q is not read at all
    if (num_tiles > 0) {
      if constexpr (kIntraWgOverlap) {
        // Prologue: S(first) alone.
        int n = range.n_max;
        compute_s_alone(n);
        softmax_tile(n);  // first tile: O is zero, nothing to rescale
        convert_p(acc_s, p_frag);
        PipelineState<kStages> st_pv = st;  // stage whose V the pending P multiplies
        st.advance();
        // One overlapped tile: S(n) = Q K(n)^T issued with P(n+1) V(n+1) (P in `pending`), softmax of S(n) under
        // that matmul, P(n) into `next`. With two P buffers (kDoubleP) P(n) is converted while P(n+1) V(n+1) still
        // reads `pending`, so after that matmul's wait only the (rare) rescale stands before the next issue; with
        // one (`next` is `pending`) only after it.
        using PFrag = uint32_t[kBlockN / 16][4];
        auto overlap_step = [&](const PFrag& pending, PFrag& next, int n) {
          mbarrier::wait(&s.k_full[st.stage], st.phase);
          mbarrier::wait(&s.v_full[st_pv.stage], st_pv.phase);
          begin_turn();
          wgmma::fence();
          issue_qk(s, wg, qb, st.stage, acc_s);
          wgmma::commit_group();
          issue_pv(s, st_pv.stage, pending, acc_o);
          wgmma::commit_group();
          end_turn();
          wgmma::wait_group<1>();  // S(n) ready; P(n+1) V(n+1) may still run
          wgmma::fence_operand(acc_s);
          release(&s.k_empty[st.stage]);
          if (n == range.n_min) release(&s.q_empty[qb]);
          const bool rescaled = softmax_tile(n);
          if constexpr (kDoubleP) convert_p(acc_s, next);
          wgmma::wait_group<0>();
          wgmma::fence_operand(acc_o);
          release(&s.v_empty[st_pv.stage]);
          if (rescaled) rescale_o(acc_o, factor);
          if constexpr (!kDoubleP) convert_p(acc_s, next);
          st_pv = st;
          st.advance();
        };
        if constexpr (kDoubleP) {
          uint32_t p_frag2[kBlockN / 16][4];
          bool in_second = false;  // the pending P is in p_frag2
          for (--n; n >= range.n_min; --n) {
            if (in_second) overlap_step(p_frag2, p_frag, n);
            else overlap_step(p_frag, p_frag2, n);
            in_second = !in_second;
          }
          // Epilogue of the loop: the last P V.
          mbarrier::wait(&s.v_full[st_pv.stage], st_pv.phase);
          begin_turn();
          wgmma::fence();
          if (in_second) issue_pv(s, st_pv.stage, p_frag2, acc_o);
          else issue_pv(s, st_pv.stage, p_frag, acc_o);
        } else {
          for (--n; n >= range.n_min; --n) overlap_step(p_frag, p_frag, n);
          // Epilogue of the loop: the last P V.
          mbarrier::wait(&s.v_full[st_pv.stage], st_pv.phase);
          begin_turn();
          wgmma::fence();
          issue_pv(s, st_pv.stage, p_frag, acc_o);
        }
        wgmma::commit_group();
        end_turn();
        wgmma::wait_group<0>();
        wgmma::fence_operand(acc_o);
        release(&s.v_empty[st_pv.stage]);
      } else {
        for (int n = range.n_max; n >= range.n_min; --n) {
          compute_s_alone(n);
          if (softmax_tile(n)) rescale_o(acc_o, factor);
          convert_p(acc_s, p_frag);
          mbarrier::wait(&s.v_full[st.stage], st.phase);
          wgmma::fence();
          issue_pv(s, st.stage, p_frag, acc_o);
          wgmma::commit_group();
          wgmma::wait_group<0>();
          wgmma::fence_operand(acc_o);
          release(&s.v_empty[st.stage]);
          st.advance();
        }
      }
    }
    float inv[2], lse[2];
    finish_rows(p, softmax, inv, lse);
    store_rows(p, head, batch, acc_o, inv, lse, row0, lane);
  }

  // What a consumer warpgroup needs of one tile (consume_stream).
  struct ConsumerTile {
    int head, batch, qb;           // qb: the Q buffer holding the tile's Q
    TileRange range;               // its K/V tiles
    int row0;                      // this thread's rows: row0 and row0 + 8
    int unmasked_lo, unmasked_hi;  // keys every row of the CTA may see: K/V tiles inside need no mask
  };
  static __device__ __forceinline__ ConsumerTile consumer_tile(const FwdParams& p, int wg, FwdTile tile, int qb) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    ConsumerTile c;
    c.head = tile.head;
    c.batch = tile.batch;
    c.qb = qb;
    c.range = tile_range(p, tile.m_block);
    const int m_first = tile.m_block * kBlockM;
    const int m_last = min(m_first + kBlockM, p.seqlen_q) - 1;
    c.row0 = m_first + wg * kWgRows + warp * 16 + lane / 4;
    c.unmasked_lo = kMasked ? static_cast<int>(detail::key_range(m_last, p.seqlen_q, p.seqlen_k, p.window_left,
                                                                 p.window_right).lo)
                            : 0;
    c.unmasked_hi = kMasked ? static_cast<int>(detail::key_range(m_first, p.seqlen_q, p.seqlen_k, p.window_left,
                                                                 p.window_right).hi)
                            : p.seqlen_k - 1;
    return c;
  }

  // The consumer of kCrossTile configurations: a warpgroup runs its tiles as one stream. Where consume() ends a
  // tile with its last P V issued and waited for alone and starts the next with its first S alone, here the next
  // tile's first S = Q' K^T is issued together with this tile's last P V (the next Q is already in the other Q
  // buffer), the next tile's first softmax runs under that P V, and this tile's O is stored after it. Within a
  // tile the pipeline is consume()'s (intra-warpgroup overlap, two P buffers).
  static __device__ __forceinline__ void consume_stream(const FwdParams& p, SharedStorage& s, int wg,
                                                        const FwdTileScheduler<kMasked>& scheduler,
                                                        PipelineState<kStages>& st) {
    const int lane = threadIdx.x % 32;
    PipelineState<kQBuffers> qst;
    // The next tile the producer published (its Q buffer's q_full), false when there are no more.
    auto fetch = [&](ConsumerTile& c) {
      mbarrier::wait(&s.q_full[qst.stage], qst.phase);
      int t = 0;
      if (lane == 0) t = atomicAdd(&s.tile_id[qst.stage], 0);  // see run(): one atomic read per warp
      t = __shfl_sync(0xffffffffu, t, 0);
      if (t < 0) return false;
      c = consumer_tile(p, wg, scheduler.tile(t), qst.stage);
      qst.advance();
      return true;
    };
    auto release = [&](uint64_t* empty) {
      __syncwarp();
      if (lane == 0) mbarrier::arrive(empty);
    };
    auto needs_mask = [](const ConsumerTile& c, int n) {
      return n * kBlockN < c.unmasked_lo || n * kBlockN + kBlockN - 1 > c.unmasked_hi;
    };

    Softmax softmax;
    float acc_o[kHeadDim / 2];
    float acc_s[kBlockN / 2];
    uint32_t p_frag[kBlockN / 16][4], p_frag2[kBlockN / 16][4];
    bool in_second = false;  // the pending P (whose P V is not issued yet) is in p_frag2
    float factor[2];
    // Masks, softcap and softmax of a freshly computed S tile (in place: S becomes P in fp32); P into the buffer
    // that is not pending.
    auto softmax_tile = [&](const ConsumerTile& c, int n) {
      if (p.softcap > 0.0f) Softmax::apply_softcap(acc_s, p.softcap_pre_scale, p.softcap);
      if (needs_mask(c, n)) {
        int lo[2], hi[2];  // the thread's rows' key windows, only for the tiles that need them
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const detail::KeyRange kr =
              detail::key_range(c.row0 + 8 * r, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right);
          lo[r] = static_cast<int>(kr.lo);
          hi[r] = static_cast<int>(kr.hi);
        }
        Softmax::apply_mask(acc_s, n * kBlockN, lo, hi, lane);
      }
      return softmax.template step<kPolyPer8>(acc_s, p.scale_log2, p.conditional_rescale, p.exp2_poly, factor);
    };
    using PFrag = uint32_t[kBlockN / 16][4];
    auto zero_o = [&] {
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.0f;
    };

    PipelineState<kStages> st_pv;  // stage whose V the pending P multiplies
    ConsumerTile cur;
    bool have = fetch(cur);
    bool running = false;  // cur's first S is done and its P pending (the previous tile issued it)
    while (have) {
      if (!running) {
        if (cur.range.count() == 0) {  // fully masked tile: Q is not read at all; out = 0, LSE = -inf
          release(&s.q_empty[cur.qb]);
          softmax = Softmax{};
          zero_o();
          float inv[2], lse[2];
          finish_rows(p, softmax, inv, lse);
          store_rows(p, cur.head, cur.batch, acc_o, inv, lse, cur.row0, lane);
          have = fetch(cur);
          continue;
        }
        // The tile's first S alone.
        softmax = Softmax{};
        zero_o();
        const int n = cur.range.n_max;
        mbarrier::wait(&s.k_full[st.stage], st.phase);
        wgmma::fence();
        issue_qk(s, wg, cur.qb, st.stage, acc_s);
        wgmma::commit_group();
        wgmma::wait_group<0>();
        wgmma::fence_operand(acc_s);
        release(&s.k_empty[st.stage]);
        if (n == cur.range.n_min) release(&s.q_empty[cur.qb]);
        softmax_tile(cur, n);  // first tile: O is zero, nothing to rescale
        in_second = !in_second;  // P goes into the free buffer, which becomes the pending one
        if (in_second) convert_p(acc_s, p_frag2);
        else convert_p(acc_s, p_frag);
        st_pv = st;
        st.advance();
      }
      // The tile's remaining K/V tiles, as consume()'s overlap step. The two P buffers swap roles each step in
      // code, not through a flag inside the step (a flag made ptxas select every P register each step).
      auto overlap_step = [&](const PFrag& pending, PFrag& next, int n) {
        mbarrier::wait(&s.k_full[st.stage], st.phase);
        mbarrier::wait(&s.v_full[st_pv.stage], st_pv.phase);
        wgmma::fence();
        issue_qk(s, wg, cur.qb, st.stage, acc_s);
        wgmma::commit_group();
        issue_pv(s, st_pv.stage, pending, acc_o);
        wgmma::commit_group();
        wgmma::wait_group<1>();  // S(n) ready; the pending P V may still run
        wgmma::fence_operand(acc_s);
        release(&s.k_empty[st.stage]);
        if (n == cur.range.n_min) release(&s.q_empty[cur.qb]);
        const bool rescaled = softmax_tile(cur, n);
        convert_p(acc_s, next);
        wgmma::wait_group<0>();
        wgmma::fence_operand(acc_o);
        release(&s.v_empty[st_pv.stage]);
        if (rescaled) rescale_o(acc_o, factor);
        st_pv = st;
        st.advance();
      };
      for (int n = cur.range.n_max - 1; n >= cur.range.n_min; --n) {
        if (in_second) overlap_step(p_frag2, p_frag, n);
        else overlap_step(p_frag, p_frag2, n);
        in_second = !in_second;
      }
      // Tile end: its softmax is complete; the last P V is pending.
      float inv[2], lse[2];
      finish_rows(p, softmax, inv, lse);
      ConsumerTile next;
      const bool have_next = fetch(next);
      if (have_next && next.range.count() > 0) {
        // The next tile's first S with this tile's last P V; the next softmax under that P V; then this O.
        // (Its issue / wait sequence is overlap_step's, written out: a shared helper taking the tile compiled to a
        // different instruction schedule than the measured kernel, bench/results/2026-11-29-h200-fwd-cross-tile.json.)
        auto cross_step = [&](const PFrag& pending, PFrag& free) {
          const int n = next.range.n_max;
          mbarrier::wait(&s.k_full[st.stage], st.phase);
          mbarrier::wait(&s.v_full[st_pv.stage], st_pv.phase);
          wgmma::fence();
          issue_qk(s, wg, next.qb, st.stage, acc_s);
          wgmma::commit_group();
          issue_pv(s, st_pv.stage, pending, acc_o);
          wgmma::commit_group();
          wgmma::wait_group<1>();
          wgmma::fence_operand(acc_s);
          release(&s.k_empty[st.stage]);
          if (n == next.range.n_min) release(&s.q_empty[next.qb]);
          softmax = Softmax{};
          softmax_tile(next, n);  // the next tile's first: nothing to rescale
          convert_p(acc_s, free);
          wgmma::wait_group<0>();
          wgmma::fence_operand(acc_o);
          release(&s.v_empty[st_pv.stage]);
        };
        if (in_second) cross_step(p_frag2, p_frag);
        else cross_step(p_frag, p_frag2);
        store_rows(p, cur.head, cur.batch, acc_o, inv, lse, cur.row0, lane);
        zero_o();
        in_second = !in_second;
        st_pv = st;
        st.advance();
        cur = next;
        running = true;
      } else {
        // No next tile to overlap with: the last P V alone.
        mbarrier::wait(&s.v_full[st_pv.stage], st_pv.phase);
        wgmma::fence();
        if (in_second) issue_pv(s, st_pv.stage, p_frag2, acc_o);
        else issue_pv(s, st_pv.stage, p_frag, acc_o);
        wgmma::commit_group();
        wgmma::wait_group<0>();
        wgmma::fence_operand(acc_o);
        release(&s.v_empty[st_pv.stage]);
        store_rows(p, cur.head, cur.batch, acc_o, inv, lse, cur.row0, lane);
        if (have_next) cur = next;
        have = have_next;
        running = false;
      }
    }
  }

  // The row sums' reciprocals and the LSE of the thread's two rows, once a tile's softmax is complete.
  static __device__ __forceinline__ void finish_rows(const FwdParams& p, const Softmax& softmax, float (&inv)[2],
                                                     float (&lse)[2]) {
    float row_sum[2];
    softmax.finish(row_sum);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // A row that saw no unmasked key (m_ref = -inf) is defined as out = 0, LSE = -inf.
      const bool empty = softmax.m_ref[r] == -INFINITY || !(row_sum[r] > 0.0f);
      inv[r] = empty ? 0.0f : 1.0f / row_sum[r];
      lse[r] = empty ? -INFINITY : (softmax.m_ref[r] * p.scale_log2 + __log2f(row_sum[r])) * 0.69314718055994531f;
    }
  }

  // O = acc_o * inv of the thread's two rows (row0, row0 + 8), converted, and their LSE, to global memory.
  static __device__ __forceinline__ void store_rows(const FwdParams& p, int head, int batch,
                                                    const float (&acc_o)[kHeadDim / 2], const float (&inv)[2],
                                                    const float (&lse)[2], int row0, int lane) {
    // Thread (lane) holds columns 8c + 2 (lane % 4) + {0, 1} of its two rows: a quad writes 16 contiguous bytes
    // per store, and the stores for c and c + 1 complete each 32-byte sector in L2.
    Element* out_bh = static_cast<Element*>(p.out) + batch * p.out_stride_b + head * p.out_stride_h;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      if (row >= p.seqlen_q) continue;
      Element* out_row = out_bh + static_cast<int64_t>(row) * p.out_stride_s + 2 * (lane % 4);
#pragma unroll
      for (int c = 0; c < kHeadDim / 8; ++c) {
        const int i = 4 * c + 2 * r;
        *reinterpret_cast<uint32_t*>(out_row + 8 * c) = pack2<Element>(acc_o[i] * inv[r], acc_o[i + 1] * inv[r]);
      }
      if (p.lse != nullptr && lane % 4 == 0) p.lse[batch * p.lse_stride_b + head * p.lse_stride_h + row] = lse[r];
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1) fwd_kernel(const __grid_constant__ FwdParams params) {
  extern __shared__ char smem_unaligned[];
  // 128B-swizzled tiles must start on 1024-byte boundaries.
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_unaligned) + 1023) & ~uintptr_t(1023));
  Kernel::run(params, smem);
}

}  // namespace flash4::sm90
