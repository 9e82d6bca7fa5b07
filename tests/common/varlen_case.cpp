#include "common/varlen_case.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"

namespace flash4::test {
namespace {

int64_t sum(const std::vector<int>& x) { return std::accumulate(x.begin(), x.end(), int64_t{0}); }
int64_t longest(const std::vector<int>& x) { return std::max<int64_t>(1, x.empty() ? 1 : *std::max_element(x.begin(), x.end())); }

// A packed (total, heads, head_dim) tensor in the spec's layout.
HostTensor packed(DType dtype, int64_t total, int64_t heads, int64_t head_dim, Layout layout) {
  HostTensor t(dtype, 1, total, heads, head_dim, layout);
  t.drop_leading_dim();
  return t;
}

HostTensor int_vector(const std::vector<int>& values) {
  HostTensor t = HostTensor::vector(DType::kInt32, static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), static_cast<int*>(t.data()));
  return t;
}

// Sets the rows of a packed tensor that no sequence uses to NaN: in segment b the rows from used[b] on (none when
// `used` is empty), and every row after the last segment.
void nan_unused_rows(HostTensor& t, const std::vector<int>& lengths, const std::vector<int>& used, int64_t total) {
  std::vector<double> x = t.to_double();
  const int64_t row = static_cast<int64_t>(x.size()) / std::max<int64_t>(total, 1);
  auto poison = [&](int64_t from, int64_t to) {
    std::fill(x.begin() + from * row, x.begin() + to * row, std::nan(""));
  };
  int64_t start = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (!used.empty()) poison(start + std::min(used[b], lengths[b]), start + lengths[b]);
    start += lengths[b];
  }
  poison(start, total);
  t.assign(x);
}

std::vector<int> offsets(const std::vector<int>& lengths) {
  std::vector<int> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];
  return cu;
}

template <typename Args>
void fill_sequence_fields(Args& a, const VarlenSpec& s, const VarlenTensors& t) {
  a.cu_seqlens_q = t.cu_seqlens_q.view();
  a.cu_seqlens_k = t.cu_seqlens_k.view();
  a.max_seqlen_q = s.max_seqlen_q();
  a.max_seqlen_k = s.max_seqlen_k();
  if (t.seqused_q) a.seqused_q = t.seqused_q->view();
  if (t.seqused_k) a.seqused_k = t.seqused_k->view();
  if (t.sink) a.learnable_sink = t.sink->view();
  a.softmax_scale = 0.0f;
  a.causal = s.causal;
  a.window_left = s.window_left;
  a.window_right = s.window_right;
  a.softcap = s.softcap;
}

}  // namespace

int64_t VarlenSpec::total_q() const { return sum(seqlens_q) + pad_q; }
int64_t VarlenSpec::total_k() const { return sum(seqlens_k) + pad_k; }
int64_t VarlenSpec::max_seqlen_q() const { return longest(seqlens_q); }
int64_t VarlenSpec::max_seqlen_k() const { return longest(seqlens_k); }

std::string VarlenSpec::name() const {
  std::string n = "varlen_b" + std::to_string(batch()) + "_tq" + std::to_string(total_q()) + "_tk" +
                  std::to_string(total_k()) + "_h" + std::to_string(heads) + "_hkv" + std::to_string(heads_kv) +
                  "_d" + std::to_string(head_dim) +
                  (value_dim() != head_dim ? "_dv" + std::to_string(value_dim()) : std::string()) + "_" +
                  dtype_name(dtype);
  if (causal) n += "_causal";
  if (window_left >= 0 || window_right >= 0)
    n += "_winl" + std::to_string(std::max(window_left, -1) + 1) + "r" + std::to_string(window_right + 1);  // +1: no '-' 
  if (softcap > 0.0f) n += "_softcap" + std::to_string(static_cast<int>(softcap));
  if (!seqused_q.empty()) n += "_usedq";
  if (!seqused_k.empty()) n += "_usedk";
  if (sink) n += "_sink";
  if (deterministic) n += "_det";
  if (layout == Layout::kStrided) n += "_strided";
  if (pad_q > 0 || pad_k > 0) n += "_pad";
  if (nan_unused_keys) n += "_nankeys";
  if (nan_unused_queries) n += "_nanqueries";
  return n;
}

void PrintTo(const VarlenSpec& spec, std::ostream* os) { *os << spec.name(); }

