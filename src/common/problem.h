// The normalized attention problem every backend receives after validation: sizes, where each sequence lies,
// the mask and the score transform. Plain data, usable on host and device.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/mask.h"
#include "common/score_transform.h"
#include "common/sequence.h"

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

  AttentionMask mask() const { return {window_left, window_right}; }
  SequenceLayout layout() const { return dense_layout(seqlen_q, seqlen_k); }
  ScoreTransform score_transform() const { return ScoreTransform::make(softmax_scale, softcap); }
  // The mask inside batch entry b.
  SequenceMask sequence_mask(int64_t b) const {
    const SequenceInfo s = layout().info(b);
    return SequenceMask::make(mask(), s.seqlen_q, s.seqlen_k);
  }
};

// Keys [lo, hi] (clipped to [0, seqlen_k - 1]) that query row i of batch entry 0 may see; empty when lo > hi.
inline KeyRange key_range(const Problem& p, int64_t i) { return p.sequence_mask(0).keys_of_row(i); }

}  // namespace flash4::detail
