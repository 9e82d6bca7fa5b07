#include "check/problem_from_args.h"

#include <algorithm>
#include <cmath>

namespace flash4::check {
namespace {

detail::Problem problem_from(const TensorView& q, const TensorView& k, float scale, bool causal, int left,
                             int right, float softcap) {
  detail::Problem p;
  p.batch = q.shape[0];
  p.seqlen_q = q.shape[1];
  p.heads = q.shape[2];
  p.head_dim = q.shape[3];
  p.seqlen_k = k.shape[1];
  p.heads_kv = k.shape[2];
  // The default scale is computed in double and rounded once, as src/api/validate.cpp does.
  p.softmax_scale = scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
  p.softcap = softcap;
  p.causal = causal;
  p.window_left = left;
  p.window_right = right;
  if (causal) p.window_right = right < 0 ? 0 : std::min(right, 0);  // causal = "no key right of the diagonal"
  return p;
}

}  // namespace

detail::Problem make_problem(const ForwardArgs& a) {
  return problem_from(a.q, a.k, a.softmax_scale, a.causal, a.window_left, a.window_right, a.softcap);
}

detail::Problem make_problem(const BackwardArgs& a) {
  return problem_from(a.q, a.k, a.softmax_scale, a.causal, a.window_left, a.window_right, a.softcap);
}

}  // namespace flash4::check
