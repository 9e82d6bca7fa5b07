// Online softmax of one consumer thread's slice of a score tile, with FlashAttention-4's two Hopper-relevant
// tricks: conditional rescaling and a share of exp2 on the FMA pipe.
//
// Register layout (wgmma m64nN accumulator): thread `lane` of warp `w` holds rows 16w + lane/4 (row 0) and
// 16w + lane/4 + 8 (row 1); element i is in row (i / 2) % 2, column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
// A row is spread over the 4 lanes of a quad, so row reductions shuffle across lane bits 0 and 1.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>

#include "common/exp2_poly.h"
#include "common/score_transform.h"

namespace flash4::sm90 {

constexpr float kRescaleThresholdLog2 = 8.0f;  // rescale only when the row max grew by more than 2^8

template <int kBlockN>
struct FwdSoftmax {
  static constexpr int kValues = kBlockN / 2;  // accumulator registers per thread

  float m_ref[2] = {-INFINITY, -INFINITY};  // reference max of each row (before log2_scale)
  float l_part[2] = {0.0f, 0.0f};           // this thread's partial row sums, relative to m_ref

  // A fresh state for the thread's rows row0 and row0 + 8 of a sequence of seqlen_q queries. Rows past its end
  // (a last tile's tail: zeros in a dense batch, the next sequence's queries in a packed one) start from a
  // reference max no score reaches, so they never vote in the warp's rescale decision and keep P = 0: the rows
  // that are stored round the same whatever the tail holds (a packed call equals per-sequence dense calls).
  static __device__ __forceinline__ FwdSoftmax for_rows(int row0, int64_t seqlen_q) {
    FwdSoftmax s;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row0 + 8 * r >= seqlen_q) s.m_ref[r] = FLT_MAX;
    return s;
  }

  // Column of accumulator element i in the tile, relative to the tile's first key.
  static __device__ __forceinline__ int column(int i, int lane) { return 8 * (i / 4) + 2 * (lane % 4) + (i % 2); }

  // Masks keys outside each row's window [lo, hi] (and the tail past seqlen_k, folded into hi).
  static __device__ __forceinline__ void apply_mask(float (&s)[kValues], int key0, const int (&lo)[2],
                                                    const int (&hi)[2], int lane) {
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const int key = key0 + column(i, lane);
      const int r = (i / 2) % 2;
      if (key < lo[r] || key > hi[r]) s[i] = -INFINITY;
    }
  }

  // tanh(s * tanh_scale) in place, the softcapped score before its log2_scale (common/score_transform.h), with
  // tanh(x) = 1 - 2 / (2^(2x log2 e) + 1): absolute error ~1e-7. (tanh.approx, what tanhf becomes under fast math,
  // has 2^-11 relative error: 1.5 % in P at cap 30, and an LSE that the backward's accurate P would not match.)
  static __device__ __forceinline__ void apply_softcap(float (&s)[kValues], float tanh_scale) {
    const float two_log2e_scale = 2.0f * detail::kLog2e * tanh_scale;
#pragma unroll
    for (int i = 0; i < kValues; ++i) s[i] = 1.0f - __fdividef(2.0f, exp2f(s[i] * two_log2e_scale) + 1.0f);
  }

  // Updates the reference max and row sums for a new tile and turns `s` into P (unnormalized probabilities,
  // fp32, in place). Returns the factors by which the caller must rescale its O rows (1 when untouched);
  // `rescaled` is warp-uniform so the O loop never diverges.
  template <int kPolyPer8>
  __device__ __forceinline__ bool step(float (&s)[kValues], float log2_scale, bool conditional, bool use_poly,
                                       float (&factor)[2]) {
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kValues; ++i) row_max[(i / 2) % 2] = fmaxf(row_max[(i / 2) % 2], s[i]);
    bool grows = !conditional;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
      const float m_new = fmaxf(m_ref[r], row_max[r]);
      // From -inf to finite compares as +inf > 8; -inf to -inf gives NaN, which compares false.
      grows |= (m_new - m_ref[r]) * log2_scale > kRescaleThresholdLog2;
      row_max[r] = m_new;
    }
    const bool rescaled = __any_sync(0xffffffffu, grows);
    factor[0] = factor[1] = 1.0f;
    if (rescaled) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (row_max[r] != -INFINITY) {
          factor[r] = exp2f((m_ref[r] - row_max[r]) * log2_scale);  // 0 when m_ref was -inf (O, l are 0)
          m_ref[r] = row_max[r];
          l_part[r] *= factor[r];
        }
      }
    }
    // P = 2^(s * log2_scale - m_ref * log2_scale); a row that has seen only masked keys uses 0 as its max.
    float neg_max_scaled[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_max_scaled[r] = m_ref[r] == -INFINITY ? 0.0f : -m_ref[r] * log2_scale;
    if (kPolyPer8 > 0 && use_poly) {
#pragma unroll
      for (int i = 0; i < kValues; ++i) {
        const int r = (i / 2) % 2;
        const float x = fmaf(s[i], log2_scale, neg_max_scaled[r]);
        s[i] = (i % 8) < kPolyPer8 ? exp2_poly(x) : exp2f(x);
        l_part[r] += s[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < kValues; ++i) {
        const int r = (i / 2) % 2;
        s[i] = exp2f(fmaf(s[i], log2_scale, neg_max_scaled[r]));
        l_part[r] += s[i];
      }
    }
    return rescaled;
  }

  // Full row sums (across the quad) at the end of the row.
  __device__ __forceinline__ void finish(float (&row_sum)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_part[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      row_sum[r] = l;
    }
  }
};

}  // namespace flash4::sm90
