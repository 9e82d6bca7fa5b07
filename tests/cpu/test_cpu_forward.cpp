// CPU forward vs the fp64 reference, with the tolerance rule (src/check/tolerance.h), over shapes, masks,
// softcap, GQA, head dims, dtypes, strides and both exp2 modes.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "api/backends.h"
#include "common/attention_case.h"
#include "common/problem_builder.h"

namespace flash4::test {
namespace {

constexpr DType kF32 = DType::kFloat32, kF16 = DType::kFloat16, kBF16 = DType::kBFloat16;
constexpr int kMax = std::numeric_limits<int>::max();  // the widest window

std::vector<CaseSpec> forward_cases() {
  std::vector<CaseSpec> c;
  for (DType t : {kF32, kF16, kBF16}) {
    c.push_back(make_spec(1, 1, 1, 1, 1, 64, t));          // one query, one key
    c.push_back(make_spec(2, 17, 17, 3, 3, 64, t));        // tails smaller than a tile
    c.push_back(make_spec(1, 200, 130, 4, 1, 64, t));      // sq > sk, MQA
    c.push_back(with(make_spec(1, 200, 130, 2, 2, 64, t), [](CaseSpec& s) { s.causal = true; }));  // masked rows
    c.push_back(with(make_spec(1, 100, 300, 8, 2, 64, t), [](CaseSpec& s) { s.causal = true; }));  // sq < sk, GQA 4:1
  }
  for (int64_t d : {32, 64, 96, 128, 256}) c.push_back(make_spec(1, 130, 150, 2, 1, d, kBF16));
  c.push_back(make_spec(1, 1000, 1000, 1, 1, 64, kF32));
  c.push_back(with(make_spec(1, 1000, 1000, 2, 1, 128, kBF16), [](CaseSpec& s) { s.causal = true; }));
  // Windows: both bounds, left only, right only, a single diagonal, and one combined with causal.
  c.push_back(with(make_spec(1, 300, 300, 2, 2, 64, kF32), [](CaseSpec& s) { s.window_left = 40, s.window_right = 7; }));
  c.push_back(with(make_spec(1, 300, 200, 2, 2, 64, kF16), [](CaseSpec& s) { s.window_left = 100; }));
  c.push_back(with(make_spec(1, 150, 300, 2, 2, 64, kBF16), [](CaseSpec& s) { s.window_right = 3; }));
  c.push_back(with(make_spec(1, 129, 129, 1, 1, 64, kF32), [](CaseSpec& s) { s.window_left = 0, s.window_right = 0; }));
  c.push_back(with(make_spec(1, 256, 256, 2, 1, 64, kBF16), [](CaseSpec& s) { s.causal = true, s.window_left = 70; }));
  // Windows wider than the sequence (no bound in effect), up to int32's limit, in both length orders.
  c.push_back(with(make_spec(1, 90, 20, 2, 1, 32, kF32), [](CaseSpec& s) {
    s.window_left = 99, s.window_right = kMax;
  }));
  c.push_back(with(make_spec(1, 90, 20, 2, 1, 32, kF16), [](CaseSpec& s) { s.causal = true, s.window_left = kMax; }));
  c.push_back(with(make_spec(1, 20, 90, 2, 1, 32, kBF16), [](CaseSpec& s) { s.window_right = kMax; }));
  // GQA groups of odd sizes (3, 5, 7 query heads per key/value head), both length orders.
  for (int64_t group : {3, 5, 7}) {
    c.push_back(with(make_spec(2, 67, 131, 2 * group, 2, 32, kBF16), [](CaseSpec& s) { s.causal = true; }));
    c.push_back(make_spec(1, 131, 67, group, 1, 32, kF32));
  }
  // Softcap: large inputs so tanh saturates and the cap matters.
  for (DType t : {kF32, kBF16}) {
    c.push_back(with(make_spec(1, 150, 170, 2, 1, 64, t), [](CaseSpec& s) {
      s.softcap = 5.0f, s.input_stddev = 3.0, s.causal = true;
    }));
  }
  // Strided (non-contiguous) layouts.
  for (DType t : {kF32, kF16, kBF16}) {
    c.push_back(with(make_spec(2, 77, 91, 4, 2, 64, t), [](CaseSpec& s) { s.layout = Layout::kStrided; }));
    // k and v broadcast over the batch and the kv heads (stride 0, as torch's expand makes).
    c.push_back(with(make_spec(3, 50, 70, 4, 2, 64, t), [](CaseSpec& s) { s.broadcast_kv = true; }));
  }
  // Polynomial exp2.
  for (DType t : {kF32, kBF16}) {
    c.push_back(with(make_spec(1, 300, 300, 2, 1, 128, t), [](CaseSpec& s) { s.tuning.exp2 = Exp2Mode::kPolynomial; }));
  }
  c.push_back(with(make_spec(1, 200, 260, 2, 2, 64, kF16), [](CaseSpec& s) {
    s.tuning.exp2 = Exp2Mode::kPolynomial, s.causal = true, s.softcap = 10.0f;
  }));
  // Learnable sink: plain, GQA + causal with key-less rows (lse = sink there), window + softcap, a dominant sink.
  for (DType t : {kF32, kBF16}) {
    c.push_back(with(make_spec(2, 77, 91, 4, 2, 64, t), [](CaseSpec& s) { s.sink = true; }));
    c.push_back(with(make_spec(1, 150, 60, 8, 2, 64, t), [](CaseSpec& s) { s.sink = true, s.causal = true; }));
  }
  c.push_back(with(make_spec(1, 200, 200, 2, 1, 128, kF16), [](CaseSpec& s) {
    s.sink = true, s.window_left = 30, s.window_right = 0, s.softcap = 10.0f, s.input_stddev = 3.0;
  }));
  c.push_back(with(make_spec(1, 100, 100, 2, 2, 64, kBF16), [](CaseSpec& s) { s.sink = true, s.sink_offset = 8.0; }));
  // The decode route (cpu_decode_route: at most 16 queries, a KV head's query rows in one 64-row tile): GQA
  // decode with split keys, speculative steps with causal + window, 64 rows with softcap and sink, k / v
  // broadcast, strided views, and causal rows with no key.
  c.push_back(with(make_spec(3, 1, 2000, 32, 8, 128, kBF16), [](CaseSpec& s) { s.causal = true; }));
  c.push_back(with(make_spec(2, 5, 700, 12, 4, 64, kF16), [](CaseSpec& s) { s.causal = true, s.window_left = 100; }));
  c.push_back(with(make_spec(1, 16, 900, 4, 1, 96, kF32), [](CaseSpec& s) { s.softcap = 5.0f, s.sink = true; }));
  c.push_back(with(make_spec(3, 2, 300, 4, 2, 64, kBF16), [](CaseSpec& s) { s.broadcast_kv = true; }));
  c.push_back(with(make_spec(2, 3, 400, 6, 3, 128, kBF16), [](CaseSpec& s) {
    s.layout = Layout::kStrided, s.causal = true;
  }));
  c.push_back(with(make_spec(1, 12, 5, 4, 2, 64, kF32), [](CaseSpec& s) { s.causal = true; }));
  // seqlen 4096 on sampled rows.
  c.push_back(with(make_spec(1, 4096, 4096, 1, 1, 64, kBF16), [](CaseSpec& s) { s.checked_rows = 48; }));
  c.push_back(with(make_spec(1, 4096, 4096, 1, 1, 128, kF32), [](CaseSpec& s) {
    s.checked_rows = 48, s.causal = true, s.tuning.exp2 = Exp2Mode::kPolynomial;
  }));
  return c;
}

class CpuForward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuForward, MatchesReference) {
  const CaseSpec& s = GetParam();
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(s, rng, false);
  const ForwardArgs args = t.forward_args(s);
  detail::cpu_forward(args, make_problem(args));
  EXPECT_TRUE(check_forward(s, t, rng));
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuForward, ::testing::ValuesIn(forward_cases()),
                         [](const auto& info) { return info.param.name(); });

// Causal with seqlen_q > seqlen_k leaves the first sq - sk rows without keys: out must be exactly 0 and the
// LSE -inf (the tolerance check above also covers them, this states the contract explicitly).
TEST(CpuForwardMasked, FullyMaskedRowsAreZeroWithMinusInfLse) {
  FLASH4_TEST_RNG(rng);
  CaseSpec s = make_spec(1, 90, 20, 2, 1, 32, DType::kBFloat16);
  s.causal = true;
  AttentionTensors t = make_tensors(s, rng, false);
  const ForwardArgs args = t.forward_args(s);
  detail::cpu_forward(args, make_problem(args));
  const std::vector<double> out = t.out.to_double(), lse = t.lse.to_double();
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 90; ++i) {
      const bool masked = i < 90 - 20;
      EXPECT_EQ(std::isinf(lse[h * 90 + i]) && lse[h * 90 + i] < 0, masked) << "row " << i;
      for (int64_t x = 0; x < 32; ++x) {
        const double o = out[(i * 2 + h) * 32 + x];
        if (masked) {
          EXPECT_EQ(o, 0.0) << "row " << i;
        } else {
          EXPECT_TRUE(std::isfinite(o)) << "row " << i;
        }
      }
    }
  }
}

