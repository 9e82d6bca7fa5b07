// The normalized attention problem every backend receives after validation: sizes, the effective mask as a
// key window per query row, and the scales. Plain data, usable on host and device.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

struct Problem {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads = 0, heads_kv = 0, head_dim = 0;
  float softmax_scale = 0.0f;  // resolved (never 0)
  float softcap = 0.0f;        // 0 = off
  // Effective window after folding `causal` in (causal = right bound 0); -1 = unbounded.
  int64_t window_left = -1, window_right = -1;
  bool causal = false;  // as requested (kept for dispatch and FLOP counting)

  bool has_mask() const { return window_left >= 0 || window_right >= 0; }
  int64_t group() const { return heads / heads_kv; }  // query heads per K/V head
};

// Keys [lo, hi] (inclusive, clipped to [0, seqlen_k - 1]) that query row i may see. Empty when lo > hi.
struct KeyRange {
  int64_t lo, hi;
};

FLASH4_HD KeyRange key_range(int64_t i, int64_t seqlen_q, int64_t seqlen_k, int64_t window_left,
                             int64_t window_right) {
  const int64_t diag = i + seqlen_k - seqlen_q;  // bottom-right aligned diagonal
  int64_t lo = window_left >= 0 ? diag - window_left : 0;
  int64_t hi = window_right >= 0 ? diag + window_right : seqlen_k - 1;
  if (lo < 0) lo = 0;
  if (hi > seqlen_k - 1) hi = seqlen_k - 1;
  return {lo, hi};
}

FLASH4_HD KeyRange key_range(const Problem& p, int64_t i) {
  return key_range(i, p.seqlen_q, p.seqlen_k, p.window_left, p.window_right);
}

}  // namespace flash4::detail
