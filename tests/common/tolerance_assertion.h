// The tolerance rule (src/check/tolerance.h) as a gtest predicate, with the names tests use unqualified.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "check/attention_results.h"
#include "common/problem.h"
#include "check/naive_attention.h"
#include "check/tolerance.h"
#include "flash4/types.h"

namespace flash4::test {

using check::ForwardResult;
using check::Gradients;
using check::kExp2PolyRelativeError;
using check::max_abs;
using check::max_abs_error;
using check::naive_backward;
using check::naive_forward;
using check::reference_backward;
using check::reference_forward;

// EXPECT_TRUE(within_tolerance("out", impl, ref, naive, dtype)); extra_atol adds a documented allowance.
::testing::AssertionResult within_tolerance(const std::string& what, const std::vector<double>& impl,
                                            const std::vector<double>& ref, const std::vector<double>& naive,
                                            DType dtype, double extra_atol = 0.0);

// The gradients of problem `p` (dq, dk, dv, and dsink when `dsink` is not null) against the reference and the
// naive baseline on the same inputs, `out` (the stored output the backward was given) included; failures name
// `case_name`. dsink sums a term per row of the attention dtype's precision: judged at that dtype's atol plus the
// bound of what the stored O's rounding does to it through D (Gradients::dsink_rounding_bound).
::testing::AssertionResult check_gradients(const detail::Problem& p, DType dtype, const std::vector<double>& q,
                                           const std::vector<double>& k, const std::vector<double>& v,
                                           const std::vector<double>& out, const std::vector<double>& dout,
                                           const std::vector<double>& dq, const std::vector<double>& dk,
                                           const std::vector<double>& dv,
                                           const std::vector<double>* dsink, const std::string& case_name);

}  // namespace flash4::test