// A window whose right bound lies left of key 0 for the first rows (diag + right < 0): those rows are fully
// masked without `causal`.
TEST(CpuForwardMasked, WindowWithNoKeysForSomeRows) {
  FLASH4_TEST_RNG(rng);
  CaseSpec s = make_spec(1, 64, 30, 1, 1, 64, DType::kFloat32);
  s.window_left = 3;
  s.window_right = 2;  // diag = i - 34: rows i < 32 see nothing
  AttentionTensors t = make_tensors(s, rng, false);
  const ForwardArgs args = t.forward_args(s);
  detail::cpu_forward(args, make_problem(args));
  EXPECT_TRUE(check_forward(s, t, rng));
  EXPECT_EQ(t.lse.to_double()[0], -std::numeric_limits<double>::infinity());
}

// Without an LSE tensor the output is identical and the LSE buffer is not touched.
TEST(CpuForwardOptions, LseIsOptional) {
  FLASH4_TEST_RNG(rng);
  const CaseSpec s = make_spec(1, 70, 70, 2, 2, 64, DType::kFloat16);
  AttentionTensors t = make_tensors(s, rng, false);
  ForwardArgs with_lse = t.forward_args(s);
  detail::cpu_forward(with_lse, make_problem(with_lse));
  const std::vector<double> expected = t.out.to_double();
  t.out.poison();
  t.lse.poison();
  ForwardArgs args = t.forward_args(s);
  args.lse = TensorView{};
  args.lse.rank = 3;
  detail::cpu_forward(args, make_problem(args));
  EXPECT_EQ(t.out.to_double(), expected);
  for (double x : t.lse.to_double()) ASSERT_TRUE(std::isnan(x));
}

