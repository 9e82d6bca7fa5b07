// flash4 KV-cache attention for inference (flash-attn's flash_attn_with_kvcache): new queries attend to a cache
// of keys and values, optionally after appending new keys and values to it in place. Forward only.
//
//   q        (batch, seqlen_q, heads, head_dim)                      out like q
//   k_cache, v_cache  contiguous: (batch_cache, seqlen_cache, heads_kv, head_dim)
//                     paged:      (num_pages, page_size, heads_kv, head_dim) with block_table
//   block_table       int32 (batch, max_pages): sequence b's key position j lives in page
//                     block_table[b][j / page_size], row j % page_size. Pages may lie anywhere in the pool, in
//                     any order; entries past the pages a sequence uses are not read (padding such as -1 is fine).
//   cache_seqlens     int32 (batch): keys already in sequence b's cache. Absent: every sequence has cache_seqlen
//                     keys (-1 = the whole cache: seqlen_cache, or max_pages * page_size).
//   cache_batch_idx   int32 (batch), contiguous caches only: sequence b uses cache row cache_batch_idx[b] (default b).
//   cache_leftpad     int32 (batch), contiguous caches only (flash-attn's): sequence b's keys start at row
//                     cache_leftpad[b] of its cache row, so it holds rows cache_leftpad[b] .. cache_seqlens[b] - 1
//                     (cache_seqlens still counts from row 0) and the append writes at cache_seqlens[b]. Rotary
//                     angles are taken at rows (as in flash-attn: the padding counts in the positions).
//   k, v              (batch, seqlen_new, heads_kv, head_dim), optional, both or neither: written into the cache at
//                     positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before attending (in place:
//                     k_cache / v_cache are modified). Sequence b then attends to cache_seqlens[b] + seqlen_new keys.
//   rotary_cos, rotary_sin  (seqlen_ro, rotary_dim / 2), q's dtype, optional, both or neither and only with k:
//                     the first rotary_dim features of the new keys are rotated at their positions
//                     cache_seqlens[b] + t before they are written; those of q at cache_seqlens[b] + i when causal or
//                     windowed, else all at cache_seqlens[b]. rotary_interleaved: pairs (0, 1), (2, 3), ... ; else
//                     (GPT-NeoX) pairs (i, i + rotary_dim / 2). The rotated q and k are rounded to the dtype.
//   lse               (batch, heads, seqlen_q) fp32, optional. learnable_sink fp32 (heads), optional (flash4/api.h).
//   cu_seqlens_q      int32 (batch + 1), optional (FlashAttention-3's): packed queries of different counts per
//                     sequence (decode beside speculative verify steps). q and out are then (total_q, heads,
//                     head_dim), lse (heads, total_q); sequence b's queries are rows cu_seqlens_q[b] ..
//                     cu_seqlens_q[b + 1] - 1, at most max_seqlen_q of them (none is fine), and they are its last
//                     positions (causal: bottom-right per sequence). batch = cu_seqlens_q.shape[0] - 1 sizes the
//                     index tensors. Rows in no segment get out 0 and lse -inf. Not with k, v (nothing is
//                     appended in such a call) nor rotary. The GPU runs it on the decode kernel for any count;
//                     it is made for counts up to 16 (the dense kernel takes longer uniform chunks).
//
// Masks are those of flash4/api.h inside each sequence with seqlen_k = its keys after the append: causal is
// aligned bottom-right (the new queries are the last positions), the window is relative to that diagonal. A
// sequence with no key gets out 0 and lse -inf (lse = sink with a sink). k_cache and v_cache may be views of one
// buffer (interleaved) but must not share elements.
//
// Host-resident index tensors (CPU) are checked exactly: cache_seqlens[b] + seqlen_new within the cache (the
// sequence's pages), cache_batch_idx in [0, batch_cache), cache_leftpad[b] in [0, cache_seqlens[b]], the
// block_table entries a sequence uses in [0, num_pages), rotary positions < seqlen_ro, cu_seqlens_q from 0, non-
// decreasing, segments of at most max_seqlen_q, ending at most at total_q. Device-resident ones cannot be read
// without a synchronisation:
// they are clamped into those ranges, so bad values give wrong results but never an access outside the tensors.
//
// num_splits: the keys of each (sequence, head) are split into this many parts computed independently (partial
// out and LSE in fp32) and then merged by their LSE (docs/kvcache.md); 0 picks the count from the machine's
// parallelism, the batch, the heads and the cache length; at most 128. It changes the rounding, not the result.
#pragma once

#include "flash4/api.h"

namespace flash4 {

struct KvCacheArgs {
  TensorView q;
  TensorView k_cache, v_cache;        // modified in place when k, v are given
  TensorView k, v;                    // optional new keys and values
  TensorView rotary_cos, rotary_sin;  // optional
  TensorView cache_seqlens;           // optional int32 (batch)
  int64_t cache_seqlen = -1;          // used when cache_seqlens is absent; -1 = the whole cache
  TensorView cache_batch_idx;         // optional int32 (batch), contiguous caches only
  TensorView cache_leftpad;           // optional int32 (batch), contiguous caches only
  TensorView block_table;             // optional int32 (batch, max_pages): a paged cache
  TensorView out;
  TensorView lse;                     // optional
  TensorView learnable_sink;          // optional fp32 (heads)
  TensorView cu_seqlens_q;            // optional int32 (batch + 1): packed queries (q, out rank 3, lse rank 2)
  int64_t max_seqlen_q = 0;           // with cu_seqlens_q: the most queries a sequence has
  float softmax_scale = 0.0f;         // 0 means 1/sqrt(head_dim)
  bool causal = false;
  int window_left = -1;               // -1 = unbounded
  int window_right = -1;
  float softcap = 0.0f;               // 0 = off
  bool rotary_interleaved = true;
  int num_splits = 0;                 // 0 = automatic, else 1 .. 128
};

// Validates the arguments (throws Error(kInvalidArgument) on bad input, naming the argument) and reports whether
// the tensors' device can run them (the GPU: bf16 / fp16, head_dim a multiple of 8 up to 256, 16-byte aligned q,
// caches and out; ok = false with the reason otherwise).
Support can_implement(const KvCacheArgs& args);

// Appends k, v (when given) and runs attention. Throws flash4::Error; on any error nothing is written (neither
// the outputs nor the caches).
void forward_kvcache(const KvCacheArgs& args, Stream stream = nullptr);

}  // namespace flash4
