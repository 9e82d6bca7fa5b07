// The forward's decode route: flash4::forward problems with few query rows per KV head (decode-like:
// common/decode_rows.h; every sequence with all its queries: dense, or packed with max_seqlen_q queries in every
// segment; keys ragged through cu_seqlens_k / seqused_k as they may be) run on the split-KV decode kernel, which
// reads each K/V byte once per KV head and spreads the keys over the SMs, instead of the 128-row forward tile.
// Same semantics (mask aligned bottom-right, softcap, sink) and the LSE the backward needs.
#pragma once

#include <cuda_runtime.h>

#include "common/problem.h"
#include "flash4/api.h"

namespace flash4::detail {

// Whether the forward of this validated problem takes the decode kernel (and the decode kernel can run it).
bool dense_decode_route(const ForwardArgs& args, const Problem& p);
// A packed batch of mixed query counts (max_seqlen_q above decode_max_queries: prefill chunks beside decode
// steps): the most queries of the segments the decode kernel takes beside the dense kernel, which runs the longer
// ones (SequenceLayout::min_seqlen_q); 0 when the decode kernel takes none.
int64_t packed_decode_share(const ForwardArgs& args, const Problem& p);
// decode_queries > 0: only the segments of at most that many queries (packed_decode_share), the others left to
// the dense kernel; rows in no segment are cleared either way.
void dense_decode_forward(const ForwardArgs& args, const Problem& p, cudaStream_t stream,
                          int64_t decode_queries = 0);

}  // namespace flash4::detail
