// Moving tiles between strided user tensors of any dtype and contiguous fp32 tile buffers.
// Only the last dimension of a view is contiguous; every row of a tile is addressed through the strides.
#pragma once

#include <cstdint>

#include "common/float_convert.h"
#include "flash4/types.h"

namespace flash4::cpu {

inline float load_element(const float* p) { return *p; }
inline float load_element(const uint16_t* p, DType t) {
  return t == DType::kFloat16 ? half_bits_to_float(*p) : bf16_bits_to_float(*p);
}

// Pointer to element (b, s, h, 0) of a 4-D view, typed as T.
template <typename T>
T* row_ptr(const TensorView& t, int64_t b, int64_t s, int64_t h) {
  return static_cast<T*>(t.data) + b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
}

// dst(r, x) = t(b, s0 + r, h, x) for r < rows, x < head_dim; dst is rows x head_dim, row-major.
inline void load_rows(const TensorView& t, int64_t b, int64_t s0, int64_t rows, int64_t h, float* dst) {
  const int64_t d = t.shape[3];
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dst + r * d;
    if (t.dtype == DType::kFloat32) {
      const float* src = row_ptr<const float>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) out[x] = src[x];
    } else if (t.dtype == DType::kFloat8E4M3) {
      const uint8_t* src = row_ptr<const uint8_t>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) out[x] = e4m3_bits_to_float(src[x]);
    } else {
      const uint16_t* src = row_ptr<const uint16_t>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) out[x] = load_element(src + x, t.dtype);
    }
  }
}

// Transposed load: dst(x, r) = t(b, s0 + r, h, x), dst is head_dim x ld (ld >= rows), row-major. K and V are
// kept transposed so that score tiles are computed with a contiguous, vectorizable innermost loop over keys.
inline void load_rows_transposed(const TensorView& t, int64_t b, int64_t s0, int64_t rows, int64_t h, float* dst,
                                 int64_t ld) {
  const int64_t d = t.shape[3];
  for (int64_t r = 0; r < rows; ++r) {
    if (t.dtype == DType::kFloat32) {
      const float* src = row_ptr<const float>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) dst[x * ld + r] = src[x];
    } else if (t.dtype == DType::kFloat8E4M3) {
      const uint8_t* src = row_ptr<const uint8_t>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) dst[x * ld + r] = e4m3_bits_to_float(src[x]);
    } else {
      const uint16_t* src = row_ptr<const uint16_t>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) dst[x * ld + r] = load_element(src + x, t.dtype);
    }
  }
}

// t(b, s0 + r, h, x) = src(r, x) rounded to the view's dtype (nearest even); never FP8 (validation: an FP8
// forward writes bf16 or fp16).
inline void store_rows(const float* src, const TensorView& t, int64_t b, int64_t s0, int64_t rows, int64_t h) {
  const int64_t d = t.shape[3];
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * d;
    if (t.dtype == DType::kFloat32) {
      float* out = row_ptr<float>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) out[x] = in[x];
    } else if (t.dtype == DType::kFloat16) {
      uint16_t* out = row_ptr<uint16_t>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) out[x] = float_to_half_bits(in[x]);
    } else {
      uint16_t* out = row_ptr<uint16_t>(t, b, s0 + r, h);
      for (int64_t x = 0; x < d; ++x) out[x] = float_to_bf16_bits(in[x]);
    }
  }
}

// Element (b, h, i) of the fp32 LSE view (rank 3: batch, heads, seqlen_q).
inline float* lse_ptr(const TensorView& lse, int64_t b, int64_t h, int64_t i) {
  return static_cast<float*>(lse.data) + b * lse.stride[0] + h * lse.stride[1] + i * lse.stride[2];
}

}  // namespace flash4::cpu
