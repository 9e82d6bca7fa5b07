// The fallback GPU backward of packed (variable-length) and seqused batches that the wgmma kernels' packed
// instantiation does not take (layouts TMA cannot describe, empty packed tensors: bwd_api.cu,
// backward_packed_native): one dense backward per sequence (api/sequence_split.h) and dsink over the packed rows.
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
