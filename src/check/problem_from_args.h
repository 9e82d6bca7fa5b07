// The normalized detail::Problem of valid public arguments, for the judges (reference, naive baseline) and for
// backend tests that call detail::cpu_forward / cpu_backward without the API layer. It does not validate:
// callers pass arguments that flash4::can_implement accepted. The problem keeps the arguments' pointers
// (cu_seqlens, seqused, learnable_sink): the judges need them host-resident.
#pragma once

#include "common/problem.h"
#include "flash4/api.h"

namespace flash4::check {

// As validation normalizes: scale 0 becomes 1/sqrt(head_dim), causal is folded into the window's right bound.
detail::Problem make_problem(const ForwardArgs& args);
detail::Problem make_problem(const BackwardArgs& args);

}  // namespace flash4::check
