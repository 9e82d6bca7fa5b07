// exp2 over a row of the softmax: accurate (within 1.3 ulp, vectorized) or by FA4's polynomial.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/exp2_poly.h"

namespace flash4::cpu {

// Same arithmetic as flash4::exp2_poly_host, bit for bit (tests/cpu/test_exp2_poly.cpp checks it), written so
// the loop vectorizes on x86-64-v2: floor via roundps (SSE4.1) instead of the 64-bit conversion, and floor(x)
// shifted into the exponent directly (the shifter's own bits fall off the top of (bits(r) << 23)).
inline float exp2_poly_vectorizable(float x) {
  x = x < kExp2PolyMinInput ? kExp2PolyMinInput : x;
  const float fl = std::floor(x);
  const float f = x - fl;  // == x - (r - 1.5*2^23) since r - 1.5*2^23 == floor(x) exactly
  float p = std::fma(kExp2PolyC3, f, kExp2PolyC2);
  p = std::fma(p, f, kExp2PolyC1);
  p = std::fma(p, f, kExp2PolyC0);
  int32_t pi;
  std::memcpy(&pi, &p, 4);
  const int32_t bits = static_cast<int32_t>(static_cast<uint32_t>(pi) + (static_cast<uint32_t>(fl == fl ? static_cast<int32_t>(fl) : 0) << 23));  // NaN: no UB, stays NaN
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// Minimax coefficients of 2^f on [-0.5, 0.5] for relative error (degree 6: 2e-9, below fp32's rounding).
inline constexpr float kExp2C1 = 0.6931471824645996f, kExp2C2 = 0.24022647738456726f,
                       kExp2C3 = 0.055503323674201965f, kExp2C4 = 0.00961843691766262f,
                       kExp2C5 = 0.0013398875016719103f, kExp2C6 = 0.00015353361959569156f;

// 2^x within 1.3 ulp of the correctly rounded value for x in [-126, 128) (1 ulp where the loop is compiled
// with FMA), in selects and arithmetic only so that a loop over it vectorizes (libm's exp2f is a call per
// element). Like the GPU's ex2.approx.ftz, results below 2^-126 flush to 0;
// +-inf and NaN behave as in libm. x + 1.5 * 2^23 rounds x to the nearest integer n in its low mantissa bits;
// 2^(x - n) comes from the polynomial, and n << 23 added to its bits scales it by 2^n (with x in [127.5, 128)
// the polynomial is below 1, so n = 128 still gives a finite exponent).
inline float exp2_accurate(float x) {
  const float xc = x < -127.0f ? -127.0f : (x > 128.0f ? 128.0f : x);
  const float r = xc + kRoundShifter;
  const float f = xc - (r - kRoundShifter);  // [-0.5, 0.5]
  float p = kExp2C6 * f + kExp2C5;
  p = p * f + kExp2C4;
  p = p * f + kExp2C3;
  p = p * f + kExp2C2;
  p = p * f + kExp2C1;
  p = p * f + 1.0f;
  uint32_t p_bits, r_bits;
  std::memcpy(&p_bits, &p, 4);
  std::memcpy(&r_bits, &r, 4);
  const uint32_t bits = p_bits + (r_bits << 23);  // r's bits above the integer fall off the top
  float out;
  std::memcpy(&out, &bits, 4);
  out = x < -126.0f ? 0.0f : out;
  out = x >= 128.0f ? std::numeric_limits<float>::infinity() : out;
  return x != x ? x : out;
}

// p[j] = 2^(t[j] - shift) for j < n; p may be t (in place).
inline void exp2_row(const float* t, float shift, float* p, int64_t n, bool polynomial) {
  if (polynomial) {
    for (int64_t j = 0; j < n; ++j) p[j] = exp2_poly_vectorizable(t[j] - shift);
  } else {
    for (int64_t j = 0; j < n; ++j) p[j] = exp2_accurate(t[j] - shift);
  }
}

}  // namespace flash4::cpu
