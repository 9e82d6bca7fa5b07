// Attention results as contiguous fp64 vectors in the public layouts, and the fp64 reference returning them.
#pragma once

#include <cstdint>
#include <vector>

#include "common/problem.h"

namespace flash4::check {

// Packed problems use the packed layouts (reference/array_index.h).
struct ForwardResult {
  std::vector<double> out;  // (batch, seqlen_q, heads, head_dim)
  std::vector<double> lse;  // (batch, heads, seqlen_q)
};

struct Gradients {
  std::vector<double> dq, dk, dv;  // shaped like q, k, v
  std::vector<double> dsink;       // (heads) when the problem has a learnable sink, else empty
};

// reference::forward / backward (src/reference) returning vectors; `rows` as in reference::forward, rows not
// listed are 0.
ForwardResult reference_forward(const detail::Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const std::vector<int64_t>& rows = {});
Gradients reference_backward(const detail::Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dout);

}  // namespace flash4::check
