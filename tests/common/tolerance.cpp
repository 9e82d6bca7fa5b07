#include "common/tolerance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace flash4::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// atol relative to the largest reference value. fp32: 2^-16 leaves room for fp32 sums over thousands of terms
// (~100 ulp); fp16 / bf16: a quarter ulp of the largest value, i.e. far below the baseline's own rounding.
double atol_relative(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 0x1p-12;
    case DType::kBFloat16:
      return 0x1p-9;
    case DType::kFloat32:
      break;
  }
  return 0x1p-16;
}

// Local name table: the library's dtype_name lives in the API layer, which these helpers need not link.
const char* name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat32:
      break;
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

double default_atol(DType dtype, const std::vector<double>& ref) {
  return atol_relative(dtype) * std::max(max_abs(ref), 1.0);
}

::testing::AssertionResult within_tolerance(const std::string& what, const std::vector<double>& impl,
                                            const std::vector<double>& ref, const std::vector<double>& naive,
                                            DType dtype, double extra_atol) {
  const double err = max_abs_error(impl, ref), base = max_abs_error(naive, ref);
  const double atol = default_atol(dtype, ref) + extra_atol;
  const double tol = 2.0 * base + atol;
  std::ostringstream msg;
  msg << what << " (" << name(dtype) << "): max error " << err << ", naive baseline " << base
      << ", atol " << atol << ", tolerance " << tol;
  if (err <= tol) return ::testing::AssertionSuccess() << msg.str();
  return ::testing::AssertionFailure() << msg.str();
}

}  // namespace flash4::test
