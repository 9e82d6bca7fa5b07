// The "naive same-dtype attention" baseline of the tolerance rule (tolerance.h).
//
// It emulates a plain, unfused implementation in the tensor dtype (PyTorch's math attention in bf16, say):
// every intermediate a plain implementation materializes in memory is rounded to the dtype, while the matmuls
// accumulate exactly (fp64 here, fp32 there; the difference is far below one dtype ulp). Inputs are rounded to
// the dtype first. Forward: S = Q K^T and S * scale rounded to fp32 (not to the dtype as in FA3's rule: every
// implementation holds scores in an fp32 accumulator, and rounding them to bf16 would make the rule ~10x looser;
// fp32 rounding still accounts for the score error that grows with |S|), P = softmax(S) rounded to the dtype,
// O = P V rounded. LSE (fp32 in every API) is the exact value rounded to fp32. Backward, as autograd of that
// forward: dP = dO V^T rounded, D = rowsum(dO * O) from the stored output O that the backward is given (as
// every FlashAttention backward computes it), dS = P (dP - D) (* softcap derivative) rounded, dV = P^T dO,
// dQ = scale dS K, dK = scale dS^T Q, each rounded. The error of this baseline against the fp64 reference is
// what "the same dtype, done plainly" costs; a fused kernel with fp32 accumulation should stay within ~2x of it.
#pragma once

#include <cstdint>
#include <vector>

#include "check/attention_results.h"
#include "common/problem.h"
#include "flash4/types.h"

namespace flash4::check {

// x rounded to the nearest value of `dtype` (nearest even).
double round_to_dtype(double x, DType dtype);

// Inputs and outputs are contiguous fp64 in the public layouts. `rows` as in reference::forward (empty = all);
// rows not listed are 0 in the result.
ForwardResult naive_forward(const detail::Problem& p, DType dtype, const std::vector<double>& q,
                            const std::vector<double>& k, const std::vector<double>& v,
                            const std::vector<int64_t>& rows = {});

// `out` is the forward's output that the implementation's backward was given (it is a backward input, like
// dout): O's rounding enters D, and with another O the baseline would carry an independent draw of that error.
Gradients naive_backward(const detail::Problem& p, DType dtype, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v,
                         const std::vector<double>& out, const std::vector<double>& dout);

}  // namespace flash4::check
