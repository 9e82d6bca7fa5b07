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
  // naive_backward only: a bound of what rounding the stored output O to the dtype does to dsink through
  // D = rowsum(dO * O), max over heads of u * sum_i p_sink,i * sum_x |dO_ix| |O_ix| (u: the dtype's unit
  // roundoff). dsink is a sum over every row of a head, so this bound, not the naive baseline's one random
  // realization of it, is what a FlashAttention backward's dsink may differ by.
  double dsink_rounding_bound = 0.0;
};

// reference::forward / backward (src/reference) returning vectors; `rows` as in reference::forward, rows not
// listed are 0.
ForwardResult reference_forward(const detail::Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const std::vector<int64_t>& rows = {});
Gradients reference_backward(const detail::Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dout);

}  // namespace flash4::check
