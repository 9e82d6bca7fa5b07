#include "check/tolerance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace flash4::check {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// atol as a fraction of max |ref|: for fp16 / bf16 the dtype's unit roundoff (half an ulp at 1), the rounding
// every implementation gives its output; the baseline's rounding is a random draw that over few output elements
// can fall well below it (docs/numerics.md: FA4's conditional rescaling rounds P against a stale row maximum).
// fp32 2^-16 leaves room for fp32 sums over thousands of terms, which the baseline's exact sums do not show. The
// polynomial exp2's room, exp2_poly_*_allowance, is added only where that exp2 runs.
double atol_fraction(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 0x1p-11;
    case DType::kBFloat16: return 0x1p-8;
    case DType::kFloat8E4M3: return 0x1p-5;  // never an output dtype (FP8 forwards write bf16 / fp16)
    case DType::kFloat32:
    case DType::kInt32: break;  // index tensors are never judged; treat like fp32
  }
  return 0x1p-16;
}

// Local name table: the library's dtype_name lives in the API layer, which this library need not link.
const char* name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kInt32: return "int32";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
    case DType::kFloat32: break;
  }
  return "fp32";
}

}  // namespace

double max_abs_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return kInf;
  double err = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return kInf;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return kInf;
      continue;
    }
    err = std::max(err, std::abs(a[i] - b[i]));
  }
  return err;
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  return m;
}

// max |ref| is floored at 1, the scale of the inputs: a result that is small through cancellation (a gradient
// that is exactly 0 in exact arithmetic) still carries errors of its terms' size.
double atol(DType dtype, const std::vector<double>& ref) { return atol_fraction(dtype) * std::max(max_abs(ref), 1.0); }

double exp2_poly_out_allowance(const std::vector<double>& ref_out) {
  return 2.0 * kExp2PolyRelativeError * max_abs(ref_out);
}

double exp2_poly_lse_allowance() { return kExp2PolyRelativeError; }

std::string Verdict::describe(const std::string& what, DType dtype) const {
  char numbers[160];
  std::snprintf(numbers, sizeof(numbers), "max error %.4g, naive baseline %.4g, atol %.4g, tolerance %.4g", error,
                baseline_error, atol, limit);
  return what + " (" + name(dtype) + "): " + numbers;
}

Verdict judge(const std::vector<double>& impl, const std::vector<double>& ref, const std::vector<double>& naive,
              DType dtype, double extra_atol) {
  Verdict v;
  v.error = max_abs_error(impl, ref);
  v.baseline_error = max_abs_error(naive, ref);
  v.atol = atol(dtype, ref) + extra_atol;
  v.limit = kBaselineFactor * v.baseline_error + v.atol;
  // An unbounded limit (the baseline disagrees with the reference in size, NaN or an infinity) judges nothing.
  v.pass = std::isfinite(v.limit) && v.error <= v.limit;
  return v;
}

}  // namespace flash4::check
