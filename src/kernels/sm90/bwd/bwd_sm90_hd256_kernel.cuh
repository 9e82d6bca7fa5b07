// The Hopper backward main kernel for head_dim 256 on TMA + wgmma.
//
// At d = 256 the d = 64/128 kernel's layout (each consumer warpgroup keeps dK and dV of its 64 keys over the whole
// head dim) would need 256 accumulator registers per thread. Here a CTA owns kBlockN = 64 keys and the two consumer
// warpgroups split the head dim instead: warpgroup w owns output columns 128w .. 128w + 127 of dK, dV and dQ
// (128 accumulator registers). Both compute the full S^T and dP^T (the reduction runs over all 256 columns), so the
// warpgroups never wait for each other; that costs 7/5 of the matmul FLOPs of one pass.
//
// Roles (one CTA per (64-key tile, kv head, batch), looping over the query heads of its GQA group and the Q tiles
// that can see its keys, as in bwd_sm90_kernel.cuh):
//   warpgroup 0, warp 0   producer: K, V once (TMA); per Q tile Q and dO (TMA) into a 2-stage ring, LSE * log2e
//                         and D by the 32 lanes.
//   warpgroups 1, 2       consumers, per Q tile (kBlockM = 64 queries):
//     S^T = K Q^T, dP^T = V dO^T   wgmma SS, 64 keys x 64 queries, k = 256 (both warpgroups, identical)
//     P^T, dS^T                    element-wise in registers (as in the d = 64/128 kernel)
//     dV[:, w] += P^T dO[:, w]     wgmma RS, N = 128 (this warpgroup's columns), k = 64 queries
//     dK[:, w] += dS^T Q[:, w]     wgmma RS, same
//     dS -> shared                 stmatrix .trans into this warpgroup's own 64 x 64 dS tile (no cross-warpgroup
//                                  barrier: each warpgroup has its own copy)
//     dQ[:, w] = dS K[:, w]        wgmma SS, 64 queries x 128 columns, k = 64 keys; added to the fp32 accumulator
//                                  with vector atomics (red.global.add.v2.f32) from registers. (The d = 64/128
//                                  kernel stages its pieces for TMA reduce-adds; here shared memory is full.)
//   dK (* softmax_scale) and dV of the warpgroup's columns are written once at the end.
//
// Shared memory: K, V 2 x 32 KB; Q, dO 2 stages x 2 x 32 KB; dS 2 x 8 KB; LSE, D 1 KB: 209 KB.
// Deterministic mode: a per-(b, h, Q tile) semaphore orders the CTAs' dQ additions by n_block (grid_n_block in
// bwd_schedule.h; each warpgroup adds 1 when its columns are in).
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
#include "kernels/sm90/bwd/bwd_kernel.cuh"  // tanh_accurate
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_sm90_config.h"
#include "kernels/sm90/bwd/bwd_sm90_producer.cuh"
#include "kernels/sm90/bwd/bwd_sm90_scores.cuh"
#include "kernels/sm90/bwd/bwd_warp_ops.cuh"

namespace flash4::sm90::bwd {

// Red (no return) of two consecutive floats into global memory, one instruction (sm_90).
__device__ __forceinline__ void red_add_v2(float* dst, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
}

template <class Element, bool kMasked>
struct BwdWgmmaHd256Kernel {
  using Tile = WgmmaTileHd256;
  static constexpr int kHeadDim = Tile::kHeadDim, kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  static constexpr int kStages = Tile::kStages, kChunks = Tile::kChunks, kConsumers = Tile::kConsumers;
  static constexpr int kThreads = Tile::kThreads, kCols = Tile::kCols;
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2;
  static constexpr uint32_t kBarWg0 = static_cast<uint32_t>(NamedBarrier::kConsumerWg0);

