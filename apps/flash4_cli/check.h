// `flash4 run --check`: compares a run's results with the fp64 reference and judges them with the tolerance rule
// of src/check (the one the tests use). Prints the report; returns true on PASS.
#pragma once

#include <vector>

#include "flash4/api.h"

namespace flash4_cli {

// A run's tensors on the host as fp64 (the dtype's values, exactly), contiguous in the public layouts.
struct HostResults {
  std::vector<double> q, k, v, out, lse;  // forward (lse always present)
  std::vector<double> dout, dq, dk, dv;   // backward only
};

// `args` are the run's (valid) arguments: they give the problem, the dtype and the exp2 mode.
bool check_forward(const flash4::ForwardArgs& args, const HostResults& r);
bool check_backward(const flash4::BackwardArgs& args, const HostResults& r);

}  // namespace flash4_cli
