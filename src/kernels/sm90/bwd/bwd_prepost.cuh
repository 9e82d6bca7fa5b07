// The backward's preprocess (D = rowsum(dO * O), LSE * log2e, dQ's fp32 accumulator zeroed) and postprocess
// (dQ = accumulator * scale in the input dtype, written with dq's strides). Memory-bound helpers, templated on the
// element type only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_workspace.h"
#include "common/score_transform.h"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::bwd {

inline constexpr int kPrepostThreads = 256;
inline constexpr int kPreLanesPerRow = 16;  // a row of d <= 256 elements: 16 lanes x up to 2 chunks of 8

// One (b, h, i) row per 16 lanes; row index = (b * heads + h) * seqlen_q + i, the workspace layout. The lanes
// also zero the row of dQ's accumulator, and thread 0 the persistent main kernel's work counter if it has one
// (no separate memsets: a launch and a host call less each per backward).
template <class Element>
__global__ void __launch_bounds__(kPrepostThreads) bwd_preprocess_kernel(const __grid_constant__ BwdParams p) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.seqlen_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kPrepostThreads / kPreLanesPerRow) +
                      threadIdx.x / kPreLanesPerRow;
  const int sub = static_cast<int>(threadIdx.x % kPreLanesPerRow);
  const bool valid = row < rows;
  if (p.work_counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *p.work_counter = 0;
  int64_t i = 0, h = 0, b = 0;
  float acc = 0.0f;
  if (valid) {
    i = row % p.seqlen_q;
    const int64_t bh = row / p.seqlen_q;
    h = bh % p.heads;
    b = bh / p.heads;
    const Element* g_do = static_cast<const Element*>(p.dout) + b * p.dout_stride.batch + i * p.dout_stride.seq +
                          h * p.dout_stride.head;
    const Element* g_o =
        static_cast<const Element*>(p.out) + b * p.out_stride.batch + i * p.out_stride.seq + h * p.out_stride.head;
    // 16-byte aligned: dq_accum_cols % 8 == 0
    float4* accum_row = reinterpret_cast<float4*>(p.dq_accum + row * p.dq_accum_cols);
    for (int c = sub; c < p.dq_accum_cols / 4; c += kPreLanesPerRow) accum_row[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c = sub * 8; c < p.head_dim_v; c += kPreLanesPerRow * 8) {  // dO and O: v's head dim
      const uint4 x = *reinterpret_cast<const uint4*>(g_do + c);
      const uint4 y = *reinterpret_cast<const uint4*>(g_o + c);
      const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 a = unpack2<Element>(xs[k]), o = unpack2<Element>(ys[k]);
        acc = fmaf(a.x, o.x, acc);
        acc = fmaf(a.y, o.y, acc);
      }
    }
  }
#pragma unroll
  for (int offset = kPreLanesPerRow / 2; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (valid && sub == 0) {
    p.dsum[row] = acc;
    const float lse = p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i];
    // A fully masked row (LSE = -inf) gets +inf so that exp2(score - lse) = 0 and never inf or NaN.
    p.lse_log2[row] = lse == -__int_as_float(0x7f800000) ? __int_as_float(0x7f800000) : lse * detail::kLog2e;
  }
}

// dsink[h] = -sum over the rows i of head h that take part in an entry (BwdParams::seq: every row of a dense
// batch; whatever the rows in none hold) of exp(sink[h] - LSE_i) * D_i, after the preprocess, in two steps with
// fixed orders and fixed reduction trees, so the result is the same every run (deterministic mode included).
// Step 1, grid (slices, heads): slice s of head h adds up the head's row slots s * 256 + t, stepping by
// slices * 256 (slots: batch * seqlen_q dense, total_q packed), into partial[h * slices + s]. Rows, not entries,
// are the unit of work, so one long sequence and a thousand short ones both spread over the GPU. The number of
// slices: dsink_slices (bwd_workspace.h, which sizes the partials).

