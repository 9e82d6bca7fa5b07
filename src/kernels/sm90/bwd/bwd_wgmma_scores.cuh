// The element-wise pass of the wgmma backward kernels on their 64 x kBlockM S^T / dP^T accumulators: P^T, dS^T and
// the mask (shared by bwd_wgmma_kernel.cuh and bwd_wgmma_roles_kernel.cuh).
#pragma once

#include <type_traits>

#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/device_math.cuh"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::bwd {

// Element i of the 64 x kBlockM accumulators is key key_row + 8 ((i / 2) % 2), query m0 + 8 (i / 4) + 2 t + (i % 2).
// Zeroes the elements the mask (or the key tail) hides. A separate pass that callers run only on tiles the mask
// cuts (one branch per tile, tile_needs_mask): a per-element `if (need_mask)` around the exps compiled to two
// branches per element on every tile, which slowed the masked kernel. A select, not a product, so a
// hidden element's overflowed exp (inf, or NaN in dS) becomes 0 too.
// `p`: the launch's BwdParams, or the item's entry in a packed launch (bwd_schedule.h, BwdSequence).
template <int kBlockM, bool kMasked, class Shape>
__device__ __forceinline__ void apply_mask(const Shape& p, float (&acc)[kBlockM / 2], int key_row, int m0, int t) {
  // j - q of element i is (key_row - m0 - 2 t) + c_i with c_i = 8 ((i / 2) % 2) - 8 (i / 4) - i % 2 a constant:
  // the band test becomes two compares of an immediate against per-tile bounds.
  // The bounds in 64 bits, clamped to +-2^20 (|c_i| < kBlockM + 8): band_lo - diff0 can leave int32.
  const long long diff0 = static_cast<long long>(key_row) - m0 - 2 * t;
  const int lo = static_cast<int>(max(min(p.band_lo - diff0, 1ll << 20), -(1ll << 20)));
  const int hi = static_cast<int>(max(min(p.band_hi - diff0, 1ll << 20), -(1ll << 20)));
  const bool key_in[2] = {key_row < p.seqlen_k, key_row + 8 < p.seqlen_k};
#pragma unroll
  for (int i = 0; i < kBlockM / 2; ++i) {
    const int c = 8 * ((i / 2) % 2) - 8 * (i / 4) - i % 2;
    bool visible = key_in[(i / 2) % 2];
    if constexpr (kMasked) visible = visible && c >= lo && c <= hi;
    acc[i] = visible ? acc[i] : 0.0f;
  }
}

// The two per-query values (LSE * log2e or D) of accumulator columns 8 jn + 2 t and + 1, from a Q tile's row
// array in shared memory.
__device__ __forceinline__ float2 row_pair(const float* rows, int jn, int t) {
  return *reinterpret_cast<const float2*>(&rows[8 * jn + 2 * t]);
}

// One pass: P^T = exp2(score * log2e - LSE * log2e) into acc_s and dS^T = P^T (dP^T - D) [* (1 - tanh^2) with
// softcap, score = cap tanh(S scale / cap)] into acc_dp, in place (lse_log2 / dsum: the Q tile's kBlockM rows);
// then, on tiles the mask cuts, both masked.
template <int kBlockM, bool kMasked, bool kSoftcap, class Entry>
__device__ __forceinline__ void probs_and_dscores(const BwdParams& p, const Entry& e, const float* lse_log2,
                                                  const float* dsum,
                                                  float (&acc_s)[kBlockM / 2], float (&acc_dp)[kBlockM / 2],
                                                  bool need_mask, int key_row, int m0, int t) {
#pragma unroll
  for (int jn = 0; jn < kBlockM / 8; ++jn) {
    const float2 lse2 = row_pair(lse_log2, jn, t);
    const float2 dsum2 = row_pair(dsum, jn, t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * jn + e;
      float score_log2, dscore = 1.0f;
      if constexpr (kSoftcap) {
        const float th = tanh_accurate(acc_s[i] * p.tanh_scale);
        score_log2 = p.log2_scale * th;
        dscore = 1.0f - th * th;
      } else {
        score_log2 = acc_s[i] * p.log2_scale;
      }
      const float prob = exp2f(score_log2 - ((e & 1) ? lse2.y : lse2.x));
      acc_s[i] = prob;
      const float ds = prob * (acc_dp[i] - ((e & 1) ? dsum2.y : dsum2.x));
      acc_dp[i] = kSoftcap ? ds * dscore : ds;
    }
  }
  if (need_mask) {
    apply_mask<kBlockM, kMasked>(e, acc_s, key_row, m0, t);
    apply_mask<kBlockM, kMasked>(e, acc_dp, key_row, m0, t);
  }
}

