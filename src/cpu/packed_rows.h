// Dense and packed batches through one addressing scheme on the CPU. A packed tensor (total, heads, head_dim) is
// viewed as the single batch entry of a rank-4 tensor (1, total, heads, head_dim), so tile_io reaches entry b's
// token i at (entry_index(b), offset + i) in both layouts: dense has offset 0 and indexes the entry, packed has
// the segment's offset and entry 0. Rows that take part in no segment (past seqused, between or after the
// segments) are found here too, so the backends can give them their defined values (out 0, lse -inf, grads 0).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/problem.h"
#include "cpu/tile_io.h"
#include "flash4/types.h"

namespace flash4::cpu {

// A rank-3 packed attention tensor as (1, total, heads, head_dim); a rank-4 one unchanged.
inline TensorView batched_tokens(const TensorView& t) {
  if (t.rank != 3) return t;
  TensorView v = t;
  v.rank = 4;
  for (int i = 3; i >= 1; --i) {
    v.shape[i] = t.shape[i - 1];
    v.stride[i] = t.stride[i - 1];
  }
  v.shape[0] = 1;
  v.stride[0] = 0;
  return v;
}

// A rank-2 packed LSE (heads, total_q) as (1, heads, total_q); a rank-3 one unchanged.
inline TensorView batched_lse(const TensorView& t) {
  if (t.rank != 2 || t.data == nullptr) return t;
  TensorView v = t;
  v.rank = 3;
  v.shape[2] = t.shape[1];
  v.stride[2] = t.stride[1];
  v.shape[1] = t.shape[0];
  v.stride[1] = t.stride[0];
  v.shape[0] = 1;
  v.stride[0] = 0;
  return v;
}

// The batch index of entry b in the batched views.
inline int64_t entry_index(const detail::Problem& p, int64_t b) { return p.varlen() ? 0 : b; }

// Entries and rows per entry of the batched views of q (keys = false) or k.
struct RowGrid {
  int64_t entries = 0, rows = 0;
  int64_t size() const { return entries * rows; }
};
inline RowGrid row_grid(const detail::Problem& p, bool keys) {
  if (p.varlen()) return {1, keys ? p.total_k : p.total_q};
  return {p.batch, keys ? p.seqlen_k : p.seqlen_q};
}

// The most query (keys = false) or key rows one entry uses: tasks are sized by it, not by a packed call's
// max_seqlen, which only bounds the segments (up to 2^31 - 1 for a few tokens: millions of empty tasks).
inline int64_t longest_entry(const detail::Problem& p, bool keys) {
  const detail::SequenceLayout layout = p.layout();
  int64_t longest = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const detail::SequenceInfo s = layout.info(b);
    longest = std::max(longest, keys ? s.seqlen_k : s.seqlen_q);
  }
  return longest;
}

// covered[entry * rows + row]: whether that query (or key) row belongs to some entry's used tokens.
inline std::vector<char> covered_rows(const detail::Problem& p, bool keys) {
  const RowGrid g = row_grid(p, keys);
  std::vector<char> covered(static_cast<size_t>(g.size()), 0);
  const detail::SequenceLayout layout = p.layout();
  for (int64_t b = 0; b < p.batch; ++b) {
    const detail::SequenceInfo s = layout.info(b);
    const int64_t offset = keys ? s.k_offset : s.q_offset, length = keys ? s.seqlen_k : s.seqlen_q;
    if (length > 0) std::memset(covered.data() + entry_index(p, b) * g.rows + offset, 1, static_cast<size_t>(length));
  }
  return covered;
}

// Sets every row of the batched view `t` that `covered` leaves out to zero, in every head.
inline void zero_uncovered(const TensorView& t, const std::vector<char>& covered, const RowGrid& g) {
  const int64_t size = dtype_size(t.dtype);
  for (int64_t e = 0; e < g.entries; ++e)
    for (int64_t r = 0; r < g.rows; ++r) {
      if (covered[e * g.rows + r]) continue;
      for (int64_t h = 0; h < t.shape[2]; ++h) {
        const int64_t element = e * t.stride[0] + r * t.stride[1] + h * t.stride[2];
        std::memset(static_cast<char*>(t.data) + element * size, 0, static_cast<size_t>(t.shape[3] * size));
      }
    }
}

// Sets the batched LSE view's entries of the rows `covered` leaves out to -inf.
inline void fill_uncovered_lse(const TensorView& lse, const std::vector<char>& covered, const RowGrid& g) {
  if (lse.data == nullptr) return;
  for (int64_t e = 0; e < g.entries; ++e)
    for (int64_t r = 0; r < g.rows; ++r) {
      if (covered[e * g.rows + r]) continue;
      for (int64_t h = 0; h < lse.shape[1]; ++h) *lse_ptr(lse, e, h, r) = -std::numeric_limits<float>::infinity();
    }
}

}  // namespace flash4::cpu
