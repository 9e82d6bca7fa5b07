// The tolerance rule shared by CPU and GPU tests (FlashAttention 3's rule):
//
//   max |impl - ref| <= 2 * max |naive - ref| + atol
//
// ref is the fp64 reference (src/reference) on the same dtype-valued inputs; naive is the naive same-dtype
// baseline (naive_baseline.h); atol = kAtolRelative(dtype) * max |ref| covers what the baseline cannot see: the
// fp32 accumulation of a fused kernel versus the baseline's exact sums (for fp32 outputs and the fp32 LSE the
// baseline error is a single rounding and would otherwise leave no room at all). max |ref| is floored at 1, the
// scale of the inputs: a result that is small through cancellation still carries errors of its terms' size.
// Use DType::kFloat32 for LSE.
// Infinities compare equal only to the same infinity (a fully masked row's LSE is -inf); NaN never passes.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "flash4/types.h"

namespace flash4::test {

// Largest |a - b|; +inf on a NaN, a size mismatch or an infinity matched by anything but itself.
double max_abs_error(const std::vector<double>& a, const std::vector<double>& b);

// Largest finite |x| (0 when none).
double max_abs(const std::vector<double>& x);

// atol of the rule for outputs of `dtype` whose reference is `ref`.
double default_atol(DType dtype, const std::vector<double>& ref);

// Relative error bound of the polynomial exp2 (tests/cpu/test_exp2_poly.cpp enforces it). An implementation
// that uses it perturbs every P by up to this factor, which no same-dtype baseline does: outputs may move by
// ~2x this times max |out| and the LSE by this much, absolutely. Matters for fp32 only.
inline constexpr double kExp2PolyRelativeError = 1e-4;

// gtest predicate: EXPECT_TRUE(within_tolerance("out", impl, ref, naive, dtype)); extra_atol adds to atol.
::testing::AssertionResult within_tolerance(const std::string& what, const std::vector<double>& impl,
                                            const std::vector<double>& ref, const std::vector<double>& naive,
                                            DType dtype, double extra_atol = 0.0);

}  // namespace flash4::test
