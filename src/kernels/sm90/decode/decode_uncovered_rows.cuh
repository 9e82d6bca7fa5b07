// Rows of a packed q that no sequence covers get out 0 and LSE -inf (flash4/api.h), written by the decode kernel
// itself: one CTA per sequence clears the rows between its queries and the next segment's start (a segment longer
// than max_seqlen_q), the last sequence's also those after the last segment. A well-formed batch has none, so this
// costs a check per CTA instead of a clearing kernel per call.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/sm90/decode/decode_config.h"
#include "kernels/sm90/decode/decode_params.h"

namespace flash4::sm90::decode {

// Called by every thread of the CTA of (split 0, KV head 0, row tile 0) of sequence b, whose queries are `span`.
// Offsets are clamped as query_span clamps them, so corrupt device-resident values write nothing out of bounds.
__device__ __forceinline__ void clear_rows_in_no_segment(const DecodeParams& p, int64_t b, const QuerySpan& span) {
  const int64_t batch = p.kv.attention.batch;
  const auto clamp = [&](int64_t x) { return x < 0 ? int64_t{0} : x > p.total_q ? p.total_q : x; };
  const int64_t first = span.first + span.count;
  const int64_t end = b + 1 < batch ? clamp(p.cu_seqlens_q[b + 1]) : p.total_q;
  if (first >= end) return;
  // 32-bit counters: heads * head_dim is below 2^31 (the launch checks batch * seqlen_q * heads < 2^31, d <= 256).
  const int heads = static_cast<int>(p.kv.attention.heads), cols = p.head_dim;
  // Zero bits are +0.0 in bf16 and fp16; out's batch stride is 0 in a packed call (one batch entry).
  uint16_t* out = static_cast<uint16_t*>(p.out);
  // Cold code (no row in a well-formed batch): loops kept rolled, out of the kernel's instruction cache's way.
#pragma unroll 1
  for (int64_t row = first; row < end; ++row) {
#pragma unroll 1
    for (int i = static_cast<int>(threadIdx.x); i < heads * cols; i += kThreads)
      out[row * p.out_stride_s + (i / cols) * p.out_stride_h + i % cols] = 0;
    if (p.lse != nullptr)
      for (int h = static_cast<int>(threadIdx.x); h < heads; h += kThreads) p.lse[h * p.lse_stride_h + row] = -INFINITY;
  }
}

}  // namespace flash4::sm90::decode
