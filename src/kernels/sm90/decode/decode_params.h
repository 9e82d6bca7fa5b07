// Parameters of the decode kernels (attention, combine, append): plain data built on the host by decode_api.cu,
// passed by value (__grid_constant__). Element strides; index tensors stay device-resident and are clamped where
// they are read (common/kvcache_problem.h).
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/kvcache_problem.h"
#include "common/score_transform.h"

namespace flash4::sm90::decode {

// A (rows, heads, head_dim) view of a 4-D tensor whose first two dimensions are (batch or slot, position).
struct RowsView {
  const void* data = nullptr;
  int64_t stride_0 = 0, stride_1 = 0, stride_h = 0;  // elements
};

struct DecodeParams {
  detail::KvCacheProblem kv;        // sizes, mask, paging, cache lengths (device pointers, clamped when read)
  detail::ScoreTransform score;
  RowsView q;                       // (batch, seqlen_q, heads, d): the caller's q, or the rotated copy
  RowsView k_cache, v_cache;        // (slot, row, heads_kv, d)
  int head_dim = 0;                 // d, a multiple of 8 up to the kernel's width; columns past it read as 0
  void* out = nullptr;              // (batch, seqlen_q, heads, d), Element
  int64_t out_stride_b = 0, out_stride_s = 0, out_stride_h = 0;
  float* lse = nullptr;             // (batch, heads, seqlen_q) fp32, optional
  int64_t lse_stride_b = 0, lse_stride_h = 0;
  // Split-KV: with splits > 1 each CTA writes its normalized partial output and LSE here instead of out / lse:
  // o_partial (splits, batch, heads, seqlen_q, kernel width) fp32, lse_partial (splits, batch, heads, seqlen_q) fp32.
  float* o_partial = nullptr;
  float* lse_partial = nullptr;
  // One arrival counter per (sequence, KV head, row tile), zero at launch: with it the tile's last split CTA merges
  // the parts (16-row tiles; decode_split_merge.cuh); without it (null) the combine kernel does.
  int* split_counters = nullptr;
  int splits = 1;
  int group = 1;                    // query heads per KV head
  int rows = 0;                     // seqlen_q * group: packed rows per (sequence, KV head), at most
  int row_tiles = 1;                // CTAs per (split, sequence, KV head) along the rows
  // A packed batch (the forward's decode route): q, out and lse are one batch entry of total_q queries (their
  // batch strides 0) and sequence b's queries are its cu_seqlens_q segment, of at most seqlen_q; null otherwise.
  const int* cu_seqlens_q = nullptr;
  int64_t total_q = 0;
  // Packed queries shared with the dense forward (the caller's max_seqlen_q, above seqlen_q): a segment of more
  // than seqlen_q queries is the dense kernel's, of which this kernel computes nothing and clears only the rows
  // past max_seqlen_q. 0: not shared.
  int64_t max_seqlen_q = 0;
};

// Sequence b's queries: rows first .. first + count - 1 along q's, out's and lse's query dimension. A packed
// batch's device-resident offsets are clamped to the tensors and its counts to seqlen_q, so nothing outside them
// is read or written whatever the offsets hold.
struct QuerySpan {
  int64_t first = 0, count = 0;
};
FLASH4_HD QuerySpan query_span(const int* cu_seqlens_q, int64_t total_q, int64_t seqlen_q, int64_t b) {
  if (cu_seqlens_q == nullptr) return {0, seqlen_q};
  // Offsets clamped to [0, total_q]: corrupt device-resident ones address no row outside q.
  const int64_t first = detail::clamped_offset(cu_seqlens_q, b, total_q);
  const int64_t end = detail::clamped_offset(cu_seqlens_q, b + 1, total_q);
  const int64_t count = end > first ? end - first : 0;
  return {first, count < seqlen_q ? count : seqlen_q};
}

// The span of sequence b in a decode kernel's packed batch, and whether that kernel computes its rows: not when
// the segment is longer than seqlen_q in a batch shared with the dense forward (max_seqlen_q > seqlen_q).
struct DecodeSpan {
  QuerySpan span;  // counted up to the caller's max_seqlen_q: rows after it are in no segment
  bool computed;
};
FLASH4_HD DecodeSpan decode_span(const int* cu_seqlens_q, int64_t total_q, int64_t seqlen_q, int64_t max_seqlen_q,
                                 int64_t b) {
  const QuerySpan span = query_span(cu_seqlens_q, total_q, max_seqlen_q > seqlen_q ? max_seqlen_q : seqlen_q, b);
  return {span, span.count <= seqlen_q};
}

// The combine: merges the splits of every (batch, head, query) row into out and lse (common/lse_combine.h).
struct CombineParams {
  const float* o_partial = nullptr;
  const float* lse_partial = nullptr;
  int splits = 1;
  int batch = 0, heads = 0, seqlen_q = 0;
  const float* sink = nullptr;      // (heads) or null
  void* out = nullptr;
  int64_t out_stride_b = 0, out_stride_s = 0, out_stride_h = 0;
  int out_cols = 0;                 // the head dim: out's columns (o_partial rows are the kernel's width)
  float* lse = nullptr;
  int64_t lse_stride_b = 0, lse_stride_h = 0;
  const int* cu_seqlens_q = nullptr;  // as in DecodeParams
  int64_t total_q = 0;
  int64_t max_seqlen_q = 0;
};

// The append (with rotary) before attention: new k, v into the caches, and q rotated into a contiguous copy.
struct AppendParams {
  detail::KvCacheProblem kv;
  RowsView k_new, v_new;            // (batch, seqlen_new, heads_kv, d)
  void* k_cache = nullptr;          // written in place, strides of DecodeParams::k_cache
  void* v_cache = nullptr;
  RowsView k_cache_strides, v_cache_strides;
  RowsView q;                       // (batch, seqlen_q, heads, d) input
  void* q_rotated = nullptr;        // contiguous (batch, seqlen_q, heads, d), or null: q is not rotated
  const void* cos = nullptr;        // (seqlen_ro, rotary_dim / 2), q's dtype
  const void* sin = nullptr;
  int64_t cos_stride = 0, sin_stride = 0;
  int head_dim = 0;
  int64_t append_rows = 0;          // batch * seqlen_new * heads_kv
  int64_t q_rows = 0;               // batch * seqlen_q * heads when q is rotated, else 0
};

}  // namespace flash4::sm90::decode
