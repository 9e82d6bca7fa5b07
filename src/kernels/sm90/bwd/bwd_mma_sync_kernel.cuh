// The backward main kernel on mma.sync (FlashAttention-2 structure): the GPU backward for head_dim 256, and for
// d = 64 / 128 where the wgmma kernel (bwd_wgmma_kernel.cuh) does not run (seqlen_k <= 64, layouts TMA cannot
// describe). Each CTA owns one K/V tile of kBlockN keys of one (batch, kv head) and one column slice of the
// outputs, and loops over every query head of its GQA group and every Q tile that can see the keys (mask-aware
// range; fully masked tiles are skipped):
//
//   S^T  = K Q^T                     (kBlockN x kBlockM, fp32 registers; warp w owns keys 16w .. 16w+15)
//   dP^T = V dO^T                    (same layout)
//   P^T  = exp2(S^T * scale * log2e - LSE_i * log2e)  masked to 0; dS^T = P^T (dP^T - D_i) [* (1 - tanh^2)]
//   dV  += P^T dO,  dK += dS^T Q     (fp32 registers for the whole CTA; A operand straight from registers)
//   dQ  += dS K                      (dS^T through shared memory; warp w owns queries 16w .. 16w+15; fp32 atomics
//                                     into the (b, h, sq, d) accumulator, in semaphore order when deterministic)
//
// Column slices: dV, dK and dQ are computed for kCols = min(d, 128) head-dim columns per CTA (the slice is the
// fastest part of blockIdx.x). At d = 256 the dK + dV accumulators of all 256 columns would be 256 fp32 registers
// per thread; two CTAs per K/V tile, one per 128-column half, keep them at the d = 128 level. Both recompute
// S^T and dP^T over the full head dim (7/5 of the FLOPs of one CTA doing everything); their dQ columns are
// disjoint, so in deterministic mode each slice orders its own additions with its own semaphores.
//
// dK (times softmax_scale) and dV are written once at the end: no atomics on dK/dV, even for GQA, because the
// CTA itself loops over the query heads that share its K/V head.
//
// Where the operands live (kHeadDim = d, tiles of 64 x 64, padded shared rows so ldmatrix is conflict free):
//   K, V       shared (loaded once per CTA, cp.async), read by ldmatrix as the A operand of S^T / dP^T and the
//              B operand of dQ
//   Q, dO      shared, double buffered (cp.async of tile it+1 overlaps the math of tile it); B operands
//   LSE, D     shared, 64 floats each per buffer
//   dS^T       shared, 64 x 64 Element
// Shared-memory reads per Q tile (bytes, each warp reads what it needs; c = kCols): S^T/dP^T: K, V slices
// (2 * 16 d * 2) and all of Q, dO (2 * 64 d * 2) per warp; dV/dK: Q, dO columns again (2 * 64 c * 2) per warp;
// dQ: dS (64 * 16 * 2) and K's columns (64 c * 2) per warp. For d = 128: 4 warps * (8 + 32 + 32 + 2 + 16) KB =
// 360 KB per 64 x 64 tile of 5 * 2 * 64 * 64 * 128 = 5.2 MFLOP (14.5 FLOP per shared byte; the wgmma kernel is
// what fixes this). d = 256 runs 1 CTA per SM (208 KB of shared memory), 4 warps: a correctness path first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"  // tile_visible
#include "kernels/sm90/bwd/bwd_warp_ops.cuh"
#include "kernels/sm90/device_math.cuh"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::bwd {

