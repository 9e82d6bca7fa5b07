// From raw dot products q.k to log2-domain scores t, for the softmax as exp2(t - max): scale, softcap, log2e.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/problem.h"
#include "cpu/tile_config.h"

namespace flash4::cpu {

struct ScoreTransform {
  float scale_log2;       // softmax_scale * log2e (no softcap)
  float scale_over_cap;   // softmax_scale / softcap
  float cap_log2;         // softcap * log2e
  bool softcap;

  explicit ScoreTransform(const detail::Problem& p)
      : scale_log2(p.softmax_scale * kLog2e),
        scale_over_cap(p.softcap > 0.0f ? p.softmax_scale / p.softcap : 0.0f),
        cap_log2(p.softcap * kLog2e),
        softcap(p.softcap > 0.0f) {}

  // In place over s[0, n): t = s * scale * log2e, or softcap * log2e * tanh(s * scale / softcap).
  void apply(float* s, int64_t n) const {
    if (softcap) {
      for (int64_t j = 0; j < n; ++j) s[j] = cap_log2 * std::tanh(s[j] * scale_over_cap);
    } else {
      for (int64_t j = 0; j < n; ++j) s[j] *= scale_log2;
    }
  }
};

// The keys of tile [k0, k0 + n) that row i may see, as [begin, end) relative to k0 (begin >= end: none).
struct TileSpan {
  int64_t begin, end;
  bool empty() const { return begin >= end; }
};

inline TileSpan tile_span(const detail::Problem& p, int64_t i, int64_t k0, int64_t n) {
  const detail::KeyRange r = detail::key_range(p, i);
  const int64_t begin = r.lo > k0 ? r.lo - k0 : 0;
  const int64_t end = r.hi + 1 - k0 < n ? r.hi + 1 - k0 : n;
  return {begin, end};
}

// Keys [lo, hi] seen by any row of [q0, q0 + rows): key_range's bounds never decrease with i, so the union is
// spanned by the first and last non-empty rows. lo > hi when every row is fully masked.
inline detail::KeyRange tile_key_union(const detail::Problem& p, int64_t q0, int64_t rows) {
  detail::KeyRange u{p.seqlen_k, -1};
  for (int64_t i = q0; i < q0 + rows; ++i) {
    const detail::KeyRange r = detail::key_range(p, i);
    if (r.lo > r.hi) continue;
    u.lo = r.lo < u.lo ? r.lo : u.lo;
    u.hi = r.hi > u.hi ? r.hi : u.hi;
  }
  return u;
}

}  // namespace flash4::cpu
