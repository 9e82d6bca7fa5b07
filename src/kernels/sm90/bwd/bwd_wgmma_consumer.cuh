// The consumer warpgroups of the wgmma backward kernel (bwd_wgmma_kernel.cuh, whose header comment gives the
// per-tile steps and where each operand lives): one work item's Q tiles, S^T and dP^T, P^T and dS^T, dV, dS to
// shared memory, the dQ piece, dK; then dK and dV from registers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hw/sm90/fence.cuh"
#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/named_barrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/stmatrix.cuh"
#include "hw/sm90/wgmma.cuh"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_query_tail.cuh"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_warp_ops.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"
#include "kernels/sm90/bwd/bwd_wgmma_scores.cuh"
#include "kernels/sm90/device_math.cuh"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::bwd {

// `Kernel` (BwdWgmmaKernel) gives the tile constants, the shared storage and the ring sizes.
template <class Kernel, class Element, int kHeadDim, bool kMasked>
struct BwdWgmmaConsumer {
  using Tile = typename Kernel::Tile;
  using SharedStorage = typename Kernel::SharedStorage;
  static constexpr int kBlockM = Kernel::kBlockM, kBlockN = Kernel::kBlockN, kStages = Kernel::kStages;
  static constexpr int kDqBuffers = Kernel::kDqBuffers;
  static constexpr bool kPersistent = Kernel::kPersistent;
  static constexpr uint32_t kBarDsReady = Kernel::kBarDsReady;
  static constexpr int kChunks = Kernel::kChunks;

  // Keys past an entry's end in its last key tile (packed or seqused batches) are rows of the caller's tensors
  // that belong to no sequence or to the next one: any bits, NaN included. P^T hides them by a select, but
  // dS^T = P^T (dP^T - D) multiplies their dP^T (= V dO^T) by P = 0, and dQ = dS K their K rows: 0 * NaN is
  // NaN. So each warpgroup zeroes the rows of its 64 keys from `valid_rows` on, in K and V, before its first
  // matmul of the item (its own barrier orders the stores, the fence makes them visible to wgmma); the dQ
  // matmul, which also reads the other warpgroup's K rows, comes after the dS barrier both pass.
  static __device__ __forceinline__ void clear_kv_tail(SharedStorage& s, int wg, int valid_rows) {
    const int unit = static_cast<int>(threadIdx.x % 8);  // 16-byte unit of a 128-byte chunk row; 16 rows a pass
    for (int row = max(valid_rows, 0) + static_cast<int>(threadIdx.x % 128) / 8; row < 64; row += 16) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        reinterpret_cast<uint4*>(&s.k[c][wg * 64 + row][0])[unit] = make_uint4(0u, 0u, 0u, 0u);
        reinterpret_cast<uint4*>(&s.v[c][wg * 64 + row][0])[unit] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    fence_async_shared();
    named_barrier_sync(Kernel::kBarWg0 + static_cast<uint32_t>(wg), 128);
  }

  // Without softcap P^T and dS^T are two passes, so that the exps run while dP^T is still on the tensor cores:
  // P^T in place in acc_s ...
  template <class Entry>
  static __device__ __forceinline__ void probs(const BwdParams& p, const Entry& e, const SharedStorage& s, int stage,
                                               float (&acc_s)[kBlockM / 2], float2 lse_first, bool need_mask,
                                               int key_row, int m0, int t) {
#pragma unroll
    for (int jn = 0; jn < kBlockM / 8; ++jn) {
      const float2 lse2 = jn == 0 ? lse_first : row_pair(s.lse[stage], jn, t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * jn + e;
        acc_s[i] = exp2f(acc_s[i] * p.log2_scale - ((e & 1) ? lse2.y : lse2.x));
      }
    }
    if (need_mask) apply_mask<kBlockM, kMasked>(e, acc_s, key_row, m0, t);
  }

