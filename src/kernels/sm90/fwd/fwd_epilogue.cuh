// The forward's epilogue on one consumer thread's two rows: O / l converted to the input type and stored
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
  using Element = typename Traits::Element;
  using Softmax = typename Traits::Softmax;
  static constexpr int kHeadDim = Traits::kHeadDim;

  // The row sums' reciprocals and the LSE of the thread's two rows, once a tile's softmax is complete.
  static __device__ __forceinline__ void finish_rows(const FwdParams& p, const Softmax& softmax, float (&inv)[2],
                                                     float (&lse)[2]) {
    float row_sum[2];
    softmax.finish(row_sum);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // A row that saw no unmasked key (m_ref = -inf) is defined as out = 0, LSE = -inf.
      const bool empty = softmax.m_ref[r] == -INFINITY || !(row_sum[r] > 0.0f);
      inv[r] = empty ? 0.0f : 1.0f / row_sum[r];
      lse[r] = empty ? -INFINITY : (softmax.m_ref[r] * p.score.log2_scale + __log2f(row_sum[r])) * detail::kLn2;
    }
  }

  // O = acc_o * inv of the thread's two rows (row0, row0 + 8; rows past seqlen_q are not stored), converted, and
  // their LSE, to global memory.
  static __device__ __forceinline__ void store_rows(const FwdParams& p, int head, int batch, int seqlen_q,
                                                    const float (&acc_o)[kHeadDim / 2], const float (&inv)[2],
                                                    const float (&lse)[2], int row0, int lane) {
    // Thread (lane) holds columns 8c + 2 (lane % 4) + {0, 1} of its two rows: a quad writes 16 contiguous bytes
    // per store, and the stores for c and c + 1 complete each 32-byte sector in L2.
    Element* out_bh = static_cast<Element*>(p.out) + batch * p.out_stride_b + head * p.out_stride_h;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      if (row >= seqlen_q) continue;
      Element* out_row = out_bh + static_cast<int64_t>(row) * p.out_stride_s + 2 * (lane % 4);
#pragma unroll
      for (int c = 0; c < kHeadDim / 8; ++c) {
        const int i = 4 * c + 2 * r;
        *reinterpret_cast<uint32_t*>(out_row + 8 * c) = pack2<Element>(acc_o[i] * inv[r], acc_o[i + 1] * inv[r]);
      }
      if (p.lse != nullptr && lane % 4 == 0) p.lse[batch * p.lse_stride_b + head * p.lse_stride_h + row] = lse[r];
    }
  }
};

}  // namespace flash4::sm90
