// The normalized attention problem every backend receives after validation: sizes, where each sequence lies,
// the mask and the score transform. Plain data, usable on host and device.
#pragma once

#include <cstdint>

#include "common/descale.h"
#include "common/host_device.h"
#include "common/mask.h"
#include "common/score_transform.h"
#include "common/sequence.h"

namespace flash4::detail {

struct Problem {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads = 0, heads_kv = 0;
  int64_t head_dim = 0;    // q's and k's last dimension (the width of the scores' dot products)
  int64_t head_dim_v = 0;  // v's and out's last dimension (equal to head_dim unless the caller splits them)
  float softmax_scale = 0.0f;  // resolved (never 0)
  float softcap = 0.0f;        // 0 = off
  // Effective window after folding `causal` in (causal = right bound 0); -1 = unbounded.
  int64_t window_left = -1, window_right = -1;
  bool causal = false;  // as requested (kept for dispatch and FLOP counting)

  // Variable-length (packed) batches: `batch` segments whose tokens are rows of (total, heads, head_dim)
  // tensors, and seqlen_q / seqlen_k are then the maxima (max_seqlen_q / k). Pointers live on the tensors'
  // device; null = dense. Dense problems have total_q = batch * seqlen_q, total_k = batch * seqlen_k.
  const int* cu_seqlens_q = nullptr;  // (batch + 1)
  const int* cu_seqlens_k = nullptr;  // (batch + 1)
  const int* seqused_q = nullptr;     // (batch), optional in dense and packed mode
  const int* seqused_k = nullptr;     // (batch), optional in dense and packed mode
  int64_t total_q = 0, total_k = 0;
  // Per-head logit in every row's softmax denominator, carrying no value (natural-log domain); null = none.
  const float* learnable_sink = nullptr;  // (heads) fp32
  // FP8 forward (q, k, v in float8_e4m3fn): real inputs are the FP8 values times these; unset = 1.
  Descale q_descale, k_descale, v_descale;

  bool varlen() const { return cu_seqlens_q != nullptr; }  // validation sets both offsets or neither

  bool split_head_dims() const { return head_dim_v != head_dim; }
  bool has_mask() const { return window_left >= 0 || window_right >= 0; }
  int64_t group() const { return heads / heads_kv; }  // query heads per K/V head

  AttentionMask mask() const { return {window_left, window_right}; }
  SequenceLayout layout() const {
    SequenceLayout l = dense_layout(seqlen_q, seqlen_k);
    l.total_q = total_q;
    l.total_k = total_k;
    l.cu_seqlens_q = cu_seqlens_q;
    l.cu_seqlens_k = cu_seqlens_k;
    l.seqused_q = seqused_q;
    l.seqused_k = seqused_k;
    return l;
  }
  ScoreTransform score_transform() const { return ScoreTransform::make(softmax_scale, softcap); }
  // The mask inside batch entry b.
  SequenceMask sequence_mask(int64_t b) const {
    const SequenceInfo s = layout().info(b);
    return SequenceMask::make(mask(), s.seqlen_q, s.seqlen_k);
  }
};

// Keys [lo, hi] (clipped to [0, seqlen_k - 1]) that query row i of batch entry 0 may see; empty when lo > hi.
// (Dense problems only: every entry has the same lengths.)
inline KeyRange key_range(const Problem& p, int64_t i) { return p.sequence_mask(0).keys_of_row(i); }

}  // namespace flash4::detail
