// fp32 <-> bf16 / fp16 conversion on bit patterns (uint16_t), round-to-nearest-even, NaN and Inf preserved; and
// fp32 <-> FP8 E4M3 ("float8_e4m3fn", uint8_t).
// Host and device safe without CUDA headers, so the CPU path, the reference and the tests share one definition
// of "rounded to the dtype".
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace flash4 {

FLASH4_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

FLASH4_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// bf16 is the top half of an fp32: round the dropped 16 bits to nearest even.
FLASH4_HD uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // ties go to the even neighbour
  return static_cast<uint16_t>((u + rounding) >> 16);    // overflow carries into Inf, as it should
}

FLASH4_HD float bf16_bits_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Round the integer m / 2^shift to nearest even (1 <= shift <= 24).
FLASH4_HD uint32_t shift_right_rne(uint32_t m, int shift) {
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

FLASH4_HD uint16_t float_to_half_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536 (and Inf): Inf
  if (a >= 0x38800000u) {
    // Normal in fp16 (>= 2^-14): rebias the exponent (127 -> 15) and round away 13 mantissa bits. A carry out
    // of the mantissa bumps the exponent, which is the right answer (65520 and up become Inf).
    return static_cast<uint16_t>(sign | shift_right_rne(a - (112u << 23), 13));
  }
  if (a < 0x33000000u) return sign;  // < 2^-25 (or exactly half the smallest subnormal, tie to 0): zero
  // Subnormal in fp16: the result counts units of 2^-24; the fp32 value is mant * 2^(e - 150).
  const int e = static_cast<int>(a >> 23);
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | shift_right_rne(mant, 126 - e));
}

FLASH4_HD float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (e == 0) {
    const float sub = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return sign ? -sub : sub;
  }
  return bits_float(sign | ((e + 112u) << 23) | (mant << 13));
}

// FP8 E4M3 (OCP "fn" variant): bias 7, no infinities, 0x7f / 0xff are NaN, largest finite 448 (0x7e).
FLASH4_HD float e4m3_bits_to_float(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xfu, mant = b & 0x7u;
  float a;
  if (e == 0xfu && mant == 0x7u) {
    a = bits_float(0x7fc00000u);  // NaN
  } else if (e == 0) {
    a = static_cast<float>(mant) * 0.001953125f;  // subnormal: mant * 2^-9, exact
  } else {
    a = bits_float(((e + 120u) << 23) | (mant << 20));
  }
  return (b & 0x80u) ? -a : a;
}

// Round to nearest even; values beyond 448 saturate to +-448 (the kernels' saturating conversion, as FP8
// quantization does), NaN stays NaN.
FLASH4_HD uint8_t float_to_e4m3_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  const int e32 = static_cast<int>(a >> 23);
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  if (e32 < 121) {  // below 2^-6, the smallest normal: units of 2^-9 (a carry into 8 is that normal, code 8)
    const int shift = 141 - e32;
    return static_cast<uint8_t>(sign | (shift > 24 ? 0u : shift_right_rne(mant, shift)));
  }
  // Normal: keep 3 mantissa bits (a carry out bumps the exponent, which the code layout absorbs).
  const uint32_t code = (static_cast<uint32_t>(e32 - 120) << 3) + shift_right_rne(mant, 20) - 8u;
  return static_cast<uint8_t>(sign | (code > 0x7eu ? 0x7eu : code));
}

// fp32 -> nearest bf16 / fp16 value, returned as fp32 (what a store and reload would give).
FLASH4_HD float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }
FLASH4_HD float round_to_half(float f) { return half_bits_to_float(float_to_half_bits(f)); }
FLASH4_HD float round_to_e4m3(float f) { return e4m3_bits_to_float(float_to_e4m3_bits(f)); }

}  // namespace flash4
