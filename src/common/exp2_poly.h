// exp2 on the FMA pipe (FlashAttention-4's emulation), shared by the CPU path and the kernels.
//
// Hopper's MUFU unit does 16 ex2/clk/SM while the FMA pipe does 128 FMA/clk/SM, so computing part of the
// softmax's exponentials with a short polynomial raises the total exp throughput (docs/performance.md gives the
// measured rate of a mix). Recipe:
//   1. clamp x to [-127, +inf); inputs are max-subtracted scores in the log2 domain, so x <= ~8;
//   2. r = x + 1.5*2^23 rounded toward -inf puts floor(x) in r's low mantissa bits without F2I/FRND
//      (those share MUFU's slow pipe and would make the emulation slower than MUFU itself);
//   3. f = x - (r - 1.5*2^23) in [0, 1); 2^f by a degree-3 minimax polynomial (relative error 8.8e-5);
//   4. add floor(x) << 23 to the polynomial's bits, i.e. scale by 2^floor(x) through the exponent field.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace flash4 {

// Minimax coefficients of 2^f on [0, 1) for relative error (c1 differs from ln 2 on purpose).
inline constexpr float kExp2PolyC0 = 1.0f;
inline constexpr float kExp2PolyC1 = 0.695146143436431884765625f;
inline constexpr float kExp2PolyC2 = 0.227564394474029541015625f;
inline constexpr float kExp2PolyC3 = 0.077119089663028717041015625f;
inline constexpr float kExp2PolyMinInput = -127.0f;
inline constexpr float kRoundShifter = 12582912.0f;  // 1.5 * 2^23 (0x4B400000)

#if defined(__CUDACC__)
__device__ __forceinline__ float exp2_poly(float x) {
  x = fmaxf(x, kExp2PolyMinInput);
  float r;
  asm("add.rm.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(kRoundShifter));  // low bits of r = floor(x)
  const float f = x - (r - kRoundShifter);                                     // [0, 1)
  float p = fmaf(kExp2PolyC3, f, kExp2PolyC2);
  p = fmaf(p, f, kExp2PolyC1);
  p = fmaf(p, f, kExp2PolyC0);
  // Signed add of floor(x) << 23 into the exponent; lowers to LEA on the integer pipe.
  return __int_as_float(__float_as_int(p) + (__float_as_int(r) << 23));
}
#endif

// Host version: bit-identical arithmetic, with the round-toward-minus-infinity add done by flooring the
// exact sum (x + 1.5*2^23 is exact in double; its floor is what add.rm yields for |x| < 2^22).
inline float exp2_poly_host(float x) {
  x = x < kExp2PolyMinInput ? kExp2PolyMinInput : x;
  const double exact = static_cast<double>(x) + static_cast<double>(kRoundShifter);
  double fl = exact == exact ? static_cast<double>(static_cast<int64_t>(exact)) : exact;  // NaN: no UB, stays NaN
  if (fl > exact) fl -= 1.0;
  const float r = static_cast<float>(fl);  // representable: an integer near 1.5*2^23
  const float f = x - (r - kRoundShifter);
  float p = std::fma(kExp2PolyC3, f, kExp2PolyC2);
  p = std::fma(p, f, kExp2PolyC1);
  p = std::fma(p, f, kExp2PolyC0);
  int32_t pi, ri;
  std::memcpy(&pi, &p, 4);
  std::memcpy(&ri, &r, 4);
  const int32_t bits = static_cast<int32_t>(static_cast<uint32_t>(pi) + (static_cast<uint32_t>(ri) << 23));
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace flash4
