// The GPU backward of packed (variable-length) and seqused batches: one dense backward per sequence
// (api/sequence_split.h) on the Hopper kernels, which take dense batches only, and dsink over the packed rows.
// The sequence offsets are read on the host, which synchronizes the stream: such a backward cannot be captured in
// a CUDA graph (refused with that reason while the stream is capturing).
#pragma once

#include "common/problem.h"
#include "flash4/api.h"

namespace flash4::detail {

bool backward_needs_sequences(const Problem& p);  // packed or seqused
Support cuda_can_backward_sequences(const BackwardArgs& args, const Problem& p);
void cuda_backward_sequences(const BackwardArgs& args, const Problem& p, Stream stream);

}  // namespace flash4::detail