  // ... and, once dP^T is in, dS^T = P^T (dP^T - D) in place in acc_dp. With 64-row Q tiles (d = 96, 128) the
  // fp32 P^T (32 registers) stays live across the dP^T wait. With 128-row tiles (d = 64) it would be 64 registers,
  // which spill, so P^T is read back from the 16-bit A fragments of dV instead (the extra rounding is below the
  // 16-bit rounding dS^T gets for its own matmuls).
  static constexpr bool kKeepProbsFp32 = kBlockM <= 64;
  static __device__ __forceinline__ void dscores(const SharedStorage& s, int stage, const float (&acc_s)[kBlockM / 2],
                                                 const uint32_t (&p_frag)[kBlockM / 16][4],
                                                 float (&acc_dp)[kBlockM / 2], float2 dsum_first, int t) {
#pragma unroll
    for (int jn = 0; jn < kBlockM / 8; ++jn) {
      const float2 dsum2 = jn == 0 ? dsum_first : row_pair(s.dsum[stage], jn, t);
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {  // elements 4 jn + 2 pair + {0, 1}: one 16-bit pair of p_frag
        const int i = 4 * jn + 2 * pair;
        const float2 prob = kKeepProbsFp32 ? make_float2(acc_s[i], acc_s[i + 1])
                                           : unpack2<Element>(p_frag[i / 8][(i % 8) / 2]);
        acc_dp[i] = prob.x * (acc_dp[i] - dsum2.x);
        acc_dp[i + 1] = prob.y * (acc_dp[i + 1] - dsum2.y);
      }
    }
  }
  // A warpgroup's 64 x 64 dQ piece (fp32) into its staging buffer: TMA's 128B-swizzled layout, two 64 x 32
  // halves, 16-byte unit u of row r at u ^ (r % 8). Accumulator element i is row 16 warp + g + 8 ((i / 2) % 2),
  // column 8 (i / 4) + 2 t + i % 2, so r % 8 = g for every i.
  //   fragment order (bwd_params.h, dq_fragment_column): a thread's columns 2t, 2t + 1, 2t + 8, 2t + 9 of group
  //     q = (i / 8) % 2 of half i / 16 are unit 2t + q: eight 16-byte stores at (2t ^ g) ^ q, and a quarter warp
  //     (rows g, g + 1) covers all 32 banks.
  //   row-major: columns c, c + 1 (c = 2t + 8j) are half of unit 2j + t / 2: sixteen 8-byte stores at
  //     ((t / 2) ^ g) ^ 2j, each bank hit twice per warp (the minimum for 256 bytes).
  // One per-thread offset each; q or j flip its bits, the row and half steps are immediates of the stores.
  static __device__ __forceinline__ void stage_dq_piece(char* s_dq, const float (&acc_dq)[32], bool fragment_order,
                                                        int warp, int g, int t) {
    if (fragment_order) {
      const uint32_t off = (warp * 16 + g) * 128 + ((2 * t) ^ g) * 16;
#pragma unroll
      for (int i = 0; i < 32; i += 8) {  // i = 16 half + 8 q
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
          const int a = i + 2 * rh;
          const uint32_t at = (i / 16) * (64 * 128) + rh * (8 * 128) + (off ^ (((i / 8) % 2) << 4));
          *reinterpret_cast<float4*>(s_dq + at) = make_float4(acc_dq[a], acc_dq[a + 1], acc_dq[a + 4], acc_dq[a + 5]);
        }
      }
    } else {
      const uint32_t off = (warp * 16 + g) * 128 + ((t / 2) ^ g) * 16 + ((2 * t) % 4) * 4;
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const uint32_t at = (i / 16) * (64 * 128) + ((i / 2) % 2) * (8 * 128) + (off ^ (((i / 4) % 4) << 5));
        *reinterpret_cast<float2*>(s_dq + at) = make_float2(acc_dq[i], acc_dq[i + 1]);
      }
    }
  }

  template <bool kSoftcap, class Entry>
  static __device__ __forceinline__ void consume_item(const BwdWgmmaParams& P, SharedStorage& s, const Entry& e,
                                                      int wg, int n_block,
                                                      int slot, int b, QRange range, PipelineState<kStages>& st,
                                                      PipelineState<kDqBuffers>& dq_buf, uint32_t& kv_loads) {
    const BwdParams& p = P.p;
    const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int n0 = n_block * kBlockN;
    const int key_row = n0 + wg * 64 + warp * 16 + g;  // keys of accumulator rows: key_row and key_row + 8
    const int iterations = group_part(p, slot).heads * range.m_count;  // the item's query heads x Q tiles
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
    if constexpr (Kernel::kPackedEntries) {
      const int valid_rows = e.seqlen_k - n0 - wg * 64;  // the same for the whole warpgroup
      if (iterations > 0 && valid_rows < 64) clear_kv_tail(s, wg, valid_rows);
    }
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
    QStep at;
    for (int it = 0; it < iterations; ++it, at.advance(range)) {
      const int m_block = range.m_block(at.step);
      const int m0 = m_block * kBlockM;
      const int stage = st.stage;
      mbarrier::wait(&s.full[stage], st.phase);
      if constexpr (Kernel::kPackedEntries) {
        if (e.seqlen_q - m0 < kBlockM)
          clear_query_tail(s.q[stage], s.dout[stage], e.seqlen_q - m0, wg * 128 + tid, kBarDsReady);
      }

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
      // Without softcap the exps of P^T run while dP^T is on the tensor cores: faster than one fused pass after
      // both matmuls, which leaves the tensor cores idle during the exps.
      if constexpr (!kSoftcap) {
        // The first LSE and D pairs are read before each wait, so that the first element's arithmetic does not
        // wait for a shared-memory load after the matmul is in (the later pairs' loads overlap earlier pairs;
        // holding every pair across the wait ran slower, docs/performance.md 4.9).
        const float2 lse_first = row_pair(s.lse[stage], 0, t);
        wgmma::wait_group<1>();  // S^T is in
        wgmma::fence_operand(acc_s);
        probs(p, e, s, stage, acc_s, lse_first, need_mask, key_row, m0, t);
        to_a_fragments<Element, kBlockM>(acc_s, p_frag);
        const float2 dsum_first = row_pair(s.dsum[stage], 0, t);
        wgmma::wait_group<0>();  // dP^T is in
        wgmma::fence_operand(acc_dp);
        dscores(s, stage, acc_s, p_frag, acc_dp, dsum_first, t);
      } else {
        wgmma::wait_group<0>();
        wgmma::fence_operand(acc_s);
        wgmma::fence_operand(acc_dp);
        // One fused pass after both matmuls (with softcap dS^T also needs each element's tanh derivative, which
        // would otherwise stay in registers across the dP^T wait).
        probs_and_dscores<kBlockM, kMasked, kSoftcap>(p, e, s.lse[stage], s.dsum[stage], acc_s, acc_dp, need_mask,
                                                      key_row, m0, t);
        to_a_fragments<Element, kBlockM>(acc_s, p_frag);
      }
      to_a_fragments<Element, kBlockM>(acc_dp, ds_frag);

      // ---- dS (queries x this warpgroup's 64 keys) to shared, then dV: it runs while the warpgroup fences and
      // waits at the dS barrier, which no matmul of its own covered when dV was issued before dS^T ----
      const uint32_t s_ds = smem_addr(&s.ds[buf][wg][0][0]) + st_off;
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) stmatrix_x4_trans(s_ds + ks * 16 * 128, ds_frag[ks]);
      issue_dv();
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

      // ---- dQ piece -> s.dq[buffer][wg]; the buffer's dQ writer adds it into the accumulator ----
      mbarrier::wait(&s.dq_empty[dq_buf.stage][wg], dq_buf.phase ^ 1u);  // a fresh barrier counts as released
      stage_dq_piece(reinterpret_cast<char*>(&s.dq[dq_buf.stage][wg][0][0][0]), acc_dq, p.dq_fragment_order, warp,
                     g, t);
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
    store_dk_dv<Element, kHeadDim>(p, e, acc_dk, acc_dv, b, slot, key_row, 0, t);
  }
};

}  // namespace flash4::sm90::bwd
