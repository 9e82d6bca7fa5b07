// The forward's epilogue on one consumer thread's two rows: O / l converted to the output type and stored
// straight from registers, and the LSE. It needs no shared memory, so the producer is already loading the next
// tile's Q and K/V while a consumer finishes this one.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/score_transform.h"
#include "kernels/sm90/fwd/fwd_params.h"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90 {

template <class Traits>
struct FwdEpilogue {
  using OutElement = typename Traits::OutElement;
  using Softmax = typename Traits::Softmax;
  static constexpr int kHeadDimV = Traits::kHeadDimV;  // O's columns

  // The row sums' reciprocals and the LSE of the thread's two rows, once a tile's softmax is complete. A
  // learnable sink joins each row's denominator as one more logit without a value; the common max keeps both
  // terms finite. `log2_scale`: the tile's score transform's (softmax_tile).
  static __device__ __forceinline__ void finish_rows(const FwdParams& p, const Softmax& softmax, float log2_scale,
                                                     int head, float (&inv)[2], float (&lse)[2]) {
    float row_sum[2];
    softmax.finish(row_sum);
    if (p.learnable_sink == nullptr) {  // the common case, without the sink's extra exp2 per row
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool empty = softmax.m_ref[r] == -INFINITY || !(row_sum[r] > 0.0f);
        inv[r] = empty ? 0.0f : 1.0f / row_sum[r];
        lse[r] = empty ? -INFINITY : (softmax.m_ref[r] * log2_scale + __log2f(row_sum[r])) * detail::kLn2;
      }
      return;
    }
    const float sink_log2 = p.learnable_sink[head] * detail::kLog2e;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // A row that saw no unmasked key (m_ref = -inf) has out = 0 and LSE = -inf, or the sink's logit.
      const bool empty = softmax.m_ref[r] == -INFINITY || !(row_sum[r] > 0.0f);
      const float max_log2 = empty ? -INFINITY : softmax.m_ref[r] * log2_scale;  // row_sum is relative to it
      const float top = fmaxf(max_log2, sink_log2);
      if (top == -INFINITY) {
        inv[r] = 0.0f;
        lse[r] = -INFINITY;
        continue;
      }
      const float keys_scale = empty ? 0.0f : exp2f(max_log2 - top);
      const float sum = row_sum[r] * keys_scale + (sink_log2 == -INFINITY ? 0.0f : exp2f(sink_log2 - top));
      inv[r] = keys_scale / sum;
      lse[r] = (top + __log2f(sum)) * detail::kLn2;
    }
  }

  // O = acc_o * inv of the thread's two rows (row0, row0 + 8 of the sequence; rows past seqlen_q are not
  // stored), converted, and their LSE, to global memory. `q_offset`: the sequence's first row in a packed tensor.
  static __device__ __forceinline__ void store_rows(const FwdParams& p, int head, int batch, int64_t q_offset,
                                                    int seqlen_q, const float (&acc_o)[kHeadDimV / 2],
                                                    const float (&inv)[2], const float (&lse)[2], int row0, int lane) {
    // Thread (lane) holds columns 8c + 2 (lane % 4) + {0, 1} of its two rows: a quad writes 16 contiguous bytes
    // per store, and the stores for c and c + 1 complete each 32-byte sector in L2.
    OutElement* out_bh = static_cast<OutElement*>(p.out) + batch * p.out_stride_b + head * p.out_stride_h +
                      q_offset * p.out_stride_s;
    float* lse_bh = p.lse != nullptr ? p.lse + batch * p.lse_stride_b + head * p.lse_stride_h + q_offset : nullptr;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      if (row >= seqlen_q) continue;
      OutElement* out_row = out_bh + static_cast<int64_t>(row) * p.out_stride_s + 2 * (lane % 4);
#pragma unroll
      for (int c = 0; c < kHeadDimV / 8; ++c) {
        // Columns past out's true width (a zero-padded head dim, head_dims.h) are zeros and belong to no tensor.
        // The width is a multiple of 8, so each 8-column block is stored whole or not at all.
        // (A predicate, not a break, so that the loop stays unrolled and acc_o in registers.)
        const int i = 4 * c + 2 * r;
        if (8 * c < p.head_dim_v)
          *reinterpret_cast<uint32_t*>(out_row + 8 * c) = pack2<OutElement>(acc_o[i] * inv[r], acc_o[i + 1] * inv[r]);
      }
      if (lse_bh != nullptr && lane % 4 == 0) lse_bh[row] = lse[r];
    }
  }
};

}  // namespace flash4::sm90
