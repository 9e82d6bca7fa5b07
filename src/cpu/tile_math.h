// The three small matrix products of attention on contiguous fp32 tiles. Each keeps a contiguous innermost
// loop with no reduction across its iterations, so the compiler vectorizes it without -ffast-math, and each
// sums in a fixed order (the CPU path is deterministic).
#pragma once

#include <cstdint>

namespace flash4::cpu {

// c(m x n) = a(m x k) * bt(k x n); bt is the second operand stored transposed (e.g. K^T for S = Q K^T).
inline void matmul_set(const float* __restrict a, const float* __restrict bt, float* __restrict c, int64_t m,
                       int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * n;
    for (int64_t j = 0; j < n; ++j) ci[j] = 0.0f;
    for (int64_t x = 0; x < k; ++x) {
      const float aix = a[i * k + x];
      const float* bx = bt + x * n;
      for (int64_t j = 0; j < n; ++j) ci[j] += aix * bx[j];
    }
  }
}

// c(m x n) += a(m x k) * b(k x n), e.g. O += P V and dQ += dS K.
inline void matmul_add(const float* __restrict a, const float* __restrict b, float* __restrict c, int64_t m,
                       int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * n;
    for (int64_t x = 0; x < k; ++x) {
      const float aix = a[i * k + x];
      if (aix == 0.0f) continue;  // masked and underflowed probabilities are common; skipping is exact
      const float* bx = b + x * n;
      for (int64_t j = 0; j < n; ++j) ci[j] += aix * bx[j];
    }
  }
}

// c(m x n) += a(k x m)^T * b(k x n), e.g. dV += P^T dO and dK += dS^T Q.
inline void matmul_add_at(const float* __restrict a, const float* __restrict b, float* __restrict c, int64_t m,
                          int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * n;
    for (int64_t x = 0; x < k; ++x) {
      const float axi = a[x * m + i];
      if (axi == 0.0f) continue;
      const float* bx = b + x * n;
      for (int64_t j = 0; j < n; ++j) ci[j] += axi * bx[j];
    }
  }
}

}  // namespace flash4::cpu
