// The Hopper backward main kernel on TMA + wgmma (the mma.sync kernel in bwd_mma_sync_kernel.cuh remains the fallback for
// what this one does not cover, see bwd_api.cu). Tiles: bwd_wgmma_config.h.
//
// Each CTA owns kBlockN = 128 keys of one (batch, kv head) and loops over the query heads of its GQA group (all of
// them, or its part of them where the host splits the group: bwd_schedule.h, GroupPart) and every Q tile that
// can see the keys (mask-aware interval, same rule as the mma.sync kernel). Roles:
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
//                          (without softcap P^T is computed while dP^T is still running)
//     dS   -> shared       stmatrix .trans turns the dS^T fragments into dS rows (queries) with keys contiguous, in
//                          the 128B-swizzled K-major layout: chunk w = this warpgroup's 64 keys. Double buffered,
//                          one 256-thread named barrier per tile ("both halves of dS written").
//     dV  += P^T dO        (issued after the dS stores, so it runs during the fence and that barrier)
//                          wgmma RS: A = P^T from registers (the accumulator layout is the A fragment layout with
//                          k = queries), B = dO (MN-major: d contiguous, transposed)
//     dQ   = dS K          (issued before dK, so that its piece is staged while dK runs)
//                          wgmma SS: A = dS (K-major, k = the CTA's 128 keys), B = K (MN-major); each warpgroup
//                          computes a 64 x 64 piece (bwd_wgmma_config.h) and stages it in shared memory (fp32,
//                          128B swizzle; dq_full / dq_empty mbarriers, 2 buffers, 1 in d = 64 unmasked
//                          one-item launches); the buffer's dQ writer adds it into the fp32 (b, h, sq, d)
//                          accumulator with two TMA reduce-adds (cp.reduce.async.bulk.tensor .add, 64 x 32
//                          floats each). In deterministic mode a per-(b, h, Q tile) semaphore orders the CTAs'
//                          additions by n_block (grid_n_block in bwd_schedule.h: shortest first under a mask);
//                          the waits on it stall only the writers. Non-deterministic CTAs start their Q loop at
//                          different tiles (QRange) so that they do not add into the same rows at once.
//     dK  += dS^T Q        wgmma RS, as dV with dS^T and Q
//   dK (* softmax_scale) and dV are written once at the end, from registers (a quad of lanes writes 16 contiguous
//   bytes). GQA needs no atomics on dK/dV: the CTA loops over the query heads sharing its K/V head; a split group
//   writes fp32 partials instead, summed in order by bwd_group_reduce_kernel.
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
#include "kernels/sm90/bwd/bwd_wgmma_consumer.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_dq_writer.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_producer.cuh"
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
  // Bytes TMA writes per tile: whole chunks (d = 96: the columns past it zero-filled). V and dO as wide as K, Q.
  static constexpr int kChunksV = kChunks;
  static constexpr uint32_t kKBytes = kBlockN * kChunks * 64 * 2, kVBytes = kKBytes;
  static constexpr uint32_t kQBytes = kBlockM * kChunks * 64 * 2, kDoBytes = kQBytes;
  // Named barrier of both consumer warpgroups: "both halves of dS written"; and each one's own.
  static constexpr uint32_t kBarDsReady = static_cast<uint32_t>(NamedBarrier::kBwdDsReady);
  static constexpr uint32_t kBarWg0 = static_cast<uint32_t>(NamedBarrier::kConsumerWg0);
  static constexpr bool kPackedEntries = kPacked;
  // dQ staging buffers per consumer warpgroup (a dQ writer adds one while the consumers fill the next). At d = 64
  // (128-row Q tiles double the dS buffers) the second one fits only because the dynamic shared-memory base is
  // declared 1024-aligned (bwd_wgmma_entry.cuh), so no alignment slack is allocated: exactly 227 KB. It pays on
  // short and masked items; unmasked one-item launches at d = 64 (items of many Q tiles, where the second buffer
  // was slower) keep one buffer.
  static constexpr int kDqBuffers = (kHeadDim > 64 || kMasked || kPersistentCtas) ? 2 : 1;
  // Persistent CTAs (bwd_schedule.h, BwdWorkRange; launched where bwd_persistent_pays): K, V double as the item
  // boundary. Otherwise one CTA per work item, the code path of the deterministic mode and of long items.
  static constexpr bool kPersistent = kPersistentCtas;
  static constexpr int kItemReaders = kConsumers * 128 + kDqBuffers;  // consumer threads + dQ writer threads
  using Consumer = BwdWgmmaConsumer<BwdWgmmaKernel, Element, kHeadDim, kMasked>;

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
    const int warpgroup = wgmma::warpgroup_index();
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
    const ItemPosition item = grid_item<kMasked>(P.p);
    const int slot = item.slot, b = item.b;  // slot: GroupPart
    const auto& e = entry(P.p, b);
    const int n_block = key_tile(e, item.launch);
    const QRange range = range_of(e, n_block);
    if (warpgroup == 0) {
      setmaxnreg_dec<24>();
      if (threadIdx.x < 32) produce_tiles<BwdWgmmaKernel>(P, s, e, n_block, slot, b, range);
      else if (threadIdx.x % 32 == 0 && threadIdx.x / 32 <= kDqBuffers)
        write_dq_item<BwdWgmmaKernel, kMasked>(P, s, e, static_cast<int>(threadIdx.x) / 32 - 1, n_block, slot, b,
                                               range, 0);
    } else {
      setmaxnreg_inc<240>();
      PipelineState<kStages> st;
      PipelineState<kDqBuffers> dq_buf;
      uint32_t kv_loads = 0;
      if (P.p.softcap > 0.0f) {
        Consumer::template consume_item<true>(P, s, e, warpgroup - 1, n_block, slot, b, range, st, dq_buf,
                                              kv_loads);
      } else {
        Consumer::template consume_item<false>(P, s, e, warpgroup - 1, n_block, slot, b, range, st, dq_buf,
                                               kv_loads);
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
      produce_item<BwdWgmmaKernel>(P, s, e, n_block, item.slot, item.b, range_of(e, n_block), ring, kv_loads);
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
      write_dq_item<BwdWgmmaKernel, kMasked>(P, s, e, writer, n_block, item.slot, item.b, range, tiles_before);
      tiles_before += static_cast<uint32_t>(group_part(P.p, item.slot).heads * range.m_count);
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
      Consumer::template consume_item<kSoftcap>(P, s, e, wg, n_block, item.slot, item.b, range_of(e, n_block), st,
                                                dq_buf, kv_loads);
    }
  }
};

}  // namespace flash4::sm90::bwd
