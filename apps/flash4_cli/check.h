// `flash4 run --check`: compares a run's results with the fp64 reference and judges them with the tolerance rule
// of src/check (the one the tests use). Prints the report; returns true on PASS.
#pragma once

#include <string>
#include <vector>

#include "flash4/api.h"

namespace flash4_cli {

// A run's tensors on the host as fp64 (the dtype's values, exactly), contiguous in the public layouts.
struct HostResults {
  std::vector<double> q, k, v, out, lse;  // forward (lse always present)
  std::vector<double> dout, dq, dk, dv;   // backward only
};

// Empty when check_backward can judge `args`' problem, else why not (too large for the fp64 reference): asked
// before the run, so that a check that cannot run is refused instead of reported.
std::string backward_check_refusal(const flash4::BackwardArgs& args);

// `args` are the run's (valid) arguments: they give the problem, the dtype and the exp2 mode.
bool check_forward(const flash4::ForwardArgs& args, const HostResults& r);
bool check_backward(const flash4::BackwardArgs& args, const HostResults& r);

}  // namespace flash4_cli