// A 64 x kBlockM fp32 accumulator -> the 16-bit A fragments of a wgmma with k = kBlockM (k-step j takes elements
// 8j .. 8j + 7 in order: the accumulator layout is the A fragment layout).
template <class Element, int kBlockM>
__device__ __forceinline__ void to_a_fragments(const float (&acc)[kBlockM / 2], uint32_t (&frag)[kBlockM / 16][4]) {
#pragma unroll
  for (int j = 0; j < kBlockM / 16; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) frag[j][r] = pack2<Element>(acc[8 * j + 2 * r], acc[8 * j + 2 * r + 1]);
}

// The epilogue of one key-row accumulator (dK or dV: 64 keys x kCols columns from col0, accumulator layout:
// element i is key key_row + 8 ((i / 2) % 2), column col0 + 8 (i / 4) + 2 t + (i % 2)), times `scale`, written once
// from registers, a quad of lanes 16 contiguous bytes; keys past seqlen_k and columns past the tensor's true
// width `width` (a zero-padded head dim, head_dims.h; a multiple of 8, so 8-column blocks are whole) are skipped.
// Keys are counted in entry e (BwdParams itself in a dense launch), whose rows start at e.k_offset. One address
// per row and the column blocks as immediate offsets: per store, address arithmetic and a bounds branch cost
// more instructions than the store itself, in code that short items run often.
template <class Element, int kCols, class Entry>
__device__ __forceinline__ void store_key_rows(const Entry& e, void* base, const BshdStrides& stride,
                                               const float (&acc)[kCols / 2], float scale, int b, int hkv,
                                               int key_row, int col0, int width, int t) {
  Element* g = static_cast<Element*>(base) + (e.packed_k ? 0 : b) * stride.batch + hkv * stride.head + col0 + 2 * t;
  const bool all_columns = col0 + kCols <= width;
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // keys key_row and key_row + 8: elements 4 c + 2 r, + 1 of column block c
    const int j = key_row + 8 * r;
    if (j >= e.seqlen_k) continue;
    Element* row = g + (e.k_offset + j) * stride.seq;
#pragma unroll
    for (int c = 0; c < kCols / 8; ++c) {
      if (!all_columns && col0 + 8 * c >= width) continue;
      const float x = acc[4 * c + 2 * r] * scale, y = acc[4 * c + 2 * r + 1] * scale;
      if constexpr (std::is_same_v<Element, float>) {  // a split group's fp32 partial
        *reinterpret_cast<float2*>(row + 8 * c) = make_float2(x, y);
      } else {
        *reinterpret_cast<uint32_t*>(row + 8 * c) = pack2<Element>(x, y);
      }
    }
  }
}

// The dK or dV rows of the work item in kv slot `slot` (bwd_schedule.h, GroupPart): into the output `out` when the
// item has its whole GQA group, else into its part's fp32 partial (bwd_group_reduce.cuh sums the parts).
template <class Element, int kCols, class Entry>
__device__ __forceinline__ void store_item_key_rows(const BwdParams& p, const Entry& e, void* out,
                                                    const BshdStrides& stride, float* partial,
                                                    const float (&acc)[kCols / 2], float scale, int b, int slot,
                                                    int key_row, int col0, int width, int t) {
  const GroupPart gp = group_part(p, slot);
  if (p.group_parts == 1) {
    store_key_rows<Element, kCols>(e, out, stride, acc, scale, b, gp.hkv, key_row, col0, width, t);
  } else {
    store_key_rows<float, kCols>(e, partial + gp.part * partial_part_elements(p, width), partial_strides(p, width),
                                 acc, scale, b, gp.hkv, key_row, col0, width, t);
  }
}

// dK = softmax_scale * acc_dk and dV = acc_dv (store_item_key_rows).
template <class Element, int kCols, class Entry>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const Entry& e, const float (&acc_dk)[kCols / 2],
                                            const float (&acc_dv)[kCols / 2], int b, int slot, int key_row, int col0,
                                            int t) {
  store_item_key_rows<Element, kCols>(p, e, p.dk, p.dk_stride, p.dk_partial, acc_dk, p.softmax_scale, b, slot,
                                      key_row, col0, p.head_dim, t);
  store_item_key_rows<Element, kCols>(p, e, p.dv, p.dv_stride, p.dv_partial, acc_dv, 1.0f, b, slot, key_row, col0,
                                      p.head_dim_v, t);
}

}  // namespace flash4::sm90::bwd
