// The end of a decode CTA: the warps that shared each 16-row fragment (kWarpsN of them, each over its own keys)
// merge their online-softmax states through shared memory, and the CTA stores its rows:
//   one split:   out (Element) and lse, with the learnable sink folded in by the combine math of
//                common/lse_combine.h (one part plus the sink), so no combine kernel runs;
//   more splits: the normalized partial output and its LSE (fp32); the tile's last split CTA then merges them
//                (decode_split_merge.cuh), or, for the 64-row tile, the combine kernel does.
// Rows of the merge: (kWarps, 16, kMergeLd) fp32 in the pipeline's shared memory (free once every load landed).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/lse_combine.h"
#include "common/score_transform.h"
#include "kernels/sm90/decode/decode_params.h"
#include "kernels/sm90/decode/decode_split_merge.cuh"
#include "kernels/sm90/decode/decode_warp.cuh"

namespace flash4::sm90::decode {

template <class Element, class Tile>
__device__ __forceinline__ void store_rows(const DecodeParams& p, DecodeWarp<Element, Tile>& w, unsigned char* smem,
                                           int64_t b, int64_t q_first, int hkv, int split, int row_tile,
                                           int row0, int rows_valid) {
  constexpr int kLd = Tile::kMergeLd, kWarps = Tile::kWarps, kWarpsN = Tile::kWarpsN;
  float* s_o = reinterpret_cast<float*>(smem + Tile::kOffStages);        // (kWarps, 16, kLd)
  float* s_m = reinterpret_cast<float*>(smem + Tile::kOffStats);         // (kWarps, 16) row max, log2 units
  float* s_l = s_m + kWarps * 16;                                         // (kWarps, 16) row sum
  float* s_w = s_l + kWarps * 16;                                         // (kWarps, 16) weight of each warp's O
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

  w.finish_sums();
  float* my_o = s_o + warp * 16 * kLd;
#pragma unroll
  for (int f = 0; f < Tile::kHeadDim / 8; ++f) {
    *reinterpret_cast<float2*>(my_o + g * kLd + f * 8 + 2 * t) = make_float2(w.o[f][0], w.o[f][1]);
    *reinterpret_cast<float2*>(my_o + (g + 8) * kLd + f * 8 + 2 * t) = make_float2(w.o[f][2], w.o[f][3]);
  }
  if (t == 0) {
    s_m[warp * 16 + g] = w.m[0];
    s_m[warp * 16 + g + 8] = w.m[1];
    s_l[warp * 16 + g] = w.l[0];
    s_l[warp * 16 + g + 8] = w.l[1];
  }
  __syncthreads();

  // One thread per CTA row: the merged max and sum, the row's LSE, and each warp's weight in the merged O.
  const bool direct = p.splits == 1;
  if (tid < Tile::kBlockM) {
    const int fragment = tid / 16, r = tid % 16;
    // A NaN score (NaN in q or in a key) is dropped by the max but makes its warp's sum NaN: the row stays NaN
    // (LSE and weights), as an unsplit row would, instead of passing for a row that saw no key.
    float m = -INFINITY;
    bool nan = false;
    for (int wn = 0; wn < kWarpsN; ++wn) {
      const int at = (fragment * kWarpsN + wn) * 16 + r;
      m = fmaxf(m, s_m[at]);
      nan = nan || s_l[at] != s_l[at];
    }
    float sum = 0.0f;
    if (m != -INFINITY)
      for (int wn = 0; wn < kWarpsN; ++wn) {
        const int at = (fragment * kWarpsN + wn) * 16 + r;
        sum += s_l[at] * exp2f(s_m[at] - m);
      }
    if (nan) sum = __int_as_float(0x7fffffff);
    // Natural-log LSE of the keys this CTA saw; -inf for a row that saw none.
    const float lse_part = nan ? sum : sum > 0.0f ? (m + __log2f(sum)) * detail::kLn2 : -INFINITY;
    float lse = lse_part, weight = nan ? sum : sum > 0.0f ? 1.0f / sum : 0.0f;
    const bool valid = tid < rows_valid;
    const RowTarget to = row_target(row0 + (valid ? tid : 0), p.group, hkv);
    if (direct) {  // the last step of the combine, with one part: the sink only enlarges the denominator
      const float* sink = p.kv.attention.learnable_sink;
      lse = detail::combined_lse(&lse_part, 1, 1, sink != nullptr, sink != nullptr ? sink[to.h] : 0.0f);
      weight *= detail::combine_weight(lse_part, lse);
    }
    for (int wn = 0; wn < kWarpsN; ++wn) {
      const int at = (fragment * kWarpsN + wn) * 16 + r;
      s_w[at] = nan ? sum : sum > 0.0f ? weight * exp2f(s_m[at] - m) : 0.0f;
    }
    if (valid) {
      if (direct) {
        if (p.lse != nullptr) p.lse[b * p.lse_stride_b + to.h * p.lse_stride_h + q_first + to.i] = lse;
      } else {
        const int64_t seqlen_q = p.kv.attention.seqlen_q, heads = p.kv.attention.heads;
        p.lse_partial[((split * p.kv.attention.batch + b) * heads + to.h) * seqlen_q + to.i] = lse;
      }
    }
  }
  __syncthreads();

  // Every valid row, 4 columns per thread and step: the weighted sum of the warps' O.
  constexpr int kQuads = Tile::kHeadDim / 4;
  for (int c = tid; c < Tile::kBlockM * kQuads; c += kThreads) {
    const int row = c / kQuads, col = (c % kQuads) * 4;
    if (row >= rows_valid) break;  // rows ascend with c
    const int fragment = row / 16, r = row % 16;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int wn = 0; wn < kWarpsN; ++wn) {
      const int wi = fragment * kWarpsN + wn;
      const float wt = s_w[wi * 16 + r];
      const float4 x = *reinterpret_cast<const float4*>(s_o + (wi * 16 + r) * kLd + col);
      acc.x += wt * x.x;
      acc.y += wt * x.y;
      acc.z += wt * x.z;
      acc.w += wt * x.w;
    }
    const RowTarget to = row_target(row0 + row, p.group, hkv);
    if (direct) {
      if (col >= p.head_dim) continue;  // the zero padding of a kernel wider than d
      Element* dst = static_cast<Element*>(p.out) + b * p.out_stride_b + (q_first + to.i) * p.out_stride_s +
                     to.h * p.out_stride_h;
      const uint2 bits = make_uint2(pack2<Element>(acc.x, acc.y), pack2<Element>(acc.z, acc.w));
      *reinterpret_cast<uint2*>(dst + col) = bits;
    } else {
      const int64_t seqlen_q = p.kv.attention.seqlen_q, heads = p.kv.attention.heads;
      float* dst = p.o_partial + (((split * p.kv.attention.batch + b) * heads + to.h) * seqlen_q + to.i) *
                                     Tile::kHeadDim;
      *reinterpret_cast<float4*>(dst + col) = acc;
    }
  }
  if constexpr (Tile::kBlockM == 16)
    if (!direct && p.split_counters != nullptr)
      merge_splits_if_last<Element, Tile>(p, smem, b, q_first, hkv, row_tile, row0, rows_valid);
}

}  // namespace flash4::sm90::decode