// The decode route with seqused_k: each sequence attends to its first seqused_k keys (causal aligned to them), as
// a call on those keys alone; a sequence using none gets out 0 and lse -inf. Also without an LSE tensor.
TEST(CpuForwardDecodeRoute, SequsedKIsACallOnTheUsedKeys) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  constexpr int64_t kBatch = 3, kSq = 2, kSk = 500, kHeads = 8, kHeadsKv = 2, kD = 64;
  const std::vector<int> used = {500, 37, 0};
  std::vector<float> q(kBatch * kSq * kHeads * kD), k(kBatch * kSk * kHeadsKv * kD), v(k.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  std::vector<float> out(q.size(), -1.0f), lse(kBatch * kHeads * kSq, -1.0f);
  const Device cpu = Device::cpu();
  ForwardArgs a;
  a.q = make_view(q.data(), kF32, cpu, kBatch, kSq, kHeads, kD);
  a.k = make_view(k.data(), kF32, cpu, kBatch, kSk, kHeadsKv, kD);
  a.v = make_view(v.data(), kF32, cpu, kBatch, kSk, kHeadsKv, kD);
  a.out = make_view(out.data(), kF32, cpu, kBatch, kSq, kHeads, kD);
  a.lse = make_view(lse.data(), kF32, cpu, kBatch, kHeads, kSq);
  a.seqused_k = make_view(const_cast<int*>(used.data()), DType::kInt32, cpu, kBatch);
  a.causal = true;
  ASSERT_TRUE(detail::cpu_decode_route(a, make_problem(a)));
  flash4::forward(a);
  for (int64_t b = 0; b < kBatch; ++b) {
    const int64_t q_at = b * kSq * kHeads * kD;
    if (used[b] == 0) {
      for (int64_t i = 0; i < kSq * kHeads * kD; ++i) ASSERT_EQ(out[q_at + i], 0.0f) << "sequence " << b;
      for (int64_t i = 0; i < kHeads * kSq; ++i) ASSERT_EQ(lse[b * kHeads * kSq + i], -INFINITY) << "sequence " << b;
      continue;
    }
    std::vector<float> o(kSq * kHeads * kD), l(kHeads * kSq);
    ForwardArgs one;
    one.q = make_view(q.data() + q_at, kF32, cpu, 1, kSq, kHeads, kD);
    one.k = a.k, one.v = a.v;  // sequence b's first used[b] keys, rows kSk * kHeadsKv * kD apart per sequence
    one.k.data = k.data() + b * kSk * kHeadsKv * kD, one.v.data = v.data() + b * kSk * kHeadsKv * kD;
    one.k.shape[0] = one.v.shape[0] = 1;
    one.k.shape[1] = one.v.shape[1] = used[b];
    one.out = make_view(o.data(), kF32, cpu, 1, kSq, kHeads, kD);
    one.lse = make_view(l.data(), kF32, cpu, 1, kHeads, kSq);
    one.causal = true;
    flash4::forward(one);
    for (int64_t i = 0; i < kSq * kHeads * kD; ++i) ASSERT_NEAR(out[q_at + i], o[i], 1e-5) << "sequence " << b;
    for (int64_t i = 0; i < kHeads * kSq; ++i) ASSERT_NEAR(lse[b * kHeads * kSq + i], l[i], 1e-5) << "sequence " << b;
  }
  const std::vector<float> with_lse = out;
  std::fill(out.begin(), out.end(), -1.0f);
  a.lse = TensorView{};
  a.lse.rank = 3;
  flash4::forward(a);
  EXPECT_EQ(out, with_lse);
}

}  // namespace
}  // namespace flash4::test
