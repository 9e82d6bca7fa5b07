// The FP8 (e4m3) forward on Hopper: q, k, v float8_e4m3fn with per-(batch, kv head) descale factors, out bf16.
// The forward kernel's FP8 instantiation (FwdTraits::kFp8) reads q and k as they are; wgmma's FP8 form takes
// K-major operands only, so v is first copied transposed, (b, hkv, d, keys), by a small kernel (fwd_fp8.cu).
#pragma once

#include <cuda_runtime.h>

#include "api/backends.h"

namespace flash4::detail {

// Whether the FP8 GPU forward runs this validated problem, and why not.
Support cuda_can_forward_fp8(const ForwardArgs& args, const Problem& p);
// Runs it (cuda_can_forward_fp8 said yes; seqlen_k > 0).
void cuda_forward_fp8(const ForwardArgs& args, const Problem& p, cudaStream_t stream);

}  // namespace flash4::detail
