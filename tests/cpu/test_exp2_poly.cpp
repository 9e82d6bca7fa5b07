// The FMA-pipe exp2 polynomial (src/common/exp2_poly.h), the CPU's vectorizable copy of it, and the CPU's
// accurate exp2 (src/cpu/exp2_row.h).
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/exp2_poly.h"
#include "common/float_convert.h"
#include "cpu/exp2_row.h"
#include "cpu/score_transform.h"

namespace flash4 {
namespace {

// Dense sweep over the inputs the softmax produces, [lo, 8] in steps of 2^-12 (~550k points), which hits every
// fraction pattern of each integer part many times.
std::vector<float> sweep(int lo) {
  std::vector<float> xs;
  for (int64_t i = lo * 4096; i <= 8 * 4096; ++i) xs.push_back(static_cast<float>(i) / 4096.0f);
  return xs;
}

// For x in [-127, -126) the result 2^x is below fp32's normal range and the exponent trick yields a subnormal
// pattern (or 0): relative error is meaningless there, the absolute error is below 2^-126, which no softmax
// sum (>= 1) can see. Relative accuracy is therefore checked on [-126, 8] and the bottom binade absolutely.
constexpr int kNormalLo = -126;

TEST(Exp2Poly, MaxRelativeErrorBelow1e4) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x : sweep(kNormalLo)) {
    const double exact = std::exp2(static_cast<double>(x));
    const double rel = std::abs(exp2_poly_host(x) - exact) / exact;
    if (rel > worst) worst = rel, worst_x = x;
  }
  EXPECT_LE(worst, 1e-4) << "at x = " << worst_x;
  EXPECT_GT(worst, 1e-6) << "suspiciously exact: is the polynomial being tested at all?";
}

TEST(Exp2Poly, BottomBinadeHasTinyAbsoluteError) {
  for (int64_t i = -127 * 4096; i < kNormalLo * 4096; ++i) {
    const float x = static_cast<float>(i) / 4096.0f;
    ASSERT_LE(std::abs(exp2_poly_host(x) - std::exp2(static_cast<double>(x))), 0x1p-126) << "x = " << x;
  }
}

TEST(Exp2Poly, Bf16RoundedResultsMostlyMatchCorrectlyRounded) {
  int64_t equal = 0, total = 0;
  for (float x : sweep(kNormalLo)) {
    const uint16_t poly = float_to_bf16_bits(exp2_poly_host(x));
    const uint16_t exact = float_to_bf16_bits(static_cast<float>(std::exp2(static_cast<double>(x))));
    equal += poly == exact;
    ++total;
  }
  EXPECT_GE(static_cast<double>(equal) / total, 0.99) << equal << " of " << total;
}

TEST(Exp2Poly, ExactAtIntegersAndClampedBelowMinus127) {
  for (int e = -126; e <= 8; ++e) EXPECT_EQ(exp2_poly_host(static_cast<float>(e)), std::ldexp(1.0f, e)) << e;
  EXPECT_EQ(exp2_poly_host(-1000.0f), exp2_poly_host(-127.0f));
  EXPECT_TRUE(std::isfinite(exp2_poly_host(-1000.0f)));
  // NaN propagates (and is not converted to an integer on the way: undefined behaviour), in both versions.
  EXPECT_TRUE(std::isnan(exp2_poly_host(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(cpu::exp2_poly_vectorizable(std::numeric_limits<float>::quiet_NaN())));
}

// Bit-identical on the sweep and edge values. Excluded: -2^-26 < x < 0, where exp2_poly_host's "exact in double"
// sum x + 1.5*2^23 is not exact and rounds up to 1.5*2^23 (floor 0, result 1.0), while add.rm on the GPU and
// the CPU's floor give floor -1 (result 0.99991). Both are within the polynomial's error.
TEST(Exp2Poly, CpuVectorizableVersionIsBitIdentical) {
  std::vector<float> xs = sweep(-127);
  for (float x : {-1000.0f, -127.5f, -126.99999f, -0.0f, 1e-30f, -0x1p-26f, 7.9999995f, 8.0f}) xs.push_back(x);
  std::vector<float> row(xs.size());
  cpu::exp2_row(xs.data(), 0.0f, row.data(), static_cast<int64_t>(xs.size()), true);
  for (size_t i = 0; i < xs.size(); ++i) {
    const float host = exp2_poly_host(xs[i]);
    uint32_t a, b;
    std::memcpy(&a, &host, 4);
    std::memcpy(&b, &row[i], 4);
    ASSERT_EQ(a, b) << "x = " << xs[i];
  }
}

// Distance from the correctly rounded 2^x in units in the last place of that value.
double ulps_from_exact(float got, float x) {
  const double exact = std::exp2(static_cast<double>(x));
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(exact)) - 23);
  return std::abs(static_cast<double>(got) - exact) / ulp;
}

