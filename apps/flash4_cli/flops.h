// The FLOP count behind `flash4 run`'s TFLOP/s, as FlashAttention counts it, with windows counted exactly.
#pragma once

#include <cstdint>

#include "flash4/api.h"

namespace flash4_cli {

// (query, key) pairs that a window (left, right; -1 = unbounded) leaves visible, aligned bottom-right; causal
// caps right at 0. Summed row by row in O(seqlen_q), in double so that no product overflows.
double visible_pairs(int64_t seqlen_q, int64_t seqlen_k, int64_t window_left, int64_t window_right, bool causal);

// Forward: 4 * batch * heads * head_dim per (query, key) pair counted. Without a window every pair counts, halved
// for causal with seqlen_q == seqlen_k (FlashAttention's convention); with a window only the visible pairs count.
// Backward: 2.5 x forward.
double attention_flops(const flash4::ForwardArgs& args, bool backward);

}  // namespace flash4_cli