// Tile configuration shared by the kernel and its launch.
template <int kHeadDim_>
struct MmaSyncTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;  // queries per iteration (16 per warp in the dQ product)
  static constexpr int kBlockN = 64;  // keys per CTA (16 per warp in S^T, dP^T, dK, dV)
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static_assert(kBlockM == 16 * kWarps && kBlockN == 16 * kWarps, "each warp owns 16 rows in both products");
  static_assert(kHeadDim % 64 == 0, "dQ is computed in column chunks of 64");
  // Output columns (of dK, dV, dQ) per CTA: the accumulators hold 2 * (kCols / 8) * 4 fp32 per thread.
  static constexpr int kCols = kHeadDim < 128 ? kHeadDim : 128;
  static constexpr int kColSlices = kHeadDim / kCols;  // CTAs per K/V tile (blockIdx.x = n_block * slices + slice)
  static_assert(kHeadDim % kCols == 0 && kCols % 64 == 0, "whole dQ chunks per slice");
  // Rows padded by 16 bytes: 8 consecutive rows start 16 bytes apart modulo 128, so every 8-row ldmatrix phase
  // and every 16-byte cp.async quarter-warp hit 32 distinct banks.
  static constexpr int kLd = kHeadDim + 8;   // elements per shared row of K, V, Q, dO
  static constexpr int kLdS = kBlockM + 8;   // elements per shared row of dS^T
  static constexpr int kTileBytes = kBlockN * kLd * 2;
  static_assert(kBlockM == kBlockN, "Q/dO and K/V tiles share kTileBytes");
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kTileBytes;
  static constexpr int kOffQ = kOffV + kTileBytes;       // [2] buffers
  static constexpr int kOffDo = kOffQ + 2 * kTileBytes;  // [2] buffers
  static constexpr int kOffDs = kOffDo + 2 * kTileBytes;
  static constexpr int kOffLse = kOffDs + kBlockN * kLdS * 2;  // float[2][kBlockM]
  static constexpr int kOffD = kOffLse + 2 * kBlockM * 4;     // float[2][kBlockM]
  static constexpr int kSmemBytes = kOffD + 2 * kBlockM * 4;  // d = 64: 65.5 KB, 128: 112 KB, 256: 208 KB
  static_assert(kSmemBytes <= 232448, "the per-block opt-in maximum of sm_90");
  // Register budget: dK + dV accumulators are 2 * (kCols / 8) * 4 fp32 per thread (128 at d = 128 and 256),
  // plus S^T and dP^T (64). Three CTAs per SM at d = 64 (170 registers), two at d = 128 (255), one at d = 256
  // (255: shared memory allows no second CTA).
  static constexpr int kMinBlocksPerSm = kHeadDim <= 64 ? 3 : kHeadDim <= 128 ? 2 : 1;
  static_assert(kMinBlocksPerSm * (kSmemBytes + 1024) <= 233472, "shared memory for the CTAs per SM");
};

// Copies rows [row0, row0 + 64) of one (batch, head) slice into a padded shared tile; rows >= row_end are
// zero-filled (so tail scores are finite and tail products vanish).
template <class Element, class Tile>
__device__ __forceinline__ void load_tile_async(uint32_t s_tile, const Element* g_rows, int64_t row_stride, int row0,
                                                int row_end) {
  constexpr int kChunksPerRow = Tile::kHeadDim / 8;           // 16-byte chunks
  constexpr int kRowsPerPass = Tile::kThreads / kChunksPerRow;  // rows the CTA copies per pass
  static_assert(Tile::kThreads % kChunksPerRow == 0 && Tile::kBlockN % kRowsPerPass == 0, "whole rows per pass");
  const int tid = static_cast<int>(threadIdx.x);
  const int r0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
  // One source pointer advanced by a pass per step: per-chunk addresses hoisted out of the main loop cost 168
  // bytes of spills at d = 256 (16 chunks per thread) and 24 at d = 128.
  const Element* src = g_rows + static_cast<int64_t>(row0 + r0) * row_stride + col;
  const int64_t pass_stride = kRowsPerPass * row_stride;
#pragma unroll
  for (int k = 0; k < Tile::kBlockN / kRowsPerPass; ++k, src += pass_stride) {
    const int r = r0 + k * kRowsPerPass;
    const bool valid = row0 + r < row_end;
    cp_async_16(s_tile + (r * Tile::kLd + col) * 2, valid ? src : g_rows, valid ? 16 : 0);
  }
}

