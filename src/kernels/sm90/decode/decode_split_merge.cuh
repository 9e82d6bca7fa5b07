// The split merge by the last CTA of a 16-row tile: every split CTA writes its normalized partial O and LSE
// (decode_epilogue.cuh), then counts itself on the tile's counter; the CTA that arrives last merges every split's
// part of its rows into out and lse with the math of common/lse_combine.h (the learnable sink folded in). This
// replaces the combine kernel for decode (a kernel after the attention grid costs its launch, the grid's drain and
// its own L2 round trips: 2.4-5 us per call); the 64-row tile keeps the combine kernel, whose many CTAs merge its
// rows faster than one CTA could.
// Memory order: after a CTA barrier, one thread fences (device scope, cumulative over the barrier) and counts the
// CTA's arrival; the last CTA fences after seeing the count and reads the parts through L2 (ld.global.cg), never
// through a stale L1 line.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/lse_combine.h"
#include "common/split_kv.h"
#include "kernels/sm90/decode/decode_config.h"
#include "kernels/sm90/decode/decode_params.h"
#include "kernels/sm90/device_math.cuh"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::decode {

// Which output row a packed CTA row is: query i, head h of sequence b.
struct RowTarget {
  int64_t i, h;
};
__device__ __forceinline__ RowTarget row_target(int packed, int group, int hkv) {
  return {packed / group, int64_t{hkv} * group + packed % group};
}

// The merged LSE of one row over its splits, by one warp: lane l holds the LSEs of splits l, l + 32, ... (-inf
// where a split is absent or empty); common/lse_combine.h's max and sum as warp reductions, the learnable sink
// (`sink`, when `has_sink`) in the denominator. Returns the row's LSE in every lane and each held part's weight.
// A NaN part makes the row NaN (LSE and every weight), as combined_lse does: the max alone would drop it.
template <int kPerLane>
__device__ __forceinline__ float warp_combined_lse(const float (&lse_s)[kPerLane], bool has_sink, float sink,
                                                   float (&weight)[kPerLane]) {
  float m = has_sink ? sink : detail::negative_infinity();
  bool nan = false;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    m = fmaxf(m, lse_s[k]);
    nan = nan || lse_s[k] != lse_s[k];
  }
  m = warp_max(m);
  if (__any_sync(0xffffffffu, nan)) m = __int_as_float(0x7fffffff);  // sum, LSE and weights follow as NaN
  float sum = 0.0f;
  if (m != detail::negative_infinity())
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) sum += expf(lse_s[k] - m);  // exp(-inf) = 0 for absent splits
  const float lse = detail::combined_lse_from_sum(m, warp_sum(sum), has_sink, sink);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) weight[k] = detail::combine_weight(lse_s[k], lse);
  return lse;
}

// Shared memory of the merge, in the pipeline's stages (free once the CTA's own rows are stored): the weight of
// every (row, split) part, (16, kMaxSplits) fp32; each row's merged LSE (16) fp32; the last-arrival flag.
template <class Tile>
struct SplitMergeSmem {
  static_assert(Tile::kBlockM == 16, "the last-CTA merge serves the 16-row tile");
  static constexpr int kOffWeights = 0;
  static constexpr int kOffLse = kOffWeights + 16 * detail::kMaxSplits * 4;
  static constexpr int kOffFlag = kOffLse + 16 * 4;
  static_assert(kOffFlag + 4 <= Tile::kPipeBytes, "the merge's tables fit in the stages");
};

