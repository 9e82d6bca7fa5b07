// CPU backward (dq, dk, dv) vs the fp64 reference with the tolerance rule, on the forward's own out and LSE.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "api/backends.h"
#include "common/attention_case.h"
#include "common/problem_builder.h"
#include "common/varlen_case.h"

namespace flash4::test {
namespace {

constexpr DType kF32 = DType::kFloat32, kF16 = DType::kFloat16, kBF16 = DType::kBFloat16;

std::vector<CaseSpec> backward_cases() {
  std::vector<CaseSpec> c;
  for (DType t : {kF32, kF16, kBF16}) {
    c.push_back(make_spec(1, 1, 1, 1, 1, 64, t));
    c.push_back(make_spec(2, 17, 17, 2, 2, 64, t));
    c.push_back(with(make_spec(1, 150, 90, 4, 1, 64, t), [](CaseSpec& s) { s.causal = true; }));   // sq > sk, MQA
    c.push_back(with(make_spec(1, 90, 200, 8, 2, 64, t), [](CaseSpec& s) { s.causal = true; }));   // sq < sk, GQA 4:1
    c.push_back(with(make_spec(2, 70, 85, 2, 1, 64, t), [](CaseSpec& s) { s.layout = Layout::kStrided; }));
    // Stride 1 on extent-1 dimensions (batch, kv heads): legal, never stepped.
    c.push_back(with(make_spec(1, 40, 50, 2, 1, 64, t), [](CaseSpec& s) { s.layout = Layout::kUnitDimStride1; }));
    // k and v broadcast over the batch and the kv heads (stride 0, as torch's expand makes).
    c.push_back(with(make_spec(3, 40, 50, 4, 2, 64, t), [](CaseSpec& s) { s.broadcast_kv = true, s.causal = true; }));
  }
  for (int64_t d : {32, 96, 128, 256}) c.push_back(make_spec(1, 100, 120, 2, 1, d, kBF16));
  c.push_back(with(make_spec(1, 1000, 1000, 1, 1, 64, kBF16), [](CaseSpec& s) { s.causal = true; }));
  c.push_back(make_spec(1, 300, 1000, 1, 1, 64, kF32));
  c.push_back(with(make_spec(1, 200, 200, 2, 2, 64, kF32), [](CaseSpec& s) { s.window_left = 30, s.window_right = 5; }));
  c.push_back(with(make_spec(1, 200, 150, 2, 1, 64, kBF16), [](CaseSpec& s) { s.window_left = 50, s.causal = true; }));
  for (DType t : {kF32, kBF16}) {
    c.push_back(with(make_spec(1, 130, 140, 2, 1, 64, t), [](CaseSpec& s) { s.softcap = 5.0f, s.input_stddev = 3.0; }));
  }
  // Learnable sink (dsink checked too): GQA + causal with key-less rows, softcap, strided, a dominant sink.
  for (DType t : {kF32, kBF16}) {
    c.push_back(with(make_spec(1, 150, 60, 8, 2, 64, t), [](CaseSpec& s) { s.sink = true, s.causal = true; }));
    c.push_back(with(make_spec(2, 70, 85, 2, 1, 64, t), [](CaseSpec& s) {
      s.sink = true, s.softcap = 5.0f, s.layout = Layout::kStrided;
    }));
  }
  c.push_back(with(make_spec(1, 100, 100, 2, 2, 64, kBF16), [](CaseSpec& s) { s.sink = true, s.sink_offset = 8.0; }));
  // Odd GQA groups (the dK / dV sums over 3, 5, 7 query heads) and windows wider than the sequence.
  for (int64_t group : {3, 5, 7}) {
    c.push_back(with(make_spec(1, 67, 131, group, 1, 32, kBF16), [](CaseSpec& s) { s.causal = true; }));
  }
  c.push_back(with(make_spec(1, 90, 20, 6, 2, 32, kF32), [](CaseSpec& s) {
    s.causal = true, s.window_left = std::numeric_limits<int>::max();
  }));
  c.push_back(with(make_spec(1, 20, 90, 2, 1, 32, kF32), [](CaseSpec& s) {
    s.window_left = 0, s.window_right = std::numeric_limits<int>::max();
  }));
  return c;
}

class CpuBackward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuBackward, MatchesReference) {
  const CaseSpec& s = GetParam();
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(s, rng, true);
  const ForwardArgs fwd = t.forward_args(s);
  detail::cpu_forward(fwd, make_problem(fwd));
  const BackwardArgs bwd = t.backward_args(s);
  detail::cpu_backward(bwd, make_problem(bwd));
  EXPECT_TRUE(check_backward(s, t));
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuBackward, ::testing::ValuesIn(backward_cases()),
                         [](const auto& info) { return info.param.name(); });

// Fully masked query rows (causal, sq > sk) contribute nothing: their dq is exactly 0, every gradient finite.
TEST(CpuBackwardMasked, FullyMaskedRowsGiveZeroFiniteGradients) {
  FLASH4_TEST_RNG(rng);
  const CaseSpec s = with(make_spec(1, 80, 16, 2, 1, 32, kBF16), [](CaseSpec& c) { c.causal = true; });
  AttentionTensors t = make_tensors(s, rng, true);
  const ForwardArgs fwd = t.forward_args(s);
  detail::cpu_forward(fwd, make_problem(fwd));
  const BackwardArgs bwd = t.backward_args(s);
  detail::cpu_backward(bwd, make_problem(bwd));
  const std::vector<double> dq = t.dq->to_double();
  for (int64_t i = 0; i < 80; ++i)
    for (int64_t x = 0; x < 2 * 32; ++x) {
      const double g = dq[i * 64 + x];
      ASSERT_TRUE(std::isfinite(g)) << "row " << i;
      if (i < 80 - 16) {
        ASSERT_EQ(g, 0.0) << "row " << i;
      }
    }
  for (double g : t.dk->to_double()) ASSERT_TRUE(std::isfinite(g));
  for (double g : t.dv->to_double()) ASSERT_TRUE(std::isfinite(g));
  EXPECT_TRUE(check_backward(s, t));
}

// The CPU path sums in a fixed order: two runs give bit-identical gradients (what `deterministic` promises).
TEST(CpuBackwardDeterminism, RepeatedRunsAreBitIdentical) {
  FLASH4_TEST_RNG(rng);
  CaseSpec s = with(make_spec(2, 150, 150, 4, 1, 64, kF32), [](CaseSpec& c) { c.causal = true; });
  AttentionTensors t = make_tensors(s, rng, true);
  const ForwardArgs fwd = t.forward_args(s);
  detail::cpu_forward(fwd, make_problem(fwd));
  BackwardArgs bwd = t.backward_args(s);
  bwd.deterministic = true;
  detail::cpu_backward(bwd, make_problem(bwd));
  const std::vector<double> dq = t.dq->to_double(), dk = t.dk->to_double(), dv = t.dv->to_double();
  t.dq->poison();
  t.dk->poison();
  t.dv->poison();
  detail::cpu_backward(bwd, make_problem(bwd));
  EXPECT_EQ(t.dq->to_double(), dq);
  EXPECT_EQ(t.dk->to_double(), dk);
  EXPECT_EQ(t.dv->to_double(), dv);
}

// The single-pass schedule (one task per (batch, kv head) computing dQ with dK and dV) and the two passes give
// the same bits on every backward case and on packed batches; MatchesReference checks whichever the thread count
// picks against the reference, so both are held to it.
std::vector<double> gradient_bits(HostTensor& dq, HostTensor& dk, HostTensor& dv, const BackwardArgs& args,
                                  const detail::Problem& p, detail::CpuBackwardPasses passes) {
  for (HostTensor* g : {&dq, &dk, &dv}) g->poison();
  detail::cpu_backward(args, p, passes);
  std::vector<double> all;
  for (HostTensor* g : {&dq, &dk, &dv}) {
    const std::vector<double> x = g->to_double();
    all.insert(all.end(), x.begin(), x.end());
  }
  return all;
}

// EXPECT_EQ on doubles fails on NaN == NaN; a poisoned (never written) element must fail anyway, so compare bits.
::testing::AssertionResult same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0 || std::isnan(a[i]))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " and " << b[i];
  }
  return ::testing::AssertionSuccess();
}

