#include "common/tolerance_assertion.h"

namespace flash4::test {

::testing::AssertionResult within_tolerance(const std::string& what, const std::vector<double>& impl,
                                            const std::vector<double>& ref, const std::vector<double>& naive,
                                            DType dtype, double extra_atol) {
  const check::Verdict v = check::judge(impl, ref, naive, dtype, extra_atol);
  if (v.pass) return ::testing::AssertionSuccess() << v.describe(what, dtype);
  return ::testing::AssertionFailure() << v.describe(what, dtype);
}

}  // namespace flash4::test
