// Rows of a packed q that no sequence covers get out 0 and LSE -inf (flash4/api.h), written by the decode kernel
// itself: one CTA per sequence clears the rows between its queries and the next segment's start (a segment longer
// than max_seqlen_q), the last sequence's also those after the last segment. A well-formed batch has none, so this
// costs a check per CTA instead of a clearing kernel per call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/clear_rows.cuh"
#include "kernels/sm90/decode/decode_config.h"
#include "kernels/sm90/decode/decode_params.h"

namespace flash4::sm90::decode {

// Called by every thread of the CTA of (split 0, KV head 0, row tile 0) of sequence b, whose queries are `span`.
// Offsets are clamped as query_span's are, so corrupt device-resident values write nothing out of bounds.
__device__ __forceinline__ void clear_rows_in_no_segment(const DecodeParams& p, int64_t b, const QuerySpan& span) {
  const int64_t batch = p.kv.attention.batch;
  const int64_t first = span.first + span.count;
  const int64_t end = b + 1 < batch ? detail::clamped_offset(p.cu_seqlens_q, b + 1, p.total_q) : p.total_q;
  if (first >= end) return;
  const sm90::RowsView out{static_cast<uint16_t*>(p.out), 0, p.out_stride_s, p.out_stride_h, p.head_dim};
  const sm90::LseView lse{p.lse, 0, p.lse_stride_h};  // packed: (heads, total_q), one batch entry
#pragma unroll 1
  for (int64_t row = first; row < end; ++row)
    sm90::clear_row(out, lse, nullptr, 0, row, p.kv.attention.heads, static_cast<int>(threadIdx.x), kThreads);
}

}  // namespace flash4::sm90::decode