// The forward, then the backward under both schedules, of a case's tensors (AttentionTensors or VarlenTensors).
template <class Spec, class Tensors>
void expect_schedules_agree(const Spec& s, Tensors& t) {
  const ForwardArgs fwd = t.forward_args(s);
  detail::cpu_forward(fwd, make_problem(fwd));
  const BackwardArgs bwd = t.backward_args(s);
  const detail::Problem p = make_problem(bwd);
  const std::vector<double> two = gradient_bits(*t.dq, *t.dk, *t.dv, bwd, p, detail::CpuBackwardPasses::kTwo);
  EXPECT_TRUE(same_bits(gradient_bits(*t.dq, *t.dk, *t.dv, bwd, p, detail::CpuBackwardPasses::kSingle), two))
      << s.name();
}

TEST(CpuBackwardSchedules, SinglePassGivesTheTwoPassBits) {
  FLASH4_TEST_RNG(rng);
  for (const CaseSpec& s : backward_cases()) {
    AttentionTensors t = make_tensors(s, rng, true);
    expect_schedules_agree(s, t);
  }
}

TEST(CpuBackwardSchedules, SinglePassGivesTheTwoPassBitsOnPackedBatches) {
  FLASH4_TEST_RNG(rng);
  std::vector<VarlenSpec> specs(3);
  specs[0].seqlens_q = {0, 1, 130, 17}, specs[0].seqlens_k = {5, 1, 130, 300};
  specs[0].heads = 6, specs[0].heads_kv = 2, specs[0].causal = true, specs[0].pad_q = 3, specs[0].pad_k = 2;
  specs[1].seqlens_q = {70, 64, 9}, specs[1].seqlens_k = {70, 64, 200};
  specs[1].seqused_q = {50, 64, 0}, specs[1].seqused_k = {70, 1, 150};
  specs[1].heads = 3, specs[1].heads_kv = 1, specs[1].window_left = 20, specs[1].sink = true;
  specs[2].seqlens_q = {129, 3}, specs[2].seqlens_k = {129, 3};
  specs[2].heads = 2, specs[2].heads_kv = 2, specs[2].softcap = 5.0f, specs[2].dtype = kF32, specs[2].head_dim = 96;
  for (const VarlenSpec& s : specs) {
    VarlenTensors t = make_varlen_tensors(s, rng, true);
    expect_schedules_agree(s, t);
  }
}

}  // namespace
}  // namespace flash4::test
