// The Hopper backward main kernel on TMA + wgmma (the mma.sync kernel in bwd_mma_sync_kernel.cuh remains the fallback for
// what this one does not cover, see bwd_api.cu). Tiles: bwd_wgmma_config.h.
//
// Each CTA owns kBlockN = 128 keys of one (batch, kv head) and loops over every query head of its GQA group and
// every Q tile that can see the keys (mask-aware interval, same rule as the mma.sync kernel). Roles:
//   warpgroup 0, warp 0   producer: K, V once (TMA); then per Q tile Q and dO (TMA) into a 2-stage ring, and
//                         LSE * log2e and D (plain loads by the 32 lanes into shared memory, +inf / 0 past the
//                         end of the sequence). `full` completes on the TMA bytes plus 32 lane arrivals; `empty`
//                         on one arrival per consumer thread.
//   warpgroup 0, warps 1.. dQ writers (lane 0 of one warp per dQ staging buffer, write_dq): add each staged dQ piece
//                         into the accumulator.
//   warpgroups 1, 2       consumers; warpgroup w owns keys 64w .. 64w + 63 of the CTA. Per Q tile:
//     S^T  = K_w Q^T       wgmma SS, 64 x kBlockM: A = K (K-major: d contiguous), B = Q (K-major)
//     dP^T = V_w dO^T      wgmma SS, same shapes with V, dO
//     P^T  = exp2(S^T * scale * log2e - LSE * log2e) masked; dS^T = P^T (dP^T - D) [* (1 - tanh^2) with softcap]
//                          (without softcap P^T is computed while dP^T is still running, and dV issued before dS^T)
//     dV  += P^T dO        wgmma RS: A = P^T from registers (the accumulator layout is the A fragment layout with
//                          k = queries), B = dO (MN-major: d contiguous, transposed)
//     dS   -> shared       (while dV runs) stmatrix .trans turns the dS^T fragments into dS rows (queries) with keys
//                          contiguous, in the 128B-swizzled K-major layout: chunk w = this warpgroup's 64 keys.
//                          Double buffered, one 256-thread named barrier per tile ("both halves of dS written").
//     dQ   = dS K          (issued before dK, so that its piece is staged while dK runs)
//                          wgmma SS: A = dS (K-major, k = the CTA's 128 keys), B = K (MN-major); each warpgroup
//                          computes a 64 x 64 piece (bwd_wgmma_config.h) and stages it in shared memory (fp32,
//                          128B swizzle; dq_full / dq_empty mbarriers, 2 buffers, 1 in d = 64 unmasked
//                          one-item launches); the buffer's dQ writer adds it into the fp32 (b, h, sq, d)
//                          accumulator with two TMA reduce-adds (cp.reduce.async.bulk.tensor .add, 64 x 32
//                          floats each). In deterministic mode a per-(b, h, Q tile) semaphore orders the CTAs'
//                          additions by n_block (grid_n_block in bwd_schedule.h: shortest first under a mask);
//                          the waits on it stall only the writers. Non-deterministic CTAs start their Q loop at different tiles (QRange) so that
//                          they do not add into the same rows at once.
//     dK  += dS^T Q        wgmma RS, as dV with dS^T and Q
//   dK (* softmax_scale) and dV are written once at the end, from registers (a quad of lanes writes 16 contiguous
//   bytes). GQA needs no atomics on dK/dV: the CTA loops over the query heads sharing its K/V head.
//
// Where the operands live and the shared-memory traffic per Q tile (both consumers, bytes, d = 128, kBlockM = 64):
//   K, V    shared for the whole CTA (loaded once);   S^T / dP^T read K_w, V_w: 2 * 2 * 16 KB = 64 KB
//   Q, dO   shared ring (TMA);                         S^T / dP^T read them whole per warpgroup: 64 KB;
//                                                      dK / dV (B operands) again: 64 KB
//   P^T     registers only (A of dV)
//   dS^T    registers (A of dK); dS written once to shared (16 KB) and read by both warpgroups' dQ (32 KB)
//   K       B of dQ, each warpgroup its 64 columns: 32 KB
//   LSE, D  shared, 2 * kBlockM floats (broadcast reads)
//   dQ      fp32 pieces written to shared and read by TMA: 2 * 32 KB
// Total ~270 KB of wgmma operand traffic (+ 64 KB dQ staging) for 5 * 2 * 128 * 64 * 128 = 10.5 MFLOP: ~39 FLOP per
// operand byte, ~31 with the staging (the mma.sync kernel: 14.5).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "hw/sm90/fence.cuh"
#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/named_barrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/setmaxnreg.cuh"
#include "hw/sm90/stmatrix.cuh"
#include "hw/sm90/tma.cuh"
#include "hw/sm90/wgmma.cuh"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_wgmma_config.h"
#include "kernels/sm90/bwd/bwd_wgmma_producer.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_scores.cuh"
#include "kernels/sm90/bwd/bwd_warp_ops.cuh"
#include "kernels/sm90/device_math.cuh"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::bwd {

