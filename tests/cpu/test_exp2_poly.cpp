// The FMA-pipe exp2 polynomial (src/common/exp2_poly.h) and the CPU's vectorizable copy of it.
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/exp2_poly.h"
#include "common/float_convert.h"
#include "cpu/exp2_row.h"

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

TEST(Exp2Poly, ExactRowModeIsLibm) {
  const float t[3] = {-3.25f, 0.0f, 2.5f};
  float p[3];
  cpu::exp2_row(t, 0.5f, p, 3, false);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p[i], std::exp2(t[i] - 0.5f));
}

}  // namespace
}  // namespace flash4
