// Validation of the FP8 forward (float8_e4m3fn q, k, v; flash4/api.h): the output's dtype and the descale
// factors (src/api/validate_fp8.cpp).
#pragma once

#include "api/checker.h"
#include "common/problem.h"
#include "flash4/api.h"

namespace flash4::detail {

// out's dtype (bf16 or fp16 for FP8 q, else q's) and q/k/v_descale (fp32 (batch, heads_kv), only with FP8 q),
// against the sizes `p` holds; fills p's descales. The descales are inputs: the caller checks out and lse for
// overlap with them.
void check_fp8_forward(const Checker& c, const ForwardArgs& args, Problem& p);

}  // namespace flash4::detail
