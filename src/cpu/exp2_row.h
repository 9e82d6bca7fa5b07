// exp2 over a row of the softmax, exact (libm) or by FA4's polynomial.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

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

// p[j] = 2^(t[j] - shift) for j < n; p may be t (in place).
inline void exp2_row(const float* t, float shift, float* p, int64_t n, bool polynomial) {
  if (polynomial) {
    for (int64_t j = 0; j < n; ++j) p[j] = exp2_poly_vectorizable(t[j] - shift);
  } else {
    for (int64_t j = 0; j < n; ++j) p[j] = std::exp2(t[j] - shift);
  }
}

}  // namespace flash4::cpu