template <class Element, int kHeadDim, bool kMasked>
__global__ void __launch_bounds__(MmaSyncTile<kHeadDim>::kThreads, MmaSyncTile<kHeadDim>::kMinBlocksPerSm)
    bwd_mma_sync_kernel(const __grid_constant__ BwdParams p) {
  using Tile = MmaSyncTile<kHeadDim>;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kLd = Tile::kLd, kLdS = Tile::kLdS;
  constexpr int kCols = Tile::kCols;
  constexpr int kColTiles = kCols / 8;  // n8 tiles across this CTA's output columns

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_base = smem_addr(smem);
  const uint32_t s_k = s_base + Tile::kOffK, s_v = s_base + Tile::kOffV, s_ds = s_base + Tile::kOffDs;
  float* s_lse = reinterpret_cast<float*>(smem + Tile::kOffLse);  // [2][kBlockM] LSE * log2e
  float* s_dsum = reinterpret_cast<float*>(smem + Tile::kOffD);   // [2][kBlockM] D

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int n_block = static_cast<int>(blockIdx.x) / Tile::kColSlices, hkv = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const int slice = static_cast<int>(blockIdx.x) % Tile::kColSlices;
  const int n0 = n_block * kBlockN;
  const int col0 = slice * kCols;  // first output column of this CTA

  // Q tiles that can see this K/V tile: an interval [m_lo, m_hi] (the band is monotone in both indices).
  int m_lo, m_hi;
  {
    const long long j0 = n0, j1 = min(n0 + kBlockN, p.seqlen_k) - 1;
    const long long lo_rows = j0 - p.band_hi;  // first visible tile holds a row i >= j0 - band_hi
    const long long hi_rows = j1 - p.band_lo;  // last visible tile starts at a row i <= j1 - band_lo
    m_lo = lo_rows <= 0 ? 0 : static_cast<int>(min(lo_rows / kBlockM, static_cast<long long>(p.m_blocks)));
    m_hi = hi_rows < 0 ? -1 : static_cast<int>(min(hi_rows / kBlockM, static_cast<long long>(p.m_blocks) - 1));
    while (m_lo <= m_hi && !tile_visible<Tile>(p, m_lo, n_block)) ++m_lo;  // clipped last tile
    while (m_hi >= m_lo && !tile_visible<Tile>(p, m_hi, n_block)) --m_hi;
  }
  const int m_count = max(m_hi - m_lo + 1, 0);
  const int iterations = p.group * m_count;  // (query head of the group, Q tile), head-major

  const Element* g_k = static_cast<const Element*>(p.k) + b * p.k_stride.batch + hkv * p.k_stride.head;
  const Element* g_v = static_cast<const Element*>(p.v) + b * p.v_stride.batch + hkv * p.v_stride.head;
  load_tile_async<Element, Tile>(s_k, g_k, p.k_stride.seq, n0, p.seqlen_k);
  load_tile_async<Element, Tile>(s_v, g_v, p.v_stride.seq, n0, p.seqlen_k);

  // Issues the loads of iteration `it` into buffer `buf`: Q and dO by cp.async, LSE and D by plain loads (made
  // visible by the __syncthreads that precedes their use).
  auto load_q_tile = [&](int it, int buf) {
    const int h = hkv * p.group + it / m_count;
    const int m0 = (m_lo + it % m_count) * kBlockM;
    const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head;
    const Element* g_do = static_cast<const Element*>(p.dout) + b * p.dout_stride.batch + h * p.dout_stride.head;
    load_tile_async<Element, Tile>(s_base + Tile::kOffQ + buf * Tile::kTileBytes, g_q, p.q_stride.seq, m0,
                                   p.seqlen_q);
    load_tile_async<Element, Tile>(s_base + Tile::kOffDo + buf * Tile::kTileBytes, g_do, p.dout_stride.seq, m0,
                                   p.seqlen_q);
    const int64_t row0 = (static_cast<int64_t>(b) * p.heads + h) * p.seqlen_q;
    const int r = tid % kBlockM, i = m0 + r;
    if (tid < kBlockM) {
      s_lse[buf * kBlockM + r] = i < p.seqlen_q ? p.lse_log2[row0 + i] : __int_as_float(0x7f800000);  // +inf: P = 0
    } else {
      s_dsum[buf * kBlockM + r] = i < p.seqlen_q ? p.dsum[row0 + i] : 0.0f;
    }
  };

  if (iterations > 0) load_q_tile(0, 0);
  cp_async_commit();

  float acc_dk[kColTiles][4], acc_dv[kColTiles][4];  // rows: keys 16 warp + g (+8); cols: col0 + 8 nt + 2t
#pragma unroll
  for (int nt = 0; nt < kColTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nt][e] = acc_dv[nt][e] = 0.0f;

  // Lane offsets (elements) of the ldmatrix row addresses; see bwd_warp_ops.cuh for the fragment layouts.
  const int lane_row = lane & 7;
  const int lane_hi8 = 8 * ((lane >> 3) & 1);  // matrix index bit 0 -> +8
  const int lane_hi16 = 8 * (lane >> 4);        // matrix index bit 1 -> +8
  // A (row major, rows = this warp's 16 keys) from K or V: rows + bit0, cols + bit1.
  const uint32_t off_a_kv = ((16 * warp + lane_row + lane_hi8) * kLd + lane_hi16) * 2;
  // B (non-trans, stored [n][k]) from Q or dO rows: rows + bit1, cols + bit0.
  const uint32_t off_b_rows = ((lane_row + lane_hi16) * kLd + lane_hi8) * 2;
  // B (trans, stored [k][n]) from Q, dO or K, from this CTA's first output column: rows + bit0, cols + bit1.
  const uint32_t off_b_trans = ((lane_row + lane_hi8) * kLd + col0 + lane_hi16) * 2;
  // A (trans, stored [k][m]) from dS^T, this warp's 16 queries: rows + bit1, cols + bit0.
  const uint32_t off_a_ds = ((lane_row + lane_hi16) * kLdS + 16 * warp + lane_hi8) * 2;

  const bool softcap = p.softcap > 0.0f;

  for (int it = 0; it < iterations; ++it) {
    const int buf = it & 1;
    if (it + 1 < iterations) load_q_tile(it + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // everything but the group just committed: K, V and this iteration's Q, dO
    __syncthreads();

    const int h = hkv * p.group + it / m_count;
    const int m_block = m_lo + it % m_count;
    const int m0 = m_block * kBlockM;
    const uint32_t s_q = s_base + Tile::kOffQ + buf * Tile::kTileBytes;
    const uint32_t s_do = s_base + Tile::kOffDo + buf * Tile::kTileBytes;

    // ---- S^T = K Q^T and dP^T = V dO^T: (16 keys of this warp) x (64 queries), k = head dim ----
    float acc_s[8][4], acc_dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt][e] = acc_dp[nt][e] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kHeadDim / 16; ++kc) {
      uint32_t a_k[4], a_v[4];
      ldsm_x4(s_k + off_a_kv + kc * 32, a_k);
      ldsm_x4(s_v + off_a_kv + kc * 32, a_v);
#pragma unroll
      for (int np = 0; np < 4; ++np) {  // pairs of n8 tiles: queries 16 np .. 16 np + 15
        uint32_t b_q[4], b_do[4];
        const uint32_t off = off_b_rows + (np * 16 * kLd + kc * 16) * 2;
        ldsm_x4(s_q + off, b_q);
        ldsm_x4(s_do + off, b_do);
        mma_16816<Element>(acc_s[2 * np], a_k, b_q[0], b_q[1]);
        mma_16816<Element>(acc_s[2 * np + 1], a_k, b_q[2], b_q[3]);
        mma_16816<Element>(acc_dp[2 * np], a_v, b_do[0], b_do[1]);
        mma_16816<Element>(acc_dp[2 * np + 1], a_v, b_do[2], b_do[3]);
      }
    }

    // ---- P^T and dS^T, element-wise; masks only where the tile is cut by the band or the key tail ----
    const bool need_mask = tile_needs_mask<kBlockM, kBlockN, kMasked>(p, m0, n0);
    const float* lse_buf = s_lse + buf * kBlockM;
    const float* dsum_buf = s_dsum + buf * kBlockM;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int col = 8 * nt + 2 * t;  // query within the tile of c0 / c2; +1 for c1 / c3
      const float2 lse2 = *reinterpret_cast<const float2*>(lse_buf + col);
      const float2 dsum = *reinterpret_cast<const float2*>(dsum_buf + col);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = acc_s[nt][e];
        float score_log2, dscore = 1.0f;
        if (softcap) {
          const float th = tanh_accurate(x * p.tanh_scale);
          score_log2 = p.log2_scale * th;
          dscore = 1.0f - th * th;
        } else {
          score_log2 = x * p.log2_scale;
        }
        float prob = exp2f(score_log2 - ((e & 1) ? lse2.y : lse2.x));
        if (need_mask) {
          const int j = n0 + 16 * warp + g + 8 * (e >> 1);
          const int i = m0 + col + (e & 1);
          bool visible = j < p.seqlen_k;
          if constexpr (kMasked) visible = visible && j - i >= p.band_lo && j - i <= p.band_hi;
          if (!visible) prob = 0.0f;
        }
        acc_s[nt][e] = prob;
        acc_dp[nt][e] = prob * (acc_dp[nt][e] - ((e & 1) ? dsum.y : dsum.x)) * dscore;
      }
    }

    // Accumulators -> A fragments (k = queries): n8 tiles 2kk and 2kk+1 form the k16 chunk kk.
    uint32_t a_p[4][4], a_ds[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      a_p[kk][0] = pack2<Element>(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      a_p[kk][1] = pack2<Element>(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      a_p[kk][2] = pack2<Element>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      a_p[kk][3] = pack2<Element>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
      a_ds[kk][0] = pack2<Element>(acc_dp[2 * kk][0], acc_dp[2 * kk][1]);
      a_ds[kk][1] = pack2<Element>(acc_dp[2 * kk][2], acc_dp[2 * kk][3]);
      a_ds[kk][2] = pack2<Element>(acc_dp[2 * kk + 1][0], acc_dp[2 * kk + 1][1]);
      a_ds[kk][3] = pack2<Element>(acc_dp[2 * kk + 1][2], acc_dp[2 * kk + 1][3]);
    }

    // dS^T to shared memory for the dQ product: row = key (16 warp + g, +8), col = query (16 kk + 2t, +8).
    {
      uint32_t* s_ds_rows = reinterpret_cast<uint32_t*>(smem + Tile::kOffDs);
      const int row = 16 * warp + g;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int col = 16 * kk + 2 * t;
        s_ds_rows[(row * kLdS + col) / 2] = a_ds[kk][0];
        s_ds_rows[((row + 8) * kLdS + col) / 2] = a_ds[kk][1];
        s_ds_rows[(row * kLdS + col + 8) / 2] = a_ds[kk][2];
        s_ds_rows[((row + 8) * kLdS + col + 8) / 2] = a_ds[kk][3];
      }
    }

    // ---- dV += P^T dO, dK += dS^T Q: (16 keys) x kCols, k = 64 queries; B from [query][dim] rows (trans) ----
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int dn = 0; dn < kCols / 16; ++dn) {
        const uint32_t off = off_b_trans + (kk * 16 * kLd + dn * 16) * 2;
        uint32_t b_do[4], b_q[4];
        ldsm_x4_trans(s_do + off, b_do);
        ldsm_x4_trans(s_q + off, b_q);
        mma_16816<Element>(acc_dv[2 * dn], a_p[kk], b_do[0], b_do[1]);
        mma_16816<Element>(acc_dv[2 * dn + 1], a_p[kk], b_do[2], b_do[3]);
        mma_16816<Element>(acc_dk[2 * dn], a_ds[kk], b_q[0], b_q[1]);
        mma_16816<Element>(acc_dk[2 * dn + 1], a_ds[kk], b_q[2], b_q[3]);
      }
    }
    __syncthreads();  // dS^T complete

    // ---- dQ += dS K: (16 queries of this warp) x kCols, k = 64 keys; atomics into the fp32 accumulator ----
    int* semaphore = nullptr;
    if (p.deterministic) {
      // CTAs of this column slice add into this (b, h, Q tile) in increasing n_block order: wait for the visible
      // tiles before ours. Slices write disjoint columns and count on separate (b, h, m_blocks) arrays.
      semaphore = p.semaphores + ((static_cast<int64_t>(slice) * p.batch + b) * p.heads + h) * p.m_blocks + m_block;
      if (tid == 0) {
        int expected = 0;
        for (int n = 0; n < n_block; ++n) expected += tile_visible<Tile>(p, m_block, n) ? 1 : 0;
        while (ld_acquire_gpu(semaphore) != expected) __nanosleep(64);
      }
      __syncthreads();
    }
    const int q_row = m0 + 16 * warp + g;  // rows q_row (c0, c1) and q_row + 8 (c2, c3)
    float* g_dq = p.dq_accum + ((static_cast<int64_t>(b) * p.heads + h) * p.seqlen_q) * kHeadDim + col0 + 2 * t;