// kPacked: a packed or seqused batch (BwdParams::seq), each work item in its own entry's lengths and band
// (bwd_schedule.h, BwdSequence).
template <class Element, int kHeadDim, bool kMasked, bool kPersistentCtas, bool kPacked = false>
struct BwdWgmmaKernel {
  using Tile = WgmmaTile<kHeadDim>;
  static constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  static constexpr int kChunks = Tile::kChunks, kConsumers = Tile::kConsumers, kThreads = Tile::kThreads;
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2;
  // Named barrier of both consumer warpgroups: "both halves of dS written".
  static constexpr uint32_t kBarDsReady = static_cast<uint32_t>(NamedBarrier::kBwdDsReady);
  // dQ staging buffers per consumer warpgroup (a dQ writer adds one while the consumers fill the next). At d = 64
  // (128-row Q tiles double the dS buffers) the second one fits only because the dynamic shared-memory base is
  // declared 1024-aligned (bwd_wgmma_entry.cuh), so no alignment slack is allocated: exactly 227 KB. It pays on
  // short and masked items; unmasked one-item launches at d = 64 (items of many Q tiles, where the second buffer
  // was slower) keep one buffer.
  static constexpr int kDqBuffers = (kHeadDim >= 128 || kMasked || kPersistentCtas) ? 2 : 1;
  // Persistent CTAs (bwd_schedule.h, BwdWorkRange; launched where bwd_persistent_pays): K, V double as the item
  // boundary. Otherwise one CTA per work item, the code path of the deterministic mode and of long items.
  static constexpr bool kPersistent = kPersistentCtas;
  static constexpr int kItemReaders = kConsumers * 128 + kDqBuffers;  // consumer threads + dQ writer threads

  // The batch entry b of a work item as the schedule asks it: the params themselves in a dense launch (every
  // entry alike), the entry's BwdSequence in a packed one.
  static __device__ __forceinline__ decltype(auto) entry(const BwdParams& p, int b) {
    if constexpr (kPacked) return entry_of<kBlockM, kBlockN>(p, b);
    else return (p);
  }
  // The key tile of launch position `launch` (the grid's x, or a persistent item's key step) and its Q tiles.
  template <class Entry>
  static __device__ __forceinline__ int key_tile(const Entry& e, int launch) {
    if constexpr (kPacked) return entry_key_tile<kMasked>(e, launch);
    else return key_tile_of_launch<kMasked>(e, launch);
  }
  template <class Entry>
  static __device__ __forceinline__ QRange range_of(const Entry& e, int n_block) {
    if constexpr (kPacked) return entry_q_range<Tile>(e, n_block);
    else return q_range<Tile>(e, n_block);
  }


