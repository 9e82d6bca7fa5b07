// The tolerance rule (src/check/tolerance.h) as a gtest predicate, with the names tests use unqualified.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "check/attention_results.h"
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

}  // namespace flash4::test