// The CPU path's default exp2: within 1.3 ulp over the whole normal range, sampled at every 2^-12 of the
// softmax's inputs, every 2^-10 above 8, and in relative steps of 10^-4 and 10^-3 towards 0.
TEST(Exp2Accurate, WithinOneAndAThirdUlpOverTheNormalRange) {
  std::vector<float> xs = sweep(kNormalLo);
  for (float x = 8.0f; x < 128.0f; x += 0.0009765625f) xs.push_back(x);
  for (float x = -126.0f; x < -1e-30f; x -= x * 1e-4f) xs.push_back(x);
  for (float x = 1e-30f; x < 1.0f; x *= 1.001f) xs.push_back(x), xs.push_back(-x);
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x : xs) {
    const double u = ulps_from_exact(cpu::exp2_accurate(x), x);
    if (u > worst) worst = u, worst_x = x;
  }
  EXPECT_LE(worst, 1.3) << "at x = " << worst_x;
  EXPECT_GT(worst, 0.5) << "suspiciously exact: is the polynomial being tested at all?";
}

TEST(Exp2Accurate, EdgeValues) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int e = -126; e <= 127; ++e) EXPECT_EQ(cpu::exp2_accurate(static_cast<float>(e)), std::ldexp(1.0f, e)) << e;
  EXPECT_EQ(cpu::exp2_accurate(-0.0f), 1.0f);
  EXPECT_EQ(cpu::exp2_accurate(-kInf), 0.0f);
  EXPECT_EQ(cpu::exp2_accurate(-126.5f), 0.0f);  // below the normal range: flushed, as the GPU's ex2.approx.ftz
  EXPECT_EQ(cpu::exp2_accurate(-1e30f), 0.0f);
  EXPECT_EQ(cpu::exp2_accurate(kInf), kInf);
  EXPECT_EQ(cpu::exp2_accurate(128.0f), kInf);
  EXPECT_EQ(cpu::exp2_accurate(1e30f), kInf);
  for (float x : {127.5f, 127.75f, 127.99999f}) EXPECT_LE(ulps_from_exact(cpu::exp2_accurate(x), x), 1.3) << x;
  EXPECT_TRUE(std::isnan(cpu::exp2_accurate(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(cpu::exp2_accurate(-std::numeric_limits<float>::quiet_NaN())));
}

TEST(Exp2Accurate, ExactRowModeUsesIt) {
  std::vector<float> t = sweep(-20);
  std::vector<float> p(t.size());
  cpu::exp2_row(t.data(), 0.5f, p.data(), static_cast<int64_t>(t.size()), false);
  for (size_t i = 0; i < t.size(); ++i) ASSERT_LE(ulps_from_exact(p[i], t[i] - 0.5f), 1.3) << t[i];
}

// The softcap's tanh on the CPU (cpu/score_transform.h): the GPU's formula on exp2_accurate.
TEST(TanhFromExp2, AbsoluteErrorBelow3e7) {
  double worst = 0.0;
  float worst_y = 0.0f;
  for (int64_t i = -20 * 4096; i <= 20 * 4096; ++i) {
    const float y = static_cast<float>(i) / 4096.0f;
    const double err = std::abs(cpu::tanh_from_exp2(y) - std::tanh(static_cast<double>(y)));
    if (err > worst) worst = err, worst_y = y;
  }
  EXPECT_LE(worst, 3e-7) << "at y = " << worst_y;
  EXPECT_EQ(cpu::tanh_from_exp2(0.0f), 0.0f);
  EXPECT_EQ(cpu::tanh_from_exp2(1e30f), 1.0f);
  EXPECT_EQ(cpu::tanh_from_exp2(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_TRUE(std::isnan(cpu::tanh_from_exp2(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace flash4
