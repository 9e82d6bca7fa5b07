// Which (query, key) pairs attention sees: one definition for the CPU path, the forward, the backward and the
// backward's schedule.
//
// A call's mask is a sliding window with causal folded in (AttentionMask). Inside one sequence of seqlen_q queries
// and seqlen_k keys it is aligned bottom-right (the last query sees the last key) and becomes a band of allowed
// key-minus-query offsets (SequenceMask): key j is visible to query i iff band_lo <= j - i <= band_hi and
// 0 <= j < seqlen_k. Every question a kernel asks (keys of a row, key tiles of a query tile, query tiles of a key
// tile, the tiles that need the element mask, the element predicate) is answered here from the band.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

// The call's mask: key window (left, right) around each query's diagonal; -1 = unbounded. Causal is right = 0.
struct AttentionMask {
  int64_t window_left = -1, window_right = -1;
  FLASH4_HD bool any() const { return window_left >= 0 || window_right >= 0; }
};

// An inclusive interval [lo, hi] of key (or query, or tile) indices; empty when lo > hi.
struct IndexRange {
  int64_t lo, hi;
  FLASH4_HD bool empty() const { return lo > hi; }
  FLASH4_HD int64_t count() const { return hi >= lo ? hi - lo + 1 : 0; }
};
using KeyRange = IndexRange;

// The most tokens (queries or keys) one sequence may have: validation refuses longer ones, so that every offset
// j - i the masks meet stays far inside kUnboundedOffset.
inline constexpr int64_t kMaxSequenceLength = (int64_t{1} << 40) - 1;
// Larger than any offset j - i between two indices below 2^40: an unbounded side of the band.
inline constexpr int64_t kUnboundedOffset = int64_t{1} << 41;

// The mask inside one sequence.
struct SequenceMask {
  int64_t seqlen_q = 0, seqlen_k = 0;
  int64_t band_lo = -kUnboundedOffset, band_hi = kUnboundedOffset;  // allowed j - i

  FLASH4_HD static SequenceMask make(const AttentionMask& m, int64_t seqlen_q, int64_t seqlen_k) {
    const int64_t diag = seqlen_k - seqlen_q;  // j - i on the bottom-right-aligned diagonal
    SequenceMask s;
    s.seqlen_q = seqlen_q;
    s.seqlen_k = seqlen_k;
    s.band_lo = m.window_left >= 0 ? diag - m.window_left : -kUnboundedOffset;
    s.band_hi = m.window_right >= 0 ? diag + m.window_right : kUnboundedOffset;
    return s;
  }

  // Element predicate for S (row i, column j); for S^T swap the roles of the arguments at the call site.
  FLASH4_HD bool visible(int64_t i, int64_t j) const {
    return j >= 0 && j < seqlen_k && j - i >= band_lo && j - i <= band_hi;
  }

  // Keys query row i sees, clipped to [0, seqlen_k - 1].
  FLASH4_HD IndexRange keys_of_row(int64_t i) const {
    const int64_t lo = i + band_lo, hi = i + band_hi;
    return {lo < 0 ? 0 : lo, hi > seqlen_k - 1 ? seqlen_k - 1 : hi};
  }
  // Keys some row of [i0, i1] sees (the band's bounds grow with i, so the first and last rows span them).
  FLASH4_HD IndexRange keys_of_any_row(int64_t i0, int64_t i1) const {
    return {keys_of_row(i0).lo, keys_of_row(i1).hi};
  }
  // Keys every row of [i0, i1] sees: a key tile inside needs no element mask.
  FLASH4_HD IndexRange keys_of_every_row(int64_t i0, int64_t i1) const {
    return {keys_of_row(i1).lo, keys_of_row(i0).hi};
  }
  // Query rows key j is seen by, clipped to [0, seqlen_q - 1] (empty past seqlen_k).
  FLASH4_HD IndexRange rows_of_key(int64_t j) const {
    if (j < 0 || j >= seqlen_k) return {0, -1};
    const int64_t lo = j - band_hi, hi = j - band_lo;
    return {lo < 0 ? 0 : lo, hi > seqlen_q - 1 ? seqlen_q - 1 : hi};
  }

  // Whether the block rows [i0, i1] x keys [j0, j1] holds a visible pair (exact: every offset between the
  // extreme ones occurs in a rectangle) and whether it holds a hidden one (then it needs the element mask).
  FLASH4_HD bool block_visible(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    if (j1 > seqlen_k - 1) j1 = seqlen_k - 1;
    if (j0 < 0) j0 = 0;
    return j0 <= j1 && j0 - i1 <= band_hi && j1 - i0 >= band_lo;
  }
  FLASH4_HD bool block_needs_mask(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    const IndexRange every = keys_of_every_row(i0, i1);
    return j0 < every.lo || j1 > every.hi;
  }

  // Key tiles (block_n keys each) that rows [i0, i1] see: [n_min, n_max], empty when none.
  FLASH4_HD IndexRange key_tiles(int64_t i0, int64_t i1, int64_t block_n) const {
    const IndexRange k = keys_of_any_row(i0, i1);
    if (k.hi < k.lo || k.hi < 0) return {0, -1};
    return {k.lo / block_n, k.hi / block_n};
  }
  // Query tiles (block_m rows each) that see keys [j0, j1]: [m_min, m_max], empty when none.
  FLASH4_HD IndexRange query_tiles(int64_t j0, int64_t j1, int64_t block_m) const {
    if (j1 > seqlen_k - 1) j1 = seqlen_k - 1;
    if (j0 > j1) return {0, -1};
    const int64_t lo = j0 - band_hi < 0 ? 0 : j0 - band_hi;
    const int64_t hi = j1 - band_lo > seqlen_q - 1 ? seqlen_q - 1 : j1 - band_lo;
    if (hi < lo) return {0, -1};
    return {lo / block_m, hi / block_m};
  }
};

}  // namespace flash4::detail