  struct SharedStorage {
    alignas(1024) Element k[kChunks][kBlockN][64];              // 128B swizzle; A of S^T, B of dQ (MN-major)
    alignas(1024) Element v[kChunks][kBlockN][64];              // 128B swizzle; A of dP^T
    alignas(1024) Element q[kStages][kChunks][kBlockM][64];     // B of S^T (K-major), B of dK (MN-major)
    alignas(1024) Element dout[kStages][kChunks][kBlockM][64];  // B of dP^T (K-major), B of dV (MN-major)
    alignas(1024) Element ds[kConsumers][kBlockM][64];          // each warpgroup's dS (queries x 64 keys); A of dQ
    float lse[kStages][kBlockM];   // LSE * log2e, +inf past the sequence (P = 0)
    float dsum[kStages][kBlockM];  // D = rowsum(dO * O), 0 past the sequence
    uint64_t kv_full;
    uint64_t full[kStages];
    uint64_t empty[kStages];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + base alignment
  static_assert(kSmemBytes <= 232448, "backward tiles exceed the 227 KB shared-memory limit");

  static __device__ __forceinline__ void run(const BwdWgmmaParams& P, char* smem_raw) {
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warpgroup = static_cast<int>(threadIdx.x) / 128;
    if (threadIdx.x == 0) {
      init_producer_barriers<BwdWgmmaHd256Kernel>(s);
      mbarrier::fence_init();
    }
    __syncthreads();
    const int n_block = grid_n_block<kMasked>(P.p);  // deterministic order: bwd_schedule.h
    const int hkv = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
    const QRange range = q_range<Tile>(P.p, n_block);
    if (warpgroup == 0) {
      setmaxnreg_dec<24>();
      if (threadIdx.x < 32) produce_tiles<BwdWgmmaHd256Kernel>(P, s, n_block, hkv, b, range);
    } else {
      setmaxnreg_inc<240>();
      consume(P, s, warpgroup - 1, n_block, hkv, b, range);
    }
  }

  template <bool kSoftcap>
  static __device__ __forceinline__ void consume_loop(const BwdWgmmaParams& P, SharedStorage& s, int wg,
                                                      int n_block, int hkv, int b, QRange range,
                                                      float (&acc_dk)[kCols / 2], float (&acc_dv)[kCols / 2]) {
    const BwdParams& p = P.p;
    const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int n0 = n_block * kBlockN;
    const int key_row = n0 + warp * 16 + g;  // keys of accumulator rows: key_row and key_row + 8
    const int iterations = p.group * range.m_count;
    const int col0 = wg * kCols;  // first output column of this warpgroup

    // stmatrix lane addresses inside the 64 x 64 dS tile (rows = queries, 128 bytes of keys, 128B swizzle), as in
    // bwd_sm90_kernel.cuh: lane L gives row 8 (L / 16) + L % 8 (+ 16 k-step) of matrix L / 8, whose keys start at
    // 16 warp + 8 ((L / 8) % 2), i.e. 16-byte unit 2 warp + (L / 8) % 2, stored at unit ^ (row % 8).
    const int st_row = 8 * (lane / 16) + lane % 8;
    const uint32_t st_off = static_cast<uint32_t>(st_row * 128 + (((2 * warp + (lane / 8) % 2) ^ (lane % 8)) * 16));

    mbarrier::wait(&s.kv_full, 0);
    PipelineState<kStages> st;
    for (int it = 0; it < iterations; ++it) {
      const int h = hkv * p.group + it / range.m_count;
      const int m_block = range.m_block(it % range.m_count);
      const int m0 = m_block * kBlockM;
      const int stage = st.stage;
      mbarrier::wait(&s.full[stage], st.phase);

      // ---- S^T = K Q^T, dP^T = V dO^T: 64 keys x 64 queries, k = 256 ----
      float acc_s[kBlockM / 2], acc_dp[kBlockM / 2];
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const uint64_t desc_k = wgmma::make_desc_sw128(&s.k[ks / 4][0][(ks % 4) * 16], 16, 1024);
        const uint64_t desc_q = wgmma::make_desc_sw128(&s.q[stage][ks / 4][0][(ks % 4) * 16], 16, 1024);
        wgmma::mma_ss<kBlockM, 0, Element>(acc_s, desc_k, desc_q, ks > 0);
      }
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const uint64_t desc_v = wgmma::make_desc_sw128(&s.v[ks / 4][0][(ks % 4) * 16], 16, 1024);
        const uint64_t desc_do = wgmma::make_desc_sw128(&s.dout[stage][ks / 4][0][(ks % 4) * 16], 16, 1024);
        wgmma::mma_ss<kBlockM, 0, Element>(acc_dp, desc_v, desc_do, ks > 0);
      }
      wgmma::commit_group();
      wgmma::wait_group<0>();
      wgmma::fence_operand(acc_s);
      wgmma::fence_operand(acc_dp);