ForwardArgs VarlenTensors::forward_args(const VarlenSpec& s) const {
  ForwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  fill_sequence_fields(a, s, *this);
  return a;
}

BackwardArgs VarlenTensors::backward_args(const VarlenSpec& s) const {
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
  if (dsink) a.dsink = dsink->view();
  a.deterministic = s.deterministic;
  fill_sequence_fields(a, s, *this);
  return a;
}

VarlenTensors make_varlen_tensors(const VarlenSpec& s, Rng& rng, bool backward) {
  const int64_t tq = s.total_q(), tk = s.total_k();
  HostTensor lse = HostTensor::lse(1, s.heads, tq);
  lse.drop_leading_dim();
  VarlenTensors t{packed(s.dtype, tq, s.heads, s.head_dim, s.layout),
                  packed(s.dtype, tk, s.heads_kv, s.head_dim, s.layout),
                  packed(s.dtype, tk, s.heads_kv, s.value_dim(), s.layout),
                  packed(s.dtype, tq, s.heads, s.value_dim(), s.layout),
                  std::move(lse),
                  int_vector(offsets(s.seqlens_q)),
                  int_vector(offsets(s.seqlens_k)),
                  std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                  std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  if (!s.seqused_q.empty()) t.seqused_q = int_vector(s.seqused_q);
  if (!s.seqused_k.empty()) t.seqused_k = int_vector(s.seqused_k);
  t.q.fill_normal(rng, s.input_stddev);
  t.k.fill_normal(rng, s.input_stddev);
  t.v.fill_normal(rng);
  if (s.nan_unused_keys) {
    nan_unused_rows(t.k, s.seqlens_k, s.seqused_k, tk);
    nan_unused_rows(t.v, s.seqlens_k, s.seqused_k, tk);
  }
  if (s.nan_unused_queries) nan_unused_rows(t.q, s.seqlens_q, s.seqused_q, tq);
  t.out.poison();
  t.lse.poison();
  if (s.sink) {
    t.sink = HostTensor::vector(DType::kFloat32, s.heads);
    std::vector<double> values(static_cast<size_t>(s.heads));
    for (double& x : values) x = rng.normal() + s.sink_offset;
    t.sink->assign(values);
  }
  if (backward) {
    t.dout.emplace(packed(s.dtype, tq, s.heads, s.value_dim(), s.layout));
    t.dq.emplace(packed(s.dtype, tq, s.heads, s.head_dim, s.layout));
    t.dk.emplace(packed(s.dtype, tk, s.heads_kv, s.head_dim, s.layout));
    t.dv.emplace(packed(s.dtype, tk, s.heads_kv, s.value_dim(), s.layout));
    t.dout->fill_normal(rng);
    if (s.nan_unused_queries) nan_unused_rows(*t.dout, s.seqlens_q, s.seqused_q, tq);
    t.dq->poison();
    t.dk->poison();
    t.dv->poison();
    if (s.sink) {
      t.dsink = HostTensor::vector(DType::kFloat32, s.heads);
      t.dsink->poison();
    }
  }
  return t;
}

::testing::AssertionResult check_varlen_forward(const VarlenSpec& s, const VarlenTensors& t) {
  const detail::Problem p = make_problem(t.forward_args(s));
  const std::vector<double> q = t.q.to_double(), k = t.k.to_double(), v = t.v.to_double();
  const ForwardResult ref = reference_forward(p, q, k, v);
  const ForwardResult naive = naive_forward(p, s.dtype, q, k, v);
  auto out = within_tolerance("out", t.out.to_double(), ref.out, naive.out, s.dtype);
  if (!out) return out << " [" << s.name() << "]";
  auto lse = within_tolerance("lse", t.lse.to_double(), ref.lse, naive.lse, DType::kFloat32);
  if (!lse) return lse << " [" << s.name() << "]";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult check_varlen_backward(const VarlenSpec& s, const VarlenTensors& t) {
  const std::vector<double> dsink = s.sink ? t.dsink->to_double() : std::vector<double>{};
  return check_gradients(make_problem(t.forward_args(s)), s.dtype, t.q.to_double(), t.k.to_double(), t.v.to_double(),
                         t.out.to_double(), t.dout->to_double(), t.dq->to_double(), t.dk->to_double(),
                         t.dv->to_double(), s.sink ? &dsink : nullptr, s.name());
}

}  // namespace flash4::test