  struct SharedStorage {
    alignas(1024) Element k[kChunks][kBlockN][64];             // 128B swizzle; A of S^T (K-major), B of dQ (MN-major)
    alignas(1024) Element v[kChunks][kBlockN][64];             // 128B swizzle; A of dP^T (K-major)
    alignas(1024) Element q[kStages][kChunks][kBlockM][64];    // 128B swizzle; B of S^T (K-major), B of dK (MN-major)
    alignas(1024) Element dout[kStages][kChunks][kBlockM][64]; // 128B swizzle; B of dP^T (K-major), B of dV (MN-major)
    alignas(1024) Element ds[2][kConsumers][kBlockM][64];      // dS rows (queries), chunk w = keys 64w..; A of dQ
    alignas(1024) float dq[kDqBuffers][kConsumers][2][64][32]; // each warpgroup's 64 x 64 dQ piece (fp32) as two
                                                               // 32-column halves, 128B swizzle (TMA reduce source)
    float lse[kStages][kBlockM];   // LSE * log2e, +inf past the sequence (P = 0)
    float dsum[kStages][kBlockM];  // D = rowsum(dO * O), 0 past the sequence
    uint64_t kv_full;
    uint64_t kv_empty;  // the consumers have finished the item's K, V reads (a persistent CTA reloads them)
    int item[2];              // the CTA's work items in turn (w; >= the item count: no more), a 2-slot ring
    uint64_t item_full[2];    // the producer has written item[slot]
    uint64_t item_empty[2];   // every consumer thread and dQ writer has read it
    uint64_t full[kStages];
    uint64_t empty[kStages];
    uint64_t dq_full[kDqBuffers][kConsumers];   // a warpgroup's piece is staged (one arrival per warp)
    uint64_t dq_empty[kDqBuffers][kConsumers];  // the buffer writer's reduce-adds have read it
  };
  // No alignment slack: the entry's shared-memory base is declared __align__(1024) (bwd_wgmma_entry.cuh checks it).
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448, "backward tiles exceed the 227 KB shared-memory limit");

  static __device__ __forceinline__ void run(const BwdWgmmaParams& P, char* smem_raw) {
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warpgroup = static_cast<int>(threadIdx.x) / 128;
    if (threadIdx.x == 0) {
      init_producer_barriers<BwdWgmmaKernel>(s);
      for (int i = 0; i < kDqBuffers; ++i)
        for (int w = 0; w < kConsumers; ++w) {
          mbarrier::init(&s.dq_full[i][w], 4);
          mbarrier::init(&s.dq_empty[i][w], 1);
        }
      if constexpr (kPersistent) {
        for (int i = 0; i < 2; ++i) {
          mbarrier::init(&s.item_full[i], 1);
          mbarrier::init(&s.item_empty[i], kItemReaders);
        }
      }
      mbarrier::fence_init();
    }
    __syncthreads();
    if constexpr (!kPersistent) {
      run_one_item(P, s, warpgroup);
    } else {
      // The CTA's work items: every role walks the same list (the producer claims them and publishes them in the
      // item ring), and the ring, the dS / dQ buffers and the K, V barriers carry their positions across items.
      const BwdWorkRange work = grid_work(P.p);
      if (warpgroup == 0) {
        setmaxnreg_dec<24>();
        if (threadIdx.x < 32) produce(P, s, work);
        else if (threadIdx.x % 32 == 0 && threadIdx.x / 32 <= kDqBuffers)
          write_dq(P, s, static_cast<int>(threadIdx.x) / 32 - 1, work);
      } else {
        setmaxnreg_inc<240>();
        // Softcap changes the element-wise pass and its pipelining; one loop per case keeps each loop's register
        // allocation to its own live values (one loop with both made ptxas serialize the wgmmas).
        if (P.p.softcap > 0.0f) {
          consume<true>(P, s, warpgroup - 1, work);
        } else {
          consume<false>(P, s, warpgroup - 1, work);
        }
      }
    }
  }

  // One CTA per work item, the item from the grid position (deterministic order: bwd_schedule.h): each role runs
  // its item function once, with fresh pipeline state (no item loop: ptxas keeps the per-item values in registers).
  static __device__ __forceinline__ void run_one_item(const BwdWgmmaParams& P, SharedStorage& s, int warpgroup) {
    const int hkv = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
    const auto& e = entry(P.p, b);
    const int n_block = key_tile(e, static_cast<int>(blockIdx.x));
    const QRange range = range_of(e, n_block);
    if (warpgroup == 0) {
      setmaxnreg_dec<24>();
      if (threadIdx.x < 32) produce_tiles<BwdWgmmaKernel>(P, s, e, n_block, hkv, b, range);
      else if (threadIdx.x % 32 == 0 && threadIdx.x / 32 <= kDqBuffers)
        write_dq_item(P, s, e, static_cast<int>(threadIdx.x) / 32 - 1, n_block, hkv, b, range, 0);
    } else {
      setmaxnreg_inc<240>();
      PipelineState<kStages> st;
      PipelineState<kDqBuffers> dq_buf;
      uint32_t kv_loads = 0;
      if (P.p.softcap > 0.0f) {
        consume_item<true>(P, s, e, warpgroup - 1, n_block, hkv, b, range, st, dq_buf, kv_loads);
      } else {
        consume_item<false>(P, s, e, warpgroup - 1, n_block, hkv, b, range, st, dq_buf, kv_loads);
      }
    }
  }

  // The producer warp decides the CTA's items (grid_work, claim_next_item) and publishes each in the item ring
  // before loading it; the other roles read them there in the same order.
  static __device__ __forceinline__ void produce(const BwdWgmmaParams& P, SharedStorage& s, BwdWorkRange work) {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    PipelineState<kStages> ring;
    PipelineState<2> slot;
    uint32_t kv_loads = 0;
    int w = work.first;
    while (true) {
      mbarrier::wait(&s.item_empty[slot.stage], slot.phase ^ 1u);  // a fresh barrier counts as released
      if (lane == 0) {
        s.item[slot.stage] = w;
        mbarrier::arrive(&s.item_full[slot.stage]);  // release: the item store
      }
      slot.advance();
      if (w >= work.total) break;
      const BwdWork item = work_item<kMasked>(P.p, w);
      const auto& e = entry(P.p, item.b);
      const int n_block = kPacked ? key_tile(e, item.n_block) : item.n_block;  // persistent: the key step itself
      produce_item<BwdWgmmaKernel>(P, s, e, n_block, item.hkv, item.b, range_of(e, n_block), ring, kv_loads);
      int next = work.total;
      if (lane == 0) next = claim_next_item(P.p);
      w = __shfl_sync(0xffffffffu, next, 0);
    }
  }

  // The next item of a reader (consumer thread or dQ writer) from the item ring; >= the item count: no more.
  static __device__ __forceinline__ int next_item(SharedStorage& s, PipelineState<2>& slot) {
    mbarrier::wait(&s.item_full[slot.stage], slot.phase);
    const int w = *static_cast<volatile int*>(&s.item[slot.stage]);
    mbarrier::arrive(&s.item_empty[slot.stage]);  // this reader's load is done before the slot is rewritten
    slot.advance();
    return w;
  }

  // The dQ writers: one thread per staging buffer (warp 1 + buffer, lane 0), so writer `w` handles Q tiles
  // w, w + kDqBuffers, ... and is the only waiter on its buffer's barriers. Each adds the consumer warpgroups'
  // staged 64 x 64 pieces into the fp32 (b, h, sq, d) accumulator with two TMA reduce-adds per piece
  // (cp.reduce.async.bulk.tensor, 64 x 32 floats each; rows past seqlen_q are clipped). Deterministic mode first
  // waits on the (b, h, Q tile) semaphore for the pieces of every earlier n_block (grid_n_block), then for its
  // own additions to complete, and releases. Those waits stall only the writer: the buffer is handed back to the
  // consumers as soon as TMA has read it, and with one writer per buffer two tiles' completion waits overlap (a
  // single writer was slower than the tile and left the consumers waiting on dq_empty).
  static __device__ __forceinline__ void write_dq(const BwdWgmmaParams& P, SharedStorage& s, int writer,
                                                  BwdWorkRange work) {
    uint32_t tiles_before = 0;  // the CTA's tiles in earlier items: tile T is staged in buffer T % kDqBuffers
    PipelineState<2> slot;
    for (int w = next_item(s, slot); w < work.total; w = next_item(s, slot)) {
      const BwdWork item = work_item<kMasked>(P.p, w);
      const auto& e = entry(P.p, item.b);
      const int n_block = kPacked ? key_tile(e, item.n_block) : item.n_block;
      const QRange range = range_of(e, n_block);
      write_dq_item(P, s, e, writer, n_block, item.hkv, item.b, range, tiles_before);
      tiles_before += static_cast<uint32_t>(P.p.group * range.m_count);
    }
  }
  template <class Entry>
  static __device__ __forceinline__ void write_dq_item(const BwdWgmmaParams& P, SharedStorage& s, const Entry& e,
                                                       int writer, int n_block, int hkv, int b, QRange range,
                                                       uint32_t tiles_before) {
    const BwdParams& p = P.p;
    constexpr bool kSplitRows = Tile::kDqSplitRows;
    const int iterations = p.group * range.m_count;
    const int stage = writer;
    // This writer's tiles of the item (bwd_schedule.h: the consumers stage tile T in buffer T % kDqBuffers).
    for (int it = dq_writer_first_tile(writer, tiles_before, kDqBuffers); it < iterations; it += kDqBuffers) {
      const uint32_t phase = dq_phase(tiles_before + static_cast<uint32_t>(it), kDqBuffers);
      const int h = hkv * p.group + it / range.m_count;
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
          // A half wholly past q's true head dim (d = 96 on this d = 128 kernel: columns 96 .. 127, zeros from
          // K's padded columns) is not sent; a partial one is clipped by the map's width (head_dims.h).
          if (col0 + 32 * half < p.head_dim)
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

  // Without softcap P^T and dS^T are two passes, so that the exps run while dP^T is still on the tensor cores:
  // P^T in place in acc_s ...
  template <class Entry>
  static __device__ __forceinline__ void probs(const BwdParams& p, const Entry& e, const SharedStorage& s, int stage,
                                               float (&acc_s)[kBlockM / 2], bool need_mask, int key_row, int m0, int t) {
#pragma unroll
    for (int jn = 0; jn < kBlockM / 8; ++jn) {
      const float2 lse2 = *reinterpret_cast<const float2*>(&s.lse[stage][8 * jn + 2 * t]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * jn + e;
        acc_s[i] = exp2f(acc_s[i] * p.log2_scale - ((e & 1) ? lse2.y : lse2.x));
      }
    }
    if (need_mask) apply_mask<kBlockM, kMasked>(e, acc_s, key_row, m0, t);
  }

  // ... and, once dP^T is in, dS^T = P^T (dP^T - D) in place in acc_dp, with P^T read back from the 16-bit A
  // fragments of dV: keeping the fp32 P^T live across the dP^T wait made ptxas serialize the wgmmas for lack of
  // registers. (The extra rounding of P^T is below the 16-bit rounding dS^T gets for its own matmuls.)
  static __device__ __forceinline__ void dscores(const SharedStorage& s, int stage,
                                                 const uint32_t (&p_frag)[kBlockM / 16][4], float (&acc_dp)[kBlockM / 2],
                                                 int t) {
#pragma unroll
    for (int jn = 0; jn < kBlockM / 8; ++jn) {
      const float2 dsum2 = *reinterpret_cast<const float2*>(&s.dsum[stage][8 * jn + 2 * t]);
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {  // elements 4 jn + 2 pair + {0, 1}: one 16-bit pair of p_frag
        const int i = 4 * jn + 2 * pair;
        const float2 prob = unpack2<Element>(p_frag[i / 8][(i % 8) / 2]);
        acc_dp[i] = prob.x * (acc_dp[i] - dsum2.x);
        acc_dp[i + 1] = prob.y * (acc_dp[i + 1] - dsum2.y);
      }
    }
  }
  template <bool kSoftcap>
  static __device__ __forceinline__ void consume(const BwdWgmmaParams& P, SharedStorage& s, int wg,
                                                 BwdWorkRange work) {
    PipelineState<kStages> st;
    PipelineState<kDqBuffers> dq_buf;
    uint32_t kv_loads = 0;  // K, V loads: kv_full's phases
    PipelineState<2> slot;
    for (int w = next_item(s, slot); w < work.total; w = next_item(s, slot)) {
      const BwdWork item = work_item<kMasked>(P.p, w);
      const auto& e = entry(P.p, item.b);
      const int n_block = kPacked ? key_tile(e, item.n_block) : item.n_block;
      consume_item<kSoftcap>(P, s, e, wg, n_block, item.hkv, item.b, range_of(e, n_block), st, dq_buf, kv_loads);
    }
  }
  template <bool kSoftcap, class Entry>
  static __device__ __forceinline__ void consume_item(const BwdWgmmaParams& P, SharedStorage& s, const Entry& e,
                                                      int wg, int n_block,
                                                      int hkv, int b, QRange range, PipelineState<kStages>& st,
                                                      PipelineState<kDqBuffers>& dq_buf, uint32_t& kv_loads) {
    const BwdParams& p = P.p;
    const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int n0 = n_block * kBlockN;
    const int key_row = n0 + wg * 64 + warp * 16 + g;  // keys of accumulator rows: key_row and key_row + 8
    const int iterations = p.group * range.m_count;
    // This warpgroup's dQ piece: rows dq_row0 .. +63 of the Q tile, columns dq_col0 .. +63.
    constexpr bool kSplitRows = Tile::kDqSplitRows;
    const int dq_row0 = kSplitRows ? wg * 64 : 0;
    const int dq_col0 = kSplitRows ? 0 : wg * 64;

    // Accumulator layout of a 64 x N wgmma (per thread N / 2 floats): element i is row 16 warp + g + 8 ((i / 2) % 2),
    // column 8 (i / 4) + 2 t + (i % 2).
    float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];  // rows = this warpgroup's keys, columns = head dim
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_dk[i] = acc_dv[i] = 0.0f;

    // stmatrix lane addresses inside one dS chunk (rows = queries, 128 bytes of keys, 128B swizzle): lane L gives
    // row 8 (L / 16) + L % 8 (+ 16 k-step) of matrix L / 8, whose keys start at 16 warp + 8 ((L / 8) % 2), i.e.
    // 16-byte unit 2 warp + (L / 8) % 2, stored at unit ^ (row % 8) (row % 8 = L % 8).
    const int st_row = 8 * (lane / 16) + lane % 8;
    const uint32_t st_off = static_cast<uint32_t>(st_row * 128 + (((2 * warp + (lane / 8) % 2) ^ (lane % 8)) * 16));

    if (iterations > 0) mbarrier::wait(&s.kv_full, kv_loads & 1u);
    // The K, V descriptors are the same for every tile of the item. A persistent CTA builds them once per item and
    // holds them (built in the tile loop, the item loop around it made ptxas rebuild them and the shared-memory
    // base, S2UR SR_CgaCtaId ..., every tile); one item per CTA builds them per tile, where they cost no registers
    // across the loop (held, they added spills to the masked kernel).
    auto kv_descs = [&](uint64_t& k_desc, uint64_t& v_desc, uint64_t& k_mn_desc) {
      k_desc = wgmma::make_desc_sw128(&s.k[0][wg * 64][0], 16, 1024);
      v_desc = wgmma::make_desc_sw128(&s.v[0][wg * 64][0], 16, 1024);
      k_mn_desc = wgmma::make_desc_sw128(&s.k[dq_col0 / 64][0][0], kBlockN * 128, 1024);
      for (uint64_t* d : {&k_desc, &v_desc, &k_mn_desc}) wgmma::desc_opaque(*d);
    };
    uint64_t k_item = 0, v_item = 0, k_mn_item = 0;
    if constexpr (kPersistent) kv_descs(k_item, v_item, k_mn_item);
    for (int it = 0; it < iterations; ++it) {
      const int m_block = range.m_block(it % range.m_count);
      const int m0 = m_block * kBlockM;
      const int stage = st.stage;
      mbarrier::wait(&s.full[stage], st.phase);

      // Operand descriptors of this tile: one base per operand, each k-step an offset from it (chunks of 64
      // columns are rows * 128 bytes apart; a K-major k-step moves 32 bytes, an MN-major one 16 rows = 2048).
      static_assert(kStages == 2, "dS buffer = ring stage");
      // dS buffer of the CTA's tile T: T % 2, which is where the ring stands (one item: T = it).
      const int buf = kPersistent ? stage : (it & 1);
      uint64_t k_base = k_item, v_base = v_item, k_mn_base = k_mn_item;
      if constexpr (!kPersistent) kv_descs(k_base, v_base, k_mn_base);
      uint64_t q_base = wgmma::make_desc_sw128(&s.q[stage][0][0][0], 16, 1024);
      uint64_t do_base = wgmma::make_desc_sw128(&s.dout[stage][0][0][0], 16, 1024);
      uint64_t q_mn_base = wgmma::make_desc_sw128(&s.q[stage][0][0][0], kBlockM * 128, 1024);
      uint64_t do_mn_base = wgmma::make_desc_sw128(&s.dout[stage][0][0][0], kBlockM * 128, 1024);
      uint64_t ds_base = wgmma::make_desc_sw128(&s.ds[buf][0][dq_row0][0], 16, 1024);
      for (uint64_t* d : {&q_base, &do_base, &q_mn_base, &do_mn_base, &ds_base})
        wgmma::desc_opaque(*d);
      auto k_major_step = [](int ks, int rows) { return static_cast<uint32_t>((ks / 4) * rows * 128 + (ks % 4) * 32); };
      constexpr uint32_t kMnStep = 16 * 128;

      // ---- S^T = K_w Q^T, then dP^T = V_w dO^T: 64 keys x kBlockM queries, k = head dim; one group each ----
      float acc_s[kBlockM / 2], acc_dp[kBlockM / 2];
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        wgmma::mma_ss<kBlockM, 0, Element>(acc_s, wgmma::desc_advance(k_base, k_major_step(ks, kBlockN)),
                                           wgmma::desc_advance(q_base, k_major_step(ks, kBlockM)), ks > 0);
      }
      wgmma::commit_group();
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        wgmma::mma_ss<kBlockM, 0, Element>(acc_dp, wgmma::desc_advance(v_base, k_major_step(ks, kBlockN)),
                                           wgmma::desc_advance(do_base, k_major_step(ks, kBlockM)), ks > 0);
      }
      wgmma::commit_group();

      // ---- P^T and dS^T in place; masks only where the tile is cut by the band or the key tail ----
      const bool need_mask = tile_needs_mask<kBlockM, kBlockN, kMasked>(e, m0, n0);
      uint32_t p_frag[kBlockM / 16][4], ds_frag[kBlockM / 16][4];  // A fragments of dV, dK (k = queries)
      // dV += P^T dO: 64 keys x d, k = kBlockM queries; B MN-major.
      auto issue_dv = [&] {
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < kBlockM / 16; ++ks) {
          wgmma::mma_rs<kHeadDim, 1, Element>(acc_dv, p_frag[ks], wgmma::desc_advance(do_mn_base, ks * kMnStep), true);
        }
        wgmma::commit_group();
      };
      // Without softcap the exps of P^T run while dP^T is on the tensor cores, and dV is queued behind dP^T before
      // dS^T: faster than one fused pass after both matmuls, which leaves the tensor cores idle during the exps.
      if constexpr (!kSoftcap) {
        wgmma::wait_group<1>();  // S^T is in
        wgmma::fence_operand(acc_s);
        probs(p, e, s, stage, acc_s, need_mask, key_row, m0, t);
        to_a_fragments<Element, kBlockM>(acc_s, p_frag);
        issue_dv();
        wgmma::wait_group<1>();  // dP^T is in (dV may still run)
        wgmma::fence_operand(acc_dp);
        dscores(s, stage, p_frag, acc_dp, t);
      } else {
        wgmma::wait_group<0>();
        wgmma::fence_operand(acc_s);
        wgmma::fence_operand(acc_dp);
        // One fused pass after both matmuls (with softcap dS^T also needs each element's tanh derivative, which
        // would otherwise stay in registers across the dP^T wait).
        probs_and_dscores<kBlockM, kMasked, kSoftcap>(p, e, s.lse[stage], s.dsum[stage], acc_s, acc_dp, need_mask,
                                                      key_row, m0, t);
        to_a_fragments<Element, kBlockM>(acc_s, p_frag);
        issue_dv();
      }
      to_a_fragments<Element, kBlockM>(acc_dp, ds_frag);

      // ---- dS (queries x this warpgroup's 64 keys) to shared while dV runs ----
      const uint32_t s_ds = smem_addr(&s.ds[buf][wg][0][0]) + st_off;
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) stmatrix_x4_trans(s_ds + ks * 16 * 128, ds_frag[ks]);
      fence_async_shared();                            // generic-proxy stores -> wgmma (async proxy) reads
      named_barrier_sync(kBarDsReady, 2 * 128);        // both halves of dS are written

      // ---- dQ piece = dS K: 64 x 64, k = the CTA's 128 keys; A K-major, B (K) MN-major. Issued before dK so
      // that the piece is staged while dK is still on the tensor cores. ----
      float acc_dq[32];
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        wgmma::mma_ss<64, 1, Element>(acc_dq, wgmma::desc_advance(ds_base, k_major_step(ks, kBlockM)),
                                      wgmma::desc_advance(k_mn_base, ks * kMnStep), ks > 0);
      }
      wgmma::commit_group();

      // ---- dK += dS^T Q: 64 keys x d, k = kBlockM queries; B MN-major ----
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) {
        wgmma::mma_rs<kHeadDim, 1, Element>(acc_dk, ds_frag[ks], wgmma::desc_advance(q_mn_base, ks * kMnStep), true);
      }
      wgmma::commit_group();

      wgmma::wait_group<1>();  // dV and the dQ piece are done (dK may still run)
      wgmma::fence_operand(acc_dv);
      wgmma::fence_operand(acc_dq);

      // ---- dQ piece -> s.dq[buffer][wg] (fp32, TMA's 128B-swizzled layout: two 64 x 32 halves, 16-byte unit u
      // of row r at u ^ (r % 8), so a warp's float2 stores hit each bank twice, the minimum for 256 bytes); the
      // buffer's dQ writer adds it into the accumulator. ----
      mbarrier::wait(&s.dq_empty[dq_buf.stage][wg], dq_buf.phase ^ 1u);  // a fresh barrier counts as released
      char* s_dq = reinterpret_cast<char*>(&s.dq[dq_buf.stage][wg][0][0][0]);
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const int r = warp * 16 + g + 8 * ((i / 2) % 2), c = 8 * (i / 4) + 2 * t;  // c, c + 1 of 64
        const int half = c / 32, unit = (c % 32) / 4;
        *reinterpret_cast<float2*>(s_dq + half * (64 * 128) + r * 128 + ((unit ^ (r % 8)) * 16) + (c % 4) * 4) =
            make_float2(acc_dq[i], acc_dq[i + 1]);
      }
      fence_async_shared();  // generic-proxy stores -> TMA (async proxy) reads
      __syncwarp();
      if (lane == 0) mbarrier::arrive(&s.dq_full[dq_buf.stage][wg]);

      wgmma::wait_group<0>();  // dK done: Q, dO, LSE, D of this stage are no longer read
      wgmma::fence_operand(acc_dk);
#pragma unroll
      for (int j = 0; j < kBlockM / 16; ++j) {
        wgmma::fence_operand(p_frag[j]);
        wgmma::fence_operand(ds_frag[j]);
      }
      // Every thread arrives (not one per warp after __syncwarp): each thread's own LSE / D reads are then
      // ordered before the producer's next writes to this stage by the barrier alone, which compute-sanitizer's
      // racecheck can verify.
      mbarrier::arrive(&s.empty[stage]);
      dq_buf.advance();
      st.advance();
    }
    if (iterations > 0) {
      // Every wgmma of the item has completed (wait_group<0> above): K, V may be reloaded for the next item
      // while this warpgroup writes dK, dV from registers.
      if constexpr (kPersistent) mbarrier::arrive(&s.kv_empty);
      ++kv_loads;
    }

    // ---- dK = scale * sum dS^T Q, dV = sum P^T dO ----
    store_dk_dv<Element, kHeadDim>(p, e, acc_dk, acc_dv, b, hkv, key_row, 0, t);
  }
};

}  // namespace flash4::sm90::bwd
