// FA4's conditional rescaling: the decision rule itself, and its equivalence with classic online softmax
// (rescale on every max increase) on adversarial inputs and on huge score ranges.
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "api/backends.h"
#include "common/attention_case.h"
#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"
#include "cpu/online_softmax.h"
#include "cpu/tile_config.h"

namespace flash4::test {
namespace {

using cpu::OnlineSoftmaxRow;

TEST(ConditionalRescaleRule, KeepsReferenceMaxWithinThreshold) {
  OnlineSoftmaxRow row;
  EXPECT_EQ(row.update(3.0f, true), 1.0f);  // first tile sets m_ref
  EXPECT_EQ(row.m_ref, 3.0f);
  row.l = 5.0f;
  EXPECT_EQ(row.update(3.0f + 7.9f, true), 1.0f);  // grows by < 8: no rescale
  EXPECT_EQ(row.m_ref, 3.0f);
  EXPECT_EQ(row.l, 5.0f);
  EXPECT_EQ(row.update(1.0f, true), 1.0f);  // shrinks: never rescale
  const float factor = row.update(3.0f + 8.5f, true);  // grows by > 8: rescale by 2^-8.5
  EXPECT_FLOAT_EQ(factor, std::exp2(-8.5f));
  EXPECT_EQ(row.m_ref, 11.5f);
  EXPECT_FLOAT_EQ(row.l, 5.0f * std::exp2(-8.5f));
}

TEST(ConditionalRescaleRule, AlwaysModeRescalesOnEveryIncrease) {
  OnlineSoftmaxRow row;
  row.update(0.0f, false);
  row.l = 1.0f;
  EXPECT_FLOAT_EQ(row.update(0.5f, false), std::exp2(-0.5f));
  EXPECT_EQ(row.m_ref, 0.5f);
  EXPECT_EQ(row.update(0.25f, false), 1.0f);
}

TEST(ConditionalRescaleRule, LseOfEmptyRowIsMinusInf) {
  const OnlineSoftmaxRow row;
  EXPECT_EQ(row.lse(), -std::numeric_limits<float>::infinity());
}

struct Outputs {
  std::vector<double> out, lse;
};

Outputs run(const CaseSpec& s, AttentionTensors& t, bool conditional) {
  ForwardArgs args = t.forward_args(s);
  args.tuning.conditional_rescale = conditional;
  t.out.poison();
  t.lse.poison();
  detail::cpu_forward(args, make_problem(args));
  return {t.out.to_double(), t.lse.to_double()};
}

// Inputs whose scores grow linearly along the keys by `growth_per_tile` log2 units per K tile: the row max rises
// on every tile, so the conditional rule rescales on every tile (growth > 8) or every few tiles (growth < 8),
// with P up to 2^8 in between.
CaseSpec ramp_inputs(AttentionTensors& t, const CaseSpec& s, double growth_per_tile, Rng& rng) {
  const int64_t d = s.head_dim;
  std::vector<double> q = t.q.to_double(), k = t.k.to_double();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double slope = growth_per_tile / cpu::kBlockN / (scale * cpu::kLog2e);  // score increase per key
  for (int64_t i = 0; i < s.seqlen_q; ++i) {
    for (int64_t x = 0; x < d; ++x) q[i * d + x] = x == 0 ? 1.0 : 0.1 * rng.normal();
  }
  for (int64_t j = 0; j < s.seqlen_k; ++j) {
    for (int64_t x = 0; x < d; ++x) k[j * d + x] = x == 0 ? slope * j : 0.1 * rng.normal();
  }
  t.q.assign(q);
  t.k.assign(k);
  return s;
}

class AdversarialRamp : public ::testing::TestWithParam<double> {};

TEST_P(AdversarialRamp, ConditionalEqualsAlwaysRescale) {
  FLASH4_TEST_RNG(rng);
  CaseSpec s;
  s.seqlen_q = 40;
  s.seqlen_k = 64 * 20;
  s.head_dim = 64;
  s.dtype = DType::kFloat32;
  AttentionTensors t = make_tensors(s, rng, false);
  ramp_inputs(t, s, GetParam(), rng);
  const Outputs cond = run(s, t, true);
  const Outputs always = run(s, t, false);
  // Against the reference: the ramp makes scores reach ~growth * 20 in log2 units, where each fp32 operation on a
  // score (dot product, scaling, max subtraction) costs an ulp of that size in P's exponent, which the
  // once-rounded baseline does not see; allow 8 such ulps on top of the rule.
  const detail::Problem p = make_problem(t.forward_args(s));
  const std::vector<double> q = t.q.to_double(), k = t.k.to_double(), v = t.v.to_double();
  const ForwardResult ref = reference_forward(p, q, k, v), naive = naive_forward(p, s.dtype, q, k, v);
  const double score_ulps = 8.0 * 0x1p-23 * GetParam() * 20 * max_abs(ref.out);
  EXPECT_TRUE(within_tolerance("out, conditional", cond.out, ref.out, naive.out, s.dtype, score_ulps));
  EXPECT_TRUE(within_tolerance("out, always", always.out, ref.out, naive.out, s.dtype, score_ulps));
  EXPECT_TRUE(within_tolerance("lse, conditional", cond.lse, ref.lse, naive.lse, s.dtype, 8.0 * 0x1p-23 * GetParam() * 20));
  // Both are exact algorithms; they differ only by fp32 rounding of the rescale factors.
  EXPECT_LE(max_abs_error(cond.out, always.out), 1e-5 * max_abs(always.out));
  EXPECT_LE(max_abs_error(cond.lse, always.lse), 1e-5 * max_abs(always.lse));
}

// 7.99: the max grows every tile but stays under the threshold for one tile; 8.01 and 40: a rescale per tile.
INSTANTIATE_TEST_SUITE_P(GrowthPerTile, AdversarialRamp, ::testing::Values(2.0, 7.99, 8.01, 40.0));

// Scores spanning ~1e4 (softmax_scale 1, large inputs): no overflow, no NaN, and the same answer either way.
// fp32 scores of that size carry ~1e-3 absolute rounding error, so the comparison with the fp64 reference uses
// a tolerance derived from that instead of the generic rule.
TEST(HugeScoreRange, FiniteAndEqualToAlwaysRescale) {
  FLASH4_TEST_RNG(rng);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    CaseSpec s;
    s.seqlen_q = 100;
    s.seqlen_k = 700;
    s.heads = 2;
    s.head_dim = 64;
    s.dtype = dtype;
    s.softmax_scale = 1.0f;
    s.input_stddev = 12.0;  // q.k ~ 144 * 8 per std, extremes beyond 1e4 apart
    s.causal = true;
    AttentionTensors t = make_tensors(s, rng, false);
    const Outputs cond = run(s, t, true);
    const Outputs always = run(s, t, false);
    for (double x : cond.out) ASSERT_TRUE(std::isfinite(x));
    for (double x : cond.lse) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LE(max_abs_error(cond.out, always.out), 1e-4 * max_abs(always.out));
    EXPECT_LE(max_abs_error(cond.lse, always.lse), 1e-6 * max_abs(always.lse));

    const ForwardResult ref = reference_forward(make_problem(t.forward_args(s)), t.q.to_double(), t.k.to_double(),
                                                t.v.to_double());
    double spread = 0.0;
    for (size_t i = 0; i < ref.lse.size(); ++i)
      for (size_t j = i + 1; j < ref.lse.size() && j < i + 50; ++j) spread = std::max(spread, std::abs(ref.lse[i] - ref.lse[j]));
    EXPECT_GT(spread, 1e3) << "inputs do not span a huge score range";
    const double score_error = 1e-6 * max_abs(ref.lse);  // a few fp32 ulp of the largest scores
    EXPECT_LE(max_abs_error(cond.lse, ref.lse), 10 * score_error + 1e-4);
    EXPECT_LE(max_abs_error(cond.out, ref.out), 0.05 * max_abs(ref.out));
  }
}

}  // namespace
}  // namespace flash4::test
