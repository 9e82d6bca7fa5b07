// `flash4 run --check`: compares a run's results with the fp64 reference and judges them against a naive
// same-dtype attention (naive_attention.h). Prints the report; returns true on PASS.
#pragma once

#include <vector>

#include "common/problem.h"
#include "flash4/types.h"

namespace flash4_cli {

// A run's tensors on the host as fp64 (the dtype's values, exactly), contiguous in the public layouts.
struct HostResults {
  std::vector<double> q, k, v, out, lse;  // forward (lse always present)
  std::vector<double> dout, dq, dk, dv;   // backward only
};

bool check_forward(const flash4::detail::Problem& p, flash4::DType dtype, const HostResults& r);
bool check_backward(const flash4::detail::Problem& p, flash4::DType dtype, const HostResults& r);

}  // namespace flash4_cli
