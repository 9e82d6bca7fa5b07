// flash_attn_with_kvcache's prefill route: a KV-cache call with many query rows per KV head (chunked prefill,
// long speculative chunks: more than the decode kernel's 16 queries or 128 rows per KV head, as the dense
// forward's decode route decides the other way) runs the dense forward kernel over the cache. Its producer takes
// each K/V tile from the sequence's cache row or pages (FwdParams::kv), and each sequence attends to its cache
// length plus the appended keys, bottom-right aligned, as on the decode kernel.
#pragma once

#include <cuda_runtime.h>

#include "common/kvcache_problem.h"
#include "flash4/kvcache.h"

namespace flash4::detail {

// Whether the dense forward runs this validated KV-cache call: many rows per KV head, a compiled unpadded head
// dim, and pages that hold whole K/V tiles (a power-of-two page size that is a multiple of the tile: 128 rows at
// head dims 64 / 128, 64 at 256).
bool kvcache_dense_route(const KvCacheArgs& args, const KvCacheProblem& p);
// The attention of such a call, once its keys are appended; q: the (possibly rotated) queries. min_seqlen_q: in a
// packed batch, segments of fewer queries are left to another kernel (SequenceLayout::min_seqlen_q).
void kvcache_dense_forward(const KvCacheProblem& p, const KvCacheArgs& args, const TensorView& q,
                           cudaStream_t stream, int64_t min_seqlen_q = 0);

}  // namespace flash4::detail
