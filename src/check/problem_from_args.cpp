#include "check/problem_from_args.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace flash4::check {
namespace {

detail::Problem problem_from(const TensorView& q, const TensorView& k, const TensorView& v, float scale, bool causal,
                             int left, int right, float softcap) {
  detail::Problem p;
  p.head_dim_v = v.shape[v.rank - 1];
  if (q.rank == 3) {  // packed (total, heads, head_dim): the sizes along the tokens come from the offsets
    p.heads = q.shape[1];
    p.head_dim = q.shape[2];
    p.heads_kv = k.shape[1];
  } else {
    p.batch = q.shape[0];
    p.seqlen_q = q.shape[1];
    p.heads = q.shape[2];
    p.head_dim = q.shape[3];
    p.seqlen_k = k.shape[1];
    p.heads_kv = k.shape[2];
  }
  // The default scale is computed in double and rounded once, as src/api/validate.cpp does.
  p.softmax_scale = scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
  p.softcap = softcap;
  p.causal = causal;
  p.window_left = left;
  p.window_right = right;
  if (causal) p.window_right = right < 0 ? 0 : std::min(right, 0);  // causal = "no key right of the diagonal"
  return p;
}

// The packed layout, seqused and the sink, as validation fills them (the pointers are the arguments' own).
template <typename Args>
detail::Problem with_sequences(detail::Problem p, const Args& a) {
  if (a.cu_seqlens_q.data != nullptr) {
    p.batch = a.cu_seqlens_q.shape[0] - 1;
    p.seqlen_q = a.max_seqlen_q;
    p.seqlen_k = a.max_seqlen_k;
    p.total_q = a.q.shape[0];
    p.total_k = a.k.shape[0];
    p.cu_seqlens_q = static_cast<const int*>(a.cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const int*>(a.cu_seqlens_k.data);
  } else {
    p.total_q = p.batch * p.seqlen_q;
    p.total_k = p.batch * p.seqlen_k;
  }
  p.seqused_q = static_cast<const int*>(a.seqused_q.data);
  p.seqused_k = static_cast<const int*>(a.seqused_k.data);
  p.learnable_sink = static_cast<const float*>(a.learnable_sink.data);
  return p;
}

}  // namespace

detail::Problem make_problem(const ForwardArgs& a) {
  detail::Problem p = with_sequences(
      problem_from(a.q, a.k, a.v, a.softmax_scale, a.causal, a.window_left, a.window_right, a.softcap), a);
  // FP8's descale factors, as validation fills them (null data = 1).
  for (const auto& [t, slot] : {std::pair{&a.q_descale, &p.q_descale}, std::pair{&a.k_descale, &p.k_descale},
                                std::pair{&a.v_descale, &p.v_descale}})
    if (t->data != nullptr) *slot = detail::Descale{static_cast<const float*>(t->data), t->stride[0], t->stride[1]};
  return p;
}

detail::Problem make_problem(const BackwardArgs& a) {
  return with_sequences(
      problem_from(a.q, a.k, a.v, a.softmax_scale, a.causal, a.window_left, a.window_right, a.softcap), a);
}

}  // namespace flash4::check
