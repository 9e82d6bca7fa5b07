// A packed (variable-length) or seqused backward as one dense backward per sequence, for a backend whose kernels
// take dense batches only (the Hopper backward's fallback for layouts its TMA kernels cannot describe). Each sequence's rows of q, k, v, out, dout, lse and of
// the gradients are viewed as a dense batch of one; the dense calls get neither the sink (the forward's LSE
// already includes it, and that is all the gradient of q, k, v needs) nor dsink, which the caller computes for the
// whole packed problem. Rows in no sequence get zero gradients (the outputs are cleared first).
#pragma once

#include <functional>
#include <vector>

#include "common/problem.h"
#include "common/sequence.h"
#include "flash4/api.h"

namespace flash4::detail {

// What a backend provides: its dense backward (arguments already validated by the caller's rules: dense views of
// a batch of one) and a way to zero an attention tensor of any rank and strides on its device.
struct SequenceSplitBackend {
  std::function<Support(const BackwardArgs&)> can_run;  // whether the dense backward takes these arguments
  std::function<void(const BackwardArgs&)> run;         // the dense backward
  std::function<void(const TensorView&)> zero;          // zeroes a (total, heads, head_dim) or 4-D tensor
};

// The dense arguments of sequence b (lengths and offsets from `host_layout`, whose offsets the host can read);
// empty when the sequence has no query or no key (its gradients are the cleared zeros).
struct SequenceCall {
  bool empty = true;
  BackwardArgs args;
};
SequenceCall sequence_backward_args(const BackwardArgs& args, const Problem& p, const SequenceLayout& host_layout,
                                    int64_t b);

// Runs the backward of `args` (packed or with seqused) as one dense call per sequence. Every call is checked with
// backend.can_run before anything is written, so a refusal leaves the outputs untouched. dsink is not written.
void backward_per_sequence(const BackwardArgs& args, const Problem& p, const SequenceLayout& host_layout,
                           const SequenceSplitBackend& backend);

}  // namespace flash4::detail
