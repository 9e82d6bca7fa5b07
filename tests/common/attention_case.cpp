#include "common/attention_case.h"

#include <sstream>

#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"

namespace flash4::test {
namespace {

const char* short_name(DType t) { return t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16"; }

}  // namespace

CaseSpec make_spec(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads, int64_t heads_kv,
                   int64_t head_dim, DType dtype, bool causal) {
  CaseSpec s;
  s.batch = batch;
  s.seqlen_q = seqlen_q;
  s.seqlen_k = seqlen_k;
  s.heads = heads;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  s.dtype = dtype;
  s.causal = causal;
  return s;
}

std::string CaseSpec::name() const {
  std::ostringstream s;
  s << "b" << batch << "_sq" << seqlen_q << "_sk" << seqlen_k << "_h" << heads << "_hkv" << heads_kv << "_d"
    << head_dim;
  if (value_dim() != head_dim) s << "_dv" << value_dim();
  s << "_" << short_name(dtype);
  if (causal) s << "_causal";
  if (window_left >= 0 || window_right >= 0) {
    s << "_win" << (window_left < 0 ? "inf" : std::to_string(window_left)) << "_"
      << (window_right < 0 ? "inf" : std::to_string(window_right));
  }
  if (softcap > 0.0f) s << "_softcap" << static_cast<int>(softcap);
  if (layout == Layout::kStrided) s << "_strided";
  if (layout == Layout::kUnitDimStride1) s << "_unitstride1";
  if (broadcast_kv) s << "_broadcastkv";
  if (tuning.exp2 == Exp2Mode::kPolynomial) s << "_poly";
  if (!tuning.conditional_rescale) s << "_alwaysrescale";
  if (sink) s << "_sink";
  return s.str();
}

ForwardArgs AttentionTensors::forward_args(const CaseSpec& spec) const {
  ForwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.softmax_scale = spec.softmax_scale;
  a.causal = spec.causal;
  a.window_left = spec.window_left;
  a.window_right = spec.window_right;
  a.softcap = spec.softcap;
  a.tuning = spec.tuning;
  if (sink) a.learnable_sink = sink->view();
  return a;
}

BackwardArgs AttentionTensors::backward_args(const CaseSpec& spec) const {
  BackwardArgs a;
  a.dout = dout->view();
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.dq = dq->view();
  a.dk = dk->view();
  a.dv = dv->view();
  a.softmax_scale = spec.softmax_scale;
  a.causal = spec.causal;
  a.window_left = spec.window_left;
  a.window_right = spec.window_right;
  a.softcap = spec.softcap;
  if (sink) a.learnable_sink = sink->view();
  if (dsink) a.dsink = dsink->view();
  return a;
}

AttentionTensors make_tensors(const CaseSpec& s, Rng& rng, bool backward) {
  const Layout kv_layout = s.broadcast_kv ? Layout::kBroadcast : s.layout;
  AttentionTensors t{
      HostTensor(s.dtype, s.batch, s.seqlen_q, s.heads, s.head_dim, s.layout),
      HostTensor(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, kv_layout),
      HostTensor(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.value_dim(), kv_layout),
      HostTensor(s.dtype, s.batch, s.seqlen_q, s.heads, s.value_dim(), s.layout),
      HostTensor::lse(s.batch, s.heads, s.seqlen_q),
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  t.q.fill_normal(rng, s.input_stddev);
  t.k.fill_normal(rng, s.input_stddev);
  t.v.fill_normal(rng);
  t.out.poison();
  t.lse.poison();
  if (backward) {
    t.dout.emplace(s.dtype, s.batch, s.seqlen_q, s.heads, s.value_dim(), s.layout);
    t.dq.emplace(s.dtype, s.batch, s.seqlen_q, s.heads, s.head_dim, s.layout);
    t.dk.emplace(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, s.layout);
    t.dv.emplace(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.value_dim(), s.layout);
    t.dout->fill_normal(rng);
    t.dq->poison();
    t.dk->poison();
    t.dv->poison();
  }
  if (s.sink) {
    t.sink = HostTensor::vector(DType::kFloat32, s.heads);
    std::vector<double> values(static_cast<size_t>(s.heads));
    for (double& x : values) x = rng.normal() + s.sink_offset;
    t.sink->assign(values);
    if (backward) {
      t.dsink = HostTensor::vector(DType::kFloat32, s.heads);
      t.dsink->poison();
    }
  }
  return t;
}

::testing::AssertionResult check_forward(const CaseSpec& s, const AttentionTensors& t, Rng& rng) {
  const detail::Problem p = make_problem(t.forward_args(s));
  const std::vector<int64_t> rows = sample_rows(s.seqlen_q, s.checked_rows > 0 ? s.checked_rows : s.seqlen_q, rng);
  const std::vector<double> q = t.q.to_double(), k = t.k.to_double(), v = t.v.to_double();
  const ForwardResult ref = reference_forward(p, q, k, v, rows);
  const ForwardResult naive = naive_forward(p, s.dtype, q, k, v, rows);
  auto out_rows = [&](const std::vector<double>& x) {
    return gather_rows(x, s.batch, s.seqlen_q, s.heads, s.value_dim(), rows);
  };
  auto lse_rows = [&](const std::vector<double>& x) { return gather_rows(x, s.batch, s.seqlen_q, s.heads, 0, rows); };
  const std::vector<double> ref_out = out_rows(ref.out);
  // The polynomial exp2 is an approximation by design; allow its documented error on top of the rule.
  const bool poly = s.tuning.exp2 == Exp2Mode::kPolynomial;
  const double out_extra = poly ? check::exp2_poly_out_allowance(ref_out) : 0.0;
  const double lse_extra = poly ? check::exp2_poly_lse_allowance() : 0.0;
  auto out = within_tolerance("out", out_rows(t.out.to_double()), ref_out, out_rows(naive.out), s.dtype, out_extra);
  if (!out) return out << " [" << s.name() << "]";
  auto lse = within_tolerance("lse", lse_rows(t.lse.to_double()), lse_rows(ref.lse), lse_rows(naive.lse),
                              DType::kFloat32, lse_extra);
  if (!lse) return lse << " [" << s.name() << "]";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult check_backward(const CaseSpec& s, const AttentionTensors& t) {
  const std::vector<double> dsink = s.sink ? t.dsink->to_double() : std::vector<double>{};
  return check_gradients(make_problem(t.forward_args(s)), s.dtype, t.q.to_double(), t.k.to_double(), t.v.to_double(),
                         t.out.to_double(), t.dout->to_double(), t.dq->to_double(), t.dk->to_double(),
                         t.dv->to_double(), s.sink ? &dsink : nullptr, s.name());
}

}  // namespace flash4::test
