// The CPU path's row-wise use of the common policy: the score transform over a row of dot products and the
// visible span of a row inside a key tile (common/score_transform.h, common/mask.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/mask.h"
#include "common/score_transform.h"
#include "cpu/exp2_row.h"

namespace flash4::cpu {

// tanh(y) = 1 - 2 / (e^(2y) + 1), the GPU kernels' formula (absolute error ~1e-7; |y| clamped to 15, where tanh
// is 1 in fp32), on exp2_accurate so that loops over it vectorize, unlike libm's tanhf.
inline float tanh_from_exp2(float y) {
  const float clamped = y < -15.0f ? -15.0f : (y > 15.0f ? 15.0f : y);
  return 1.0f - 2.0f / (exp2_accurate(clamped * (2.0f * detail::kLog2e)) + 1.0f);
}

// In place over s[0, n): q·k -> log2-domain score t (common/score_transform.h).
inline void apply_score_transform(const detail::ScoreTransform& t, float* s, int64_t n) {
  if (t.has_softcap()) {
    for (int64_t j = 0; j < n; ++j) s[j] = t.log2_scale * tanh_from_exp2(s[j] * t.tanh_scale);
  } else {
    for (int64_t j = 0; j < n; ++j) s[j] *= t.log2_scale;
  }
}

// The keys of tile [k0, k0 + n) that row i may see, as [begin, end) relative to k0 (begin >= end: none).
struct TileSpan {
  int64_t begin, end;
  bool empty() const { return begin >= end; }
};

inline TileSpan tile_span(const detail::SequenceMask& m, int64_t i, int64_t k0, int64_t n) {
  const detail::IndexRange r = m.keys_of_row(i);
  const int64_t begin = r.lo > k0 ? r.lo - k0 : 0;
  const int64_t end = r.hi + 1 - k0 < n ? r.hi + 1 - k0 : n;
  return {begin, end};
}

}  // namespace flash4::cpu
