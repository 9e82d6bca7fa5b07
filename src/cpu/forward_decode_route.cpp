// The CPU forward's decode route: flash4::forward problems with few query rows per KV head (decode-like:
// common/decode_rows.h, the GPU's rule) run through the KV-cache path's split-KV
// attention (kvcache_forward.cpp) with the keys as a contiguous cache and nothing appended. That path packs the
// query heads of a KV head into one tile, reads each key once per KV head, takes decode scores as dot products
// and splits the keys over the threads when the heads alone do not fill them; the forward's tile per query head
// would read and transpose every key once per query head on one thread. Same semantics (bottom-right mask,
// seqused_k, softcap, window, sink, the LSE); the GPU takes the same route for the same reason (decode_dense.h).
// A packed batch takes it when every segment holds max_seqlen_q queries (its keys may be ragged), so that one
// sequence gives the same bits packed or dense.
#include "api/backends.h"
#include "api/kvcache_backends.h"
#include "common/decode_rows.h"
#include "cpu/packed_rows.h"

namespace flash4::detail {
namespace {

// Packed rows (total, heads, head_dim) of `segments` segments of `rows` rows each, as a dense
// (segments, rows, heads, head_dim) view of the same memory.
TensorView as_segments(const TensorView& packed, int64_t segments, int64_t rows) {
  TensorView v = cpu::batched_tokens(packed);  // (1, total, heads, head_dim)
  v.shape[0] = segments;
  v.shape[1] = rows;
  v.stride[0] = rows * v.stride[1];
  return v;
}

}  // namespace

bool cpu_decode_route(const ForwardArgs& args, const Problem& p) {
  // Dense batches of bf16 / fp16 / fp32 with one head dim and the default softmax (the KV-cache path has no
  // polynomial exp2 and always rescales conditionally).
  if (p.seqused_q != nullptr || p.split_head_dims()) return false;
  if (p.varlen() && p.total_q != p.batch * p.seqlen_q) return false;  // segments with fewer queries
  if (args.q.dtype == DType::kFloat8E4M3 || p.q_descale.data != nullptr || p.k_descale.data != nullptr ||
      p.v_descale.data != nullptr)
    return false;
  if (args.tuning.exp2 == Exp2Mode::kPolynomial || !args.tuning.conditional_rescale) return false;
  return decode_rows(p.seqlen_q, p.group()) && p.seqlen_k > 0;
}

void cpu_decode_forward(const ForwardArgs& args, const Problem& p) {
  KvCacheArgs kv_args;
  kv_args.q = args.q;
  kv_args.k_cache = args.k;
  kv_args.v_cache = args.v;
  kv_args.out = args.out;
  kv_args.lse = args.lse;
  kv_args.learnable_sink = args.learnable_sink;
  KvCacheProblem kv;
  kv.attention = p;
  kv.capacity = p.seqlen_k;
  kv.cache_seqlen = p.seqlen_k;
  kv.cache_seqlens = p.seqused_k;  // the keys each sequence uses (null: all)
  if (!p.varlen()) {  // each sequence's keys are a cache slot of seqlen_k rows
    kv.num_slots = p.batch;
    kv.page_size = p.seqlen_k;
    return cpu_forward_kvcache(kv_args, kv);
  }
  // Packed: the keys are one slot of total_k rows in which sequence b starts at cu_seqlens_k[b]; q and out are
  // (batch, seqlen_q) views, the LSE (heads, total_q) a (batch, heads, seqlen_q) one.
  kv.num_slots = 1;
  kv.page_size = p.total_k;
  kv.cu_seqlens_k = p.cu_seqlens_k;
  kv.total_k = p.total_k;
  kv_args.q = as_segments(args.q, p.batch, p.seqlen_q);
  kv_args.out = as_segments(args.out, p.batch, p.seqlen_q);
  kv_args.k_cache = cpu::batched_tokens(args.k);
  kv_args.v_cache = cpu::batched_tokens(args.v);
  if (args.lse.data != nullptr) {
    kv_args.lse = cpu::batched_lse(args.lse);  // (1, heads, total_q)
    kv_args.lse.shape[0] = p.batch;
    kv_args.lse.shape[2] = p.seqlen_q;
    kv_args.lse.stride[0] = p.seqlen_q * kv_args.lse.stride[2];
  }
  cpu_forward_kvcache(kv_args, kv);
}

}  // namespace flash4::detail