#pragma unroll
    for (int chunk = 0; chunk < kCols / 64; ++chunk) {  // 64 head-dim columns at a time: 32 registers
      float acc_dq[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t a[4];
        ldsm_x4_trans(s_ds + off_a_ds + kk * 16 * kLdS * 2, a);
#pragma unroll
        for (int dn = 0; dn < 4; ++dn) {
          uint32_t b_k[4];
          ldsm_x4_trans(s_k + off_b_trans + (kk * 16 * kLd + chunk * 64 + dn * 16) * 2, b_k);
          mma_16816<Element>(acc_dq[2 * dn], a, b_k[0], b_k[1]);
          mma_16816<Element>(acc_dq[2 * dn + 1], a, b_k[2], b_k[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        float* col = g_dq + chunk * 64 + 8 * nt;
        if (q_row < p.seqlen_q)
          atomicAdd(reinterpret_cast<float2*>(col + static_cast<int64_t>(q_row) * kHeadDim),
                    make_float2(acc_dq[nt][0], acc_dq[nt][1]));
        if (q_row + 8 < p.seqlen_q)
          atomicAdd(reinterpret_cast<float2*>(col + static_cast<int64_t>(q_row + 8) * kHeadDim),
                    make_float2(acc_dq[nt][2], acc_dq[nt][3]));
      }
    }
    if (p.deterministic) {
      __syncthreads();  // every warp's additions precede the release
      if (tid == 0) {
        __threadfence();
        red_release_gpu_add(semaphore, 1);
      }
    }
    __syncthreads();  // the next iteration overwrites dS^T and (its prefetch) this iteration's other buffer
  }
  cp_async_wait<0>();

  // ---- dK = scale * sum dS^T Q, dV = sum P^T dO: rows 16 warp + g (+8), cols col0 + 8 nt + 2t ----
  Element* g_dk = static_cast<Element*>(p.dk) + b * p.dk_stride.batch + hkv * p.dk_stride.head + col0 + 2 * t;
  Element* g_dv = static_cast<Element*>(p.dv) + b * p.dv_stride.batch + hkv * p.dv_stride.head + col0 + 2 * t;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = n0 + 16 * warp + g + 8 * half;
    if (j >= p.seqlen_k) continue;
#pragma unroll
    for (int nt = 0; nt < kColTiles; ++nt) {
      *reinterpret_cast<uint32_t*>(g_dk + j * p.dk_stride.seq + 8 * nt) =
          pack2<Element>(acc_dk[nt][2 * half] * p.softmax_scale, acc_dk[nt][2 * half + 1] * p.softmax_scale);
      *reinterpret_cast<uint32_t*>(g_dv + j * p.dv_stride.seq + 8 * nt) =
          pack2<Element>(acc_dv[nt][2 * half], acc_dv[nt][2 * half + 1]);
    }
  }
}

}  // namespace flash4::sm90::bwd
