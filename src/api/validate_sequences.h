// Validation of the variable-length batch arguments (cu_seqlens, seqused, max_seqlen) and of the learnable sink,
// shared by forward and backward (src/api/validate_sequences.cpp).
#pragma once

#include <cstdint>

#include "api/checker.h"
#include "common/problem.h"

namespace flash4::detail {

// The sequence and sink fields of ForwardArgs / BackwardArgs, which both spell the same way.
struct SequenceArgs {
  const TensorView& q;
  const TensorView& cu_seqlens_q;
  const TensorView& cu_seqlens_k;
  const TensorView& seqused_q;
  const TensorView& seqused_k;
  const TensorView& learnable_sink;
  int64_t max_seqlen_q, max_seqlen_k;

  template <typename Args>
  static SequenceArgs of(const Args& a) {
    return {a.q, a.cu_seqlens_q, a.cu_seqlens_k, a.seqused_q, a.seqused_k, a.learnable_sink, a.max_seqlen_q,
            a.max_seqlen_k};
  }
};

// Host-resident offsets: cu[0] == 0, non-decreasing, cu[batch] <= total, every segment <= max_seqlen.
void check_host_offsets(const Checker& c, const int* cu, const char* name, int64_t batch, int64_t total,
                        int64_t max_seqlen, const char* total_name, const char* max_name);

// Whether the call is packed: both cu_seqlens set (one alone is an error).
bool packed_layout_requested(const Checker& c, const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k);

// Checks the offsets, seqused, max_seqlen and the sink against the sizes check_qkv filled in `p`, and completes
// `p`: batch and maxima of a packed call, the device pointers. Host-resident offsets are checked value by value.
void check_sequence_args(const Checker& c, const SequenceArgs& a, Problem& p);

// The backward's optional dsink: fp32 (heads), only with learnable_sink. Returns whether it is present.
bool check_dsink(const Checker& c, const TensorView& dsink, const TensorView& learnable_sink, const TensorView& q,
                 const Problem& p);

}  // namespace flash4::detail