      // ---- P^T and dS^T in place; masks only where the tile is cut by the band or the key tail ----
      bool need_mask = n0 + kBlockN > p.seqlen_k;
      if constexpr (kMasked) {
        const long long lo = static_cast<long long>(n0) - (m0 + kBlockM - 1);  // smallest j - i in the tile
        const long long hi = static_cast<long long>(n0 + kBlockN - 1) - m0;    // largest
        need_mask = need_mask || lo < p.band_lo || hi > p.band_hi;
      }
      probs_and_dscores<kBlockM, kMasked, kSoftcap>(p, s.lse[stage], s.dsum[stage], acc_s, acc_dp, need_mask,
                                                    key_row, m0, t);
      uint32_t p_frag[kBlockM / 16][4], ds_frag[kBlockM / 16][4];  // A fragments of dV, dK (k = queries)
#pragma unroll
      for (int j = 0; j < kBlockM / 16; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          p_frag[j][r] = pack2<Element>(acc_s[8 * j + 2 * r], acc_s[8 * j + 2 * r + 1]);
          ds_frag[j][r] = pack2<Element>(acc_dp[8 * j + 2 * r], acc_dp[8 * j + 2 * r + 1]);
        }

      // ---- dV[:, cols] += P^T dO[:, cols], dK[:, cols] += dS^T Q[:, cols]: N = 128 = two 64-column chunks
      // (LBO = one chunk of the Q / dO tile, kBlockM * 128 bytes), k = 64 queries, B MN-major ----
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) {
        const uint64_t desc_do = wgmma::make_desc_sw128(&s.dout[stage][col0 / 64][ks * 16][0], kBlockM * 128, 1024);
        wgmma::mma_rs<kCols, 1, Element>(acc_dv, p_frag[ks], desc_do, true);
      }
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) {
        const uint64_t desc_q = wgmma::make_desc_sw128(&s.q[stage][col0 / 64][ks * 16][0], kBlockM * 128, 1024);
        wgmma::mma_rs<kCols, 1, Element>(acc_dk, ds_frag[ks], desc_q, true);
      }
      wgmma::commit_group();

