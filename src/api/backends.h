// The internal contract between the API layer (validation + dispatch, src/api) and the backends.
// Backends receive validated arguments and the normalized Problem; they never re-validate user input.
#pragma once

#include "common/problem.h"
#include "flash4/api.h"

namespace flash4::detail {

// Validates everything that does not depend on the device (throws Error(kInvalidArgument)) and returns the
// normalized problem. kWithoutBuffers skips the data pointers and aliasing. Defined in src/api/validate.cpp.
Problem validate(const ForwardArgs& args, Validation scope = Validation::kFull);
Problem validate(const BackwardArgs& args, Validation scope = Validation::kFull);

// CPU backend (src/cpu): tiled FlashAttention with online softmax and conditional rescaling.
void cpu_forward(const ForwardArgs& args, const Problem& p);
// The CPU backward's schedule: both give the same bits (tests compare them); kAuto picks by the thread count.
enum class CpuBackwardPasses { kAuto, kTwo, kSingle };
void cpu_backward(const BackwardArgs& args, const Problem& p, CpuBackwardPasses passes = CpuBackwardPasses::kAuto);

// The CPU forward's decode route (src/cpu/forward_decode_route.cpp): few query rows per KV head run on the
// KV-cache path's split-KV attention.
bool cpu_decode_route(const ForwardArgs& args, const Problem& p);
void cpu_decode_forward(const ForwardArgs& args, const Problem& p);

// CUDA backend (src/kernels). In a build without CUDA these report "built without CUDA".
Support cuda_can_forward(const ForwardArgs& args, const Problem& p);
Support cuda_can_backward(const BackwardArgs& args, const Problem& p);
void cuda_forward(const ForwardArgs& args, const Problem& p, Stream stream);
void cuda_backward(const BackwardArgs& args, const Problem& p, Stream stream);
bool cuda_device_supported(int device_index);

}  // namespace flash4::detail
