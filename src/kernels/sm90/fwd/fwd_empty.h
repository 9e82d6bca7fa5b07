// The forward of a problem with no keys (seqlen_k = 0): every row is fully masked, so out = 0 and LSE = -inf.
// TMA cannot describe an empty K/V tensor, so this case bypasses the attention kernel.
#pragma once

#include <cuda_runtime.h>

#include "flash4/api.h"

namespace flash4::sm90 {

void launch_forward_no_keys(const ForwardArgs& args, cudaStream_t stream);

}  // namespace flash4::sm90
