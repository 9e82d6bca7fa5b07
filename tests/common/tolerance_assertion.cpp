#include "common/tolerance_assertion.h"

namespace flash4::test {

::testing::AssertionResult within_tolerance(const std::string& what, const std::vector<double>& impl,
                                            const std::vector<double>& ref, const std::vector<double>& naive,
                                            DType dtype, double extra_atol) {
  const check::Verdict v = check::judge(impl, ref, naive, dtype, extra_atol);
  if (v.pass) return ::testing::AssertionSuccess() << v.describe(what, dtype);
  return ::testing::AssertionFailure() << v.describe(what, dtype);
}

::testing::AssertionResult check_gradients(const detail::Problem& p, DType dtype, const std::vector<double>& q,
                                           const std::vector<double>& k, const std::vector<double>& v,
                                           const std::vector<double>& out, const std::vector<double>& dout,
                                           const std::vector<double>& dq, const std::vector<double>& dk,
                                           const std::vector<double>& dv,
                                           const std::vector<double>* dsink, const std::string& case_name) {
  const Gradients ref = reference_backward(p, q, k, v, dout);
  const Gradients naive = naive_backward(p, dtype, q, k, v, out, dout);
  const std::vector<double>* impls[] = {&dq, &dk, &dv};
  const std::vector<double>* refs[] = {&ref.dq, &ref.dk, &ref.dv};
  const std::vector<double>* naives[] = {&naive.dq, &naive.dk, &naive.dv};
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    auto res = within_tolerance(names[i], *impls[i], *refs[i], *naives[i], dtype);
    if (!res) return res << " [" << case_name << "]";
  }
  if (dsink != nullptr) {
    auto res = within_tolerance("dsink", *dsink, ref.dsink, naive.dsink, dtype, naive.dsink_rounding_bound);
    if (!res) return res << " [" << case_name << "]";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace flash4::test