// Called by every thread of a split CTA after its partial O and LSE are stored. Returns at once in all but the
// last CTA of the tile; that one writes out and lse of the tile's rows.
template <class Element, class Tile>
__device__ __forceinline__ void merge_splits_if_last(const DecodeParams& p, unsigned char* smem, int64_t b,
                                                     int64_t q_first, int hkv, int row_tile, int row0,
                                                     int rows_valid) {
  using Smem = SplitMergeSmem<Tile>;
  constexpr int kSplitsPerLane = detail::kMaxSplits / 32;
  constexpr int kQuads = Tile::kHeadDim / 4;  // 4-column pieces per row
  constexpr int kInFlight = 16;               // part loads issued before their sums, per thread
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  int* s_flag = reinterpret_cast<int*>(smem + Smem::kOffFlag);

  __syncthreads();  // every thread's part is stored (and the stages are free)
  if (tid == 0) {
    __threadfence();  // the CTA's part (cumulative over the barrier), before its arrival
    int* counter = p.split_counters + (b * p.kv.attention.heads_kv + hkv) * p.row_tiles + row_tile;
    const bool last = atomicAdd(counter, 1) == p.splits - 1;
    if (last) atomicExch(counter, 0);  // every split has arrived: the counter is left zero for its next use
    *s_flag = last;
  }
  __syncthreads();
  if (*s_flag == 0) return;
  __threadfence();  // every other CTA's part, before the reads below

  const int splits = min(p.splits, detail::kMaxSplits);
  const int64_t batch = p.kv.attention.batch, heads = p.kv.attention.heads, seqlen_q = p.kv.attention.seqlen_q;
  const int64_t part_stride = batch * heads * seqlen_q;  // rows between two splits' parts
  const float* sink = p.kv.attention.learnable_sink;
  float* s_weight = reinterpret_cast<float*>(smem + Smem::kOffWeights);  // (16, kMaxSplits)
  float* s_lse = reinterpret_cast<float*>(smem + Smem::kOffLse);         // (16)

  // One warp per row: lane l reads the LSEs of splits l, l + 32, ...; the row's LSE and each part's weight.
  for (int r = warp; r < rows_valid; r += kThreads / 32) {
    const RowTarget to = row_target(row0 + r, p.group, hkv);
    const int64_t at = (b * heads + to.h) * seqlen_q + to.i;
    float lse_s[kSplitsPerLane], weight[kSplitsPerLane];
#pragma unroll
    for (int k = 0; k < kSplitsPerLane; ++k) {
      const int s = lane + 32 * k;
      lse_s[k] = s < splits ? __ldcg(p.lse_partial + s * part_stride + at) : detail::negative_infinity();
    }
    const float lse = warp_combined_lse(lse_s, sink != nullptr, sink != nullptr ? sink[to.h] : 0.0f, weight);
#pragma unroll
    for (int k = 0; k < kSplitsPerLane; ++k)
      if (lane + 32 * k < splits) s_weight[r * detail::kMaxSplits + lane + 32 * k] = weight[k];
    if (lane == 0) s_lse[r] = lse;
  }
  __syncthreads();

  // out = sum_s weight_s o_s per (row, 4 columns) piece. With fewer pieces than threads, `per` consecutive lanes
  // (a power of two) share a piece, each summing every per-th split, and add up with shuffles.
  const int pieces = rows_valid * kQuads;
  int per = 1;
  while (per < 32 && pieces * per * 2 <= kThreads) per *= 2;
  for (int t0 = 0; t0 < pieces * per; t0 += kThreads) {  // uniform across the CTA: every lane reaches the shuffles
    const int t = t0 + tid, piece = t / per, part = t % per;
    const bool active = t < pieces * per;
    const int row = active ? piece / kQuads : 0, col = piece % kQuads * 4;
    const RowTarget to = row_target(row0 + row, p.group, hkv);
    const int64_t at = (b * heads + to.h) * seqlen_q + to.i;
    const float* o = p.o_partial + at * Tile::kHeadDim + col;  // split s at s * part_stride * kHeadDim
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active)
      for (int s0 = part; s0 < splits; s0 += per * kInFlight) {
        float w[kInFlight];
        float4 x[kInFlight];
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) {
          const int s = s0 + j * per;
          w[j] = s < splits ? s_weight[row * detail::kMaxSplits + s] : 0.0f;
          x[j] = w[j] != 0.0f ? __ldcg(reinterpret_cast<const float4*>(o + s * part_stride * Tile::kHeadDim))
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // an empty split's part is never read
        }
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) {
          acc.x += w[j] * x[j].x;
          acc.y += w[j] * x[j].y;
          acc.z += w[j] * x[j].z;
          acc.w += w[j] * x[j].w;
        }
      }
    for (int d = per / 2; d > 0; d /= 2) {
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, d);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, d);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, d);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, d);
    }
    if (!active || part != 0) continue;
    if (col < p.head_dim) {  // columns past d are a wider kernel's zero padding
      Element* dst = static_cast<Element*>(p.out) + b * p.out_stride_b + (q_first + to.i) * p.out_stride_s +
                     to.h * p.out_stride_h + col;
      *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<Element>(acc.x, acc.y), pack2<Element>(acc.z, acc.w));
    }
    if (col == 0 && p.lse != nullptr)
      p.lse[b * p.lse_stride_b + to.h * p.lse_stride_h + q_first + to.i] = s_lse[row];
  }
}

}  // namespace flash4::sm90::decode
