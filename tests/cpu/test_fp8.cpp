// The FP8 (float8_e4m3fn) forward on the CPU: E4M3 conversions, then forward(out, lse) through the public API
// against the fp64 reference of the dequantized inputs (FP8 value * descale), judged by the tolerance rule with
// the naive FP8 attention as the baseline (src/check/naive_fp8_attention.h): dense and packed, causal, window,
// softcap, GQA, the sink, split head dims, bf16 and fp16 outputs, with and without descale factors. Also: the
// FP8 path equals the fp32 path on the dequantized values bit for bit, and the rule catches a dropped descale.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/fp8_case.h"

namespace flash4::test {
namespace {

TEST(E4m3, EveryCodeRoundTripsAndRoundingIsToNearestEven) {
  for (int b = 0; b < 256; ++b) {
    const float f = e4m3_bits_to_float(static_cast<uint8_t>(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << b;
      continue;
    }
    EXPECT_EQ(float_to_e4m3_bits(f), b == 0x80 ? 0x80 : b) << b << " = " << f;
  }
  EXPECT_EQ(e4m3_bits_to_float(0x7e), 448.0f);      // largest finite
  EXPECT_EQ(e4m3_bits_to_float(0x01), 0x1p-9f);     // smallest subnormal
  EXPECT_EQ(e4m3_bits_to_float(0x08), 0x1p-6f);     // smallest normal
  EXPECT_EQ(round_to_e4m3(1.0625f), 1.0f);          // tie between 1 and 1.125: the even code
  EXPECT_EQ(round_to_e4m3(1.1875f), 1.25f);         // tie between 1.125 and 1.25: the even code
  EXPECT_EQ(round_to_e4m3(0x1p-10f), 0.0f);         // half the smallest subnormal: to zero (even)
  EXPECT_EQ(round_to_e4m3(3 * 0x1p-10f), 0x1p-8f);  // tie between 2^-9 and 2^-8: the even code
  EXPECT_EQ(round_to_e4m3(-0.3f), -0.3125f);
  EXPECT_EQ(round_to_e4m3(1000.0f), 448.0f);  // saturates
  EXPECT_EQ(round_to_e4m3(-1e30f), -448.0f);
  EXPECT_TRUE(std::isnan(round_to_e4m3(std::nanf(""))));
}

std::vector<Fp8Spec> fp8_cases() {
  std::vector<Fp8Spec> c;
  c.push_back(fp8_spec(1, 1, 1, 1, 64, 64));
  c.push_back(fp8_spec(70, 90, 4, 2, 128, 128));
  c.push_back(fp8_with(fp8_spec(130, 100, 4, 1, 128, 128), [](Fp8Spec& s) { s.causal = true, s.out = DType::kFloat16; }));
  c.push_back(fp8_with(fp8_spec(100, 120, 2, 2, 256, 256), [](Fp8Spec& s) { s.window_left = 20, s.window_right = 3; }));
  c.push_back(fp8_with(fp8_spec(80, 80, 2, 1, 64, 64), [](Fp8Spec& s) { s.softcap = 10.0f, s.causal = true; }));
  c.push_back(fp8_with(fp8_spec(60, 50, 4, 2, 96, 96), [](Fp8Spec& s) { s.sink = true, s.causal = true; }));
  c.push_back(fp8_with(fp8_spec(70, 70, 4, 2, 192, 128), [](Fp8Spec& s) { s.causal = true; }));
  c.push_back(fp8_with(fp8_spec(65, 65, 2, 2, 128, 128), [](Fp8Spec& s) { s.descale = false; }));
  c.push_back(fp8_with(fp8_spec(0, 0, 4, 2, 128, 128), [](Fp8Spec& s) {  // packed: 3 segments, one empty
    s.lens_q = {40, 0, 70}, s.lens_k = {50, 9, 65}, s.seqlen_q = 70, s.seqlen_k = 65, s.causal = true, s.sink = true;
  }));
  return c;
}

// gtest prints a parameter with this (its name) instead of a byte dump.
void PrintTo(const Fp8Spec& s, std::ostream* os) { *os << s.name(); }

class CpuFp8Forward : public ::testing::TestWithParam<Fp8Spec> {};

TEST_P(CpuFp8Forward, MatchesReferenceOfDequantizedInputs) {
  FLASH4_TEST_RNG(rng);
  Fp8Problem t(GetParam(), rng);
  forward(t.args);
  EXPECT_TRUE(check_fp8(t, t.out_values(), t.lse_values()));
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuFp8Forward, ::testing::ValuesIn(fp8_cases()),
                         [](const auto& info) { return info.param.name(); });

// Dequantize-then-compute: the FP8 call gives bit for bit what the fp32 call gives on the dequantized values
// (each an fp32 product, as the CPU path forms it), once that fp32 output is rounded to bf16.
TEST(CpuFp8Forward, EqualsTheFp32PathOnDequantizedValues) {
  FLASH4_TEST_RNG(rng);
  Fp8Problem t(fp8_with(fp8_spec(90, 110, 4, 2, 128, 64), [](Fp8Spec& s) { s.causal = true; }), rng);
  forward(t.args);
  auto fp32 = [&](const std::vector<uint8_t>& x, const std::vector<float>& descale,
                  const std::vector<int64_t>& entry, int64_t heads, int64_t dim) {
    std::vector<float> f(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t h = static_cast<int64_t>(i) / dim % heads, row = static_cast<int64_t>(i) / dim / heads;
      f[i] = e4m3_bits_to_float(x[i]) * descale[entry[row] * t.s.heads_kv + h / (heads / t.s.heads_kv)];
    }
    return f;
  };
  std::vector<float> q = fp32(t.q, t.q_descale, t.entry_q, 4, 128), k = fp32(t.k, t.k_descale, t.entry_k, 2, 128);
  std::vector<float> v = fp32(t.v, t.v_descale, t.entry_k, 2, 64), out(t.out.size()), lse(t.lse.size());
  ForwardArgs a = t.args;
  a.q = make_view(q.data(), DType::kFloat32, Device::cpu(), 2, 90, 4, 128);
  a.k = make_view(k.data(), DType::kFloat32, Device::cpu(), 2, 110, 2, 128);
  a.v = make_view(v.data(), DType::kFloat32, Device::cpu(), 2, 110, 2, 64);
  a.out = make_view(out.data(), DType::kFloat32, Device::cpu(), 2, 90, 4, 64);
  a.lse = make_view(lse.data(), DType::kFloat32, Device::cpu(), 2, 4, 90);
  a.q_descale = a.k_descale = a.v_descale = TensorView{};
  forward(a);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(t.out[i], float_to_bf16_bits(out[i])) << i;
  EXPECT_EQ(t.lse, lse);
}

// The rule has teeth: an output computed without v's descale (every value off by its factor) fails it.
TEST(CpuFp8Forward, TheRuleCatchesADroppedDescale) {
  FLASH4_TEST_RNG(rng);
  Fp8Problem t(fp8_spec(64, 64, 2, 1, 64, 64), rng);
  t.args.v_descale = TensorView{};
  forward(t.args);
  EXPECT_FALSE(check_fp8(t, t.out_values(), t.lse_values()));
  // Also against the GPU kernels' baseline, whose tensor-core model is looser.
  EXPECT_FALSE(check_fp8(t, t.out_values(), t.lse_values(), check::Fp8Arithmetic::hopper_tensor_cores()));
}

// The baseline's tensor-core model (naive_fp8_attention.h), on inputs built to show each of its two effects.
// One query, no descales, head dim 64 (scale 1/8).
struct TinyFp8 {
  Fp8Problem t;
  explicit TinyFp8(int64_t keys, Rng& rng) : t(fp8_with(fp8_spec(1, keys, 1, 1, 64, 64), [](Fp8Spec& s) {
                                                  s.batch = 1, s.descale = false;
                                                }), rng) {
    std::fill(t.q.begin(), t.q.end(), uint8_t{0});
    std::fill(t.k.begin(), t.k.end(), uint8_t{0});
    std::fill(t.v.begin(), t.v.end(), uint8_t{0});
  }
  ForwardResult naive(check::Fp8Arithmetic a) const {
    return check::naive_fp8_forward(check::make_problem(t.args), t.s.out, t.real_q(), t.real_k(), t.real_v(), {}, a);
  }
};

// S = 1 * 1 + 2^-7 * 2^-7: the second product lies 14 bits below the first, past the 13 fraction bits a k-step
// keeps, so the tensor-core model drops it; fp32 keeps it. One key: lse = S / 8.
TEST(NaiveFp8Model, AKStepKeepsThirteenBitsBelowItsLargestProduct) {
  FLASH4_TEST_RNG(rng);
  TinyFp8 c(1, rng);
  c.t.q[0] = c.t.k[0] = float_to_e4m3_bits(1.0f);
  c.t.q[1] = c.t.k[1] = float_to_e4m3_bits(0x1p-7f);
  EXPECT_EQ(c.naive(check::Fp8Arithmetic::fp32()).lse[0], static_cast<double>((1.0f + 0x1p-14f) / 8));
  EXPECT_EQ(c.naive(check::Fp8Arithmetic::hopper_tensor_cores()).lse[0], 0.125);
}

// Key 128 (the last 128-key tile, walked first) scores 0, key 0 scores 3, keys 1..127 -56: the row max grows by
// 3 / ln 2 < 8 (log2), so the tiled model keeps key 128's reference and key 0's numerator e^3 = 20.09 is rounded
// to E4M3's 20; with the row's max as reference (fp32 model) it is 1, exact. v = 1 on key 0 only: out = P~0 / l.
TEST(NaiveFp8Model, ALaggingReferenceMaxRoundsTheLargestNumerator) {
  FLASH4_TEST_RNG(rng);
  TinyFp8 c(129, rng);
  c.t.q[0] = float_to_e4m3_bits(1.0f);
  c.t.k[0] = float_to_e4m3_bits(24.0f);
  for (int64_t j = 1; j < 128; ++j) c.t.k[j * 64] = float_to_e4m3_bits(-448.0f);
  for (int64_t x = 0; x < 64; ++x) c.t.v[x] = float_to_e4m3_bits(1.0f);
  const double l = 1.0 + std::exp(3.0);  // keys 1..127 add e^-59 each
  EXPECT_NEAR(c.naive(check::Fp8Arithmetic::fp32()).out[0], bf16_bits_to_float(float_to_bf16_bits(
                                                                static_cast<float>(std::exp(3.0) / l))), 1e-9);
  EXPECT_NEAR(c.naive(check::Fp8Arithmetic::hopper_tensor_cores()).out[0],
              bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(20.0 / l))), 1e-9);
}

}  // namespace
}  // namespace flash4::test
