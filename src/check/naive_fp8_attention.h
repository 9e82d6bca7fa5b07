// The "naive FP8 attention" baseline of the FP8 forward's tolerance (docs/numerics.md, "FP8 forward").
//
// A plain FP8 implementation multiplies FP8 operands with fp32 accumulation: S = Q K^T is exact for FP8 inputs
// (held in fp32, scaled, softcapped), the softmax numerator P~ = exp(S - rowmax) lies in (0, 1] and is rounded to
// E4M3 to be the FP8 operand of P~ V, the denominator l = sum P~ (plus the sink's term) is summed before that
// rounding, O = (P~_fp8 V) / l is rounded to the output dtype and the LSE to fp32. Rounding the unnormalized P~
// (not the normalized P, whose small values would be E4M3 subnormals) is what FP8 kernels do. Inputs are the
// dequantized values (FP8 value * descale), which are exact in fp64: nothing is rounded on the way in.
#pragma once

#include <cstdint>
#include <vector>

#include "check/attention_results.h"
#include "common/problem.h"
#include "flash4/types.h"

namespace flash4::check {

// q, k, v: contiguous fp64 in the public layouts (reference/array_index.h), already dequantized. out_dtype: the
// output's (bf16 or fp16). `rows` as in reference::forward (empty = all); rows not listed are 0.
ForwardResult naive_fp8_forward(const detail::Problem& p, DType out_dtype, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v,
                                const std::vector<int64_t>& rows = {});

}  // namespace flash4::check
