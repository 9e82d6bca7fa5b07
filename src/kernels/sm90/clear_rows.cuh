// Clearing one query row of an attention output: out = 0 for every head (zero bits are +0.0 in bf16 and fp16) and
// LSE = the head's sink or -inf (a row of a sequence without keys sees only its sink; a row in no sequence gets
// -inf). Used by the forward's clearing kernels (fwd_empty.cu) and by the decode kernel for the rows of a packed
// batch that no segment covers (decode_uncovered_rows.cuh). Device only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace flash4::sm90 {

// A 16-bit attention tensor seen as (batch, seqlen, heads, head_dim); a packed one is one batch entry (stride_b 0).
struct RowsView {
  uint16_t* data;
  int64_t stride_b, stride_s, stride_h, head_dim;
};
// The LSE seen as (batch, heads, seqlen); a packed (heads, total_q) one is one batch entry.
struct LseView {
  float* data;  // null = no LSE requested
  int64_t stride_b, stride_h;
};

// Row `row` of batch entry b, every head, by threads `thread` of `threads`. Loops kept rolled: every caller
// clears rows off the hot path.
__device__ __forceinline__ void clear_row(const RowsView& o, const LseView& l, const float* sink, int64_t b,
                                          int64_t row, int64_t heads, int thread, int threads) {
#pragma unroll 1
  for (int64_t i = thread; i < heads * o.head_dim; i += threads) {
    const int64_t h = i / o.head_dim, col = i % o.head_dim;
    o.data[b * o.stride_b + row * o.stride_s + h * o.stride_h + col] = 0;
  }
  if (l.data != nullptr)
#pragma unroll 1
    for (int64_t h = thread; h < heads; h += threads)
      l.data[b * l.stride_b + h * l.stride_h + row] = sink != nullptr ? sink[h] : -INFINITY;
}

}  // namespace flash4::sm90