      // ---- dS (queries x the CTA's 64 keys) to this warpgroup's shared tile while dV / dK run ----
      const uint32_t s_ds = smem_addr(&s.ds[wg][0][0]) + st_off;
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) stmatrix_x4_trans(s_ds + ks * 16 * 128, ds_frag[ks]);
      fence_async_shared();                    // generic-proxy stores -> wgmma (async proxy) reads
      named_barrier_sync(kBarWg0 + wg, 128);   // the warpgroup's four warps have written their keys

      wgmma::wait_group<0>();  // dV, dK done: Q, dO, LSE, D of this stage are no longer read; fragments free
      wgmma::fence_operand(acc_dv);
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

      // ---- dQ[:, cols] = dS K[:, cols]: 64 queries x 128 columns, k = 64 keys; A K-major, B (K) MN-major ----
      float acc_dq[kCols / 2];
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        const uint64_t desc_ds = wgmma::make_desc_sw128(&s.ds[wg][0][ks * 16], 16, 1024);
        const uint64_t desc_kt = wgmma::make_desc_sw128(&s.k[col0 / 64][ks * 16][0], kBlockN * 128, 1024);
        wgmma::mma_ss<kCols, 1, Element>(acc_dq, desc_ds, desc_kt, ks > 0);
      }
      wgmma::commit_group();
      wgmma::wait_group<0>();  // also: the next tile may overwrite s.ds[wg]
      wgmma::fence_operand(acc_dq);

      // ---- dQ accumulator (fp32, (b, h, sq, d)) += dQ[:, cols]: rows 16 warp + g (+8), columns 8 (i / 4) + 2t ----
      int* semaphore = nullptr;
      if (p.deterministic) {
        // Warpgroups add into this (b, h, Q tile) in the order of grid_n_block; each visible (tile, earlier n_block)
        // contributes one release per consumer warpgroup. Wait for "at least": the other warpgroup of this CTA
        // (disjoint columns, so its order against ours does not change any sum) may already have released, while
        // no later n_block can add before both of ours have.
        semaphore = p.semaphores + (static_cast<int64_t>(b) * p.heads + h) * p.m_blocks + m_block;
        if (tid == 0) {
          const int expected = releases_before<Tile, kMasked>(p, m_block, n_block, kConsumers);
          while (ld_acquire_gpu(semaphore) < expected) __nanosleep(64);
        }
        named_barrier_sync(kBarWg0 + wg, 128);  // our turn
      }
      float* g_dq = p.dq_accum + ((static_cast<int64_t>(b) * p.heads + h) * p.seqlen_q) * kHeadDim + col0 + 2 * t;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp * 16 + g + 8 * half;
        if (row >= p.seqlen_q) continue;
        float* g_row = g_dq + static_cast<int64_t>(row) * kHeadDim;
#pragma unroll
        for (int i = 2 * half; i < kCols / 2; i += 4) red_add_v2(g_row + 8 * (i / 4), acc_dq[i], acc_dq[i + 1]);
      }
      if (p.deterministic) {
        __threadfence();                        // this thread's additions are performed
        named_barrier_sync(kBarWg0 + wg, 128);  // ... and every thread's
        if (tid == 0) red_release_gpu_add(semaphore, 1);
      }
      st.advance();
    }
  }

  static __device__ __forceinline__ void consume(const BwdWgmmaParams& P, SharedStorage& s, int wg, int n_block,
                                                 int hkv, int b, QRange range) {
    const BwdParams& p = P.p;
    const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int key_row = n_block * kBlockN + warp * 16 + g;
    const int col0 = wg * kCols;

    // Accumulator layout of a 64 x 128 wgmma: element i is row 16 warp + g + 8 ((i / 2) % 2), column 8 (i / 4) +
    // 2 t + (i % 2) of this warpgroup's columns.
    float acc_dk[kCols / 2], acc_dv[kCols / 2];
#pragma unroll
    for (int i = 0; i < kCols / 2; ++i) acc_dk[i] = acc_dv[i] = 0.0f;
    if (p.group * range.m_count > 0) {
      // One loop per softcap case, so that each loop's registers hold only its own element-wise pass.
      if (p.softcap > 0.0f) {
        consume_loop<true>(P, s, wg, n_block, hkv, b, range, acc_dk, acc_dv);
      } else {
        consume_loop<false>(P, s, wg, n_block, hkv, b, range, acc_dk, acc_dv);
      }
    }

    // ---- dK = scale * sum dS^T Q, dV = sum P^T dO, this warpgroup's columns ----
    store_dk_dv<Element, kCols>(p, acc_dk, acc_dv, b, hkv, key_row, col0, t);
  }
};

}  // namespace flash4::sm90::bwd
