// Attention as a plain implementation in the input dtype computes it (think PyTorch math in bf16): each matmul
// accumulates in fp32 and rounds its result to the dtype, softmax runs in fp32 and its output P is rounded.
// Its error against the fp64 reference sets the scale of the CLI's tolerance: a good kernel may be at most
// about 2x as far off (FlashAttention 3's rule).
//
// Arrays are contiguous fp64 holding dtype-representable values, in the layouts of reference.h.
#pragma once

#include <cstdint>
#include <vector>

#include "common/problem.h"
#include "flash4/types.h"

namespace flash4_cli {

// Forward for the listed query rows (all when empty) of every (batch, head).
void naive_forward(const flash4::detail::Problem& p, flash4::DType dtype, const double* q, const double* k,
                   const double* v, double* out, double* lse, const std::vector<int64_t>& rows);

// Backward for the whole problem.
void naive_backward(const flash4::detail::Problem& p, flash4::DType dtype, const double* q, const double* k,
                    const double* v, const double* dout, double* dq, double* dk, double* dv);

}  // namespace flash4_cli