__global__ void __launch_bounds__(kPrepostThreads) bwd_dsink_partial_kernel(const __grid_constant__ BwdParams p,
                                                                            float* partial) {
  __shared__ float sums[kPrepostThreads];
  const int h = blockIdx.y, slice = blockIdx.x, slices = gridDim.x;
  const float sink_log2 = p.learnable_sink[h] * detail::kLog2e;
  const bool packed = p.seq.cu_seqlens_q != nullptr;
  const int64_t slots = packed ? p.seq.total_q : static_cast<int64_t>(p.batch) * p.seqlen_q;
  float acc = 0.0f;
  for (int64_t j = static_cast<int64_t>(slice) * kPrepostThreads + threadIdx.x; j < slots;
       j += static_cast<int64_t>(slices) * kPrepostThreads) {
    int64_t row, i;
    detail::SequenceInfo si;
    if (packed) {  // rows of head h: h * total_q + j
      const int64_t b = p.seq.entry_at_q_row(j, p.batch);
      if (b < 0) continue;
      si = p.seq.info(b);
      i = j - si.q_offset;
      row = static_cast<int64_t>(h) * p.seq.total_q + j;
    } else {  // rows of entry b, head h: (b * heads + h) * seqlen_q + i
      const int64_t b = j / p.seqlen_q;
      si = p.seq.info(b);
      i = j - b * p.seqlen_q;
      row = (b * p.heads + h) * p.seqlen_q + i;
    }
    if (i < 0 || i >= si.seqlen_q) continue;  // a row in no entry
    acc += exp2f(sink_log2 - p.lse_log2[row]) * p.dsum[row];  // LSE is finite: it includes the sink
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kPrepostThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[h * slices + slice] = sums[0];
}

// Step 2, one warp per head: lane l adds the slices l, l + 32, ... in order, then a fixed shuffle tree.
__global__ void __launch_bounds__(32) bwd_dsink_sum_kernel(const __grid_constant__ BwdParams p,
                                                           const float* partial, int slices) {
  const int h = blockIdx.x;
  float acc = 0.0f;
  for (int s = threadIdx.x; s < slices; s += 32) acc += partial[h * slices + s];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (threadIdx.x == 0) p.dsink[h] = -acc;
}

// Columns of dQ one postprocess thread writes: 8 (one 16-byte store) from a row-major accumulator, 16 (two) from a
// fragment-order one (the 16 columns of one group: four 16-byte loads, bwd_params.h).
FLASH4_HD int dq_post_columns(const BwdParams& p) { return p.dq_fragment_order ? 16 : 8; }
// Threads per accumulator row: a fragment-order row's padding is read too (its groups are whole).
FLASH4_HD int dq_post_threads_per_row(const BwdParams& p) {
  return (p.dq_fragment_order ? p.dq_accum_cols : p.head_dim) / dq_post_columns(p);
}
FLASH4_HD int64_t dq_post_threads(const BwdParams& p, int64_t rows) { return rows * dq_post_threads_per_row(p); }

// dq[b, i, h, :] = Element(accumulator[b, h, i, :] * softmax_scale), dq_post_columns per thread.
template <class Element>
__device__ __forceinline__ uint4 scaled_pack8(const float (&x)[8], float s) {
  uint4 out;
  out.x = pack2<Element>(x[0] * s, x[1] * s);
  out.y = pack2<Element>(x[2] * s, x[3] * s);
  out.z = pack2<Element>(x[4] * s, x[5] * s);
  out.w = pack2<Element>(x[6] * s, x[7] * s);
  return out;
}
template <class Element>
__global__ void __launch_bounds__(kPrepostThreads) bwd_postprocess_dq_kernel(const __grid_constant__ BwdParams p) {
  const int cols = dq_post_columns(p), per_row = dq_post_threads_per_row(p);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.seqlen_q;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kPrepostThreads + threadIdx.x;
  if (idx >= rows * per_row) return;
  const int64_t row = idx / per_row;
  const int c = static_cast<int>(idx % per_row) * cols;
  const int64_t i = row % p.seqlen_q, bh = row / p.seqlen_q, h = bh % p.heads, b = bh / p.heads;
  Element* dst =
      static_cast<Element*>(p.dq) + b * p.dq_stride.batch + i * p.dq_stride.seq + h * p.dq_stride.head + c;
  const float s = p.softmax_scale;
  if (p.dq_fragment_order) {
    // The 16 columns from c: the unit at column c + 2t holds columns c + 2t, + 1, + 8, + 9 (t = 0..3).
    const float* src = p.dq_accum + row * p.dq_accum_cols;
    float lo[8], hi[8];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const float4 u = *reinterpret_cast<const float4*>(src + dq_fragment_column(c + 2 * t));
      lo[2 * t] = u.x, lo[2 * t + 1] = u.y, hi[2 * t] = u.z, hi[2 * t + 1] = u.w;
    }
    // Columns past the true head dim (a padded kernel's zeros; d is a multiple of 8) are not written.
    if (c < p.head_dim) *reinterpret_cast<uint4*>(dst) = scaled_pack8<Element>(lo, s);
    if (c + 8 < p.head_dim) *reinterpret_cast<uint4*>(dst + 8) = scaled_pack8<Element>(hi, s);
    return;
  }
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + row * p.dq_accum_cols + c);
  const float4 a = src[0], z = src[1];
  const float x[8] = {a.x, a.y, a.z, a.w, z.x, z.y, z.z, z.w};
  *reinterpret_cast<uint4*>(dst) = scaled_pack8<Element>(x, s);
}

}  // namespace flash4::sm90::bwd
