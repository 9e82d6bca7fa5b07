// The tolerance rule of every numerical check (tests and `flash4 run --check`), FlashAttention 3's rule:
//
//   max |impl - ref| <= kBaselineFactor * max |naive - ref| + atol
//
// ref is the fp64 reference (src/reference) on the same dtype-valued inputs; naive is the naive same-dtype
// baseline (naive_attention.h); atol (below) covers what the baseline cannot see. Compare the LSE with
// DType::kFloat32: it is fp32 in every API. Infinities compare equal only to the same infinity (a fully masked
// row's LSE is -inf); NaN never passes.
#pragma once

#include <string>
#include <vector>

#include "flash4/types.h"

namespace flash4::check {

// How far beyond the naive baseline's error an implementation may be.
inline constexpr double kBaselineFactor = 2.0;

// Relative error bound of the polynomial exp2 (tests/cpu/test_exp2_poly.cpp enforces it). An implementation
// that uses it perturbs every P by up to this factor, which no same-dtype baseline does; matters for fp32 only.
inline constexpr double kExp2PolyRelativeError = 1e-4;

// Largest |a - b|; +inf on a NaN, a size mismatch or an infinity matched by anything but itself.
double max_abs_error(const std::vector<double>& a, const std::vector<double>& b);

// Largest finite |x| (0 when none).
double max_abs(const std::vector<double>& x);

// The one atol of the rule for outputs of `dtype` whose reference is `ref`: a per-dtype fraction of max |ref|,
// max |ref| floored at 1 (see tolerance.cpp for the values and why).
double atol(DType dtype, const std::vector<double>& ref);

// What the polynomial exp2 may add to atol when the implementation used it: ~2x its relative error times
// max |out| for outputs, its relative error absolutely for the LSE.
double exp2_poly_out_allowance(const std::vector<double>& ref_out);
double exp2_poly_lse_allowance();

// One comparison under the rule, with the numbers that decided it.
struct Verdict {
  double error = 0.0;           // max |impl - ref|
  double baseline_error = 0.0;  // max |naive - ref|
  double atol = 0.0;            // atol(dtype, ref) + extra_atol
  double limit = 0.0;           // kBaselineFactor * baseline_error + atol
  bool pass = false;

  // "out (bf16): max error 1.2e-03, naive baseline 1.0e-03, atol 2.0e-03, tolerance 4.0e-03"
  std::string describe(const std::string& what, DType dtype) const;
};

// Judges impl against ref with the naive baseline; extra_atol adds a documented allowance to atol.
Verdict judge(const std::vector<double>& impl, const std::vector<double>& ref, const std::vector<double>& naive,
              DType dtype, double extra_atol = 0.0);

}  // namespace flash4::check
