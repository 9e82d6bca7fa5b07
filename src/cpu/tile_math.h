// The three small matrix products of attention on contiguous fp32 tiles. Each sums every element over k in
// ascending order (the CPU path is deterministic). On CPUs with AVX2 and FMA, 4 rows x 16 columns of the result
// are computed at a time in registers: the 16 columns of b are loaded once per k step for all 4 rows, and c is
// read and written once per block instead of once per k step (2-4x the plain loops' speed). Elsewhere the plain
// loops, which the compiler vectorizes for any target.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(FLASH4_NO_MULTIVERSION)
#define FLASH4_CPU_AVX2_BLOCKS 1
// Compiled for AVX2 and FMA whatever the build's baseline, and inlined into callers that are (multiversion.h).
#define FLASH4_AVX2_INLINE inline __attribute__((always_inline, target("avx2,fma")))
#else
#define FLASH4_CPU_AVX2_BLOCKS 0
#endif

namespace flash4::cpu {

// The plain loops (what matmul_set, matmul_add and matmul_add_at below compute).
inline void matmul_set_portable(const float* __restrict a, const float* __restrict bt, float* __restrict c,
                                int64_t m, int64_t n, int64_t k) {
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
inline void matmul_add_portable(const float* __restrict a, const float* __restrict b, float* __restrict c,
                                int64_t m, int64_t n, int64_t k) {
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
inline void matmul_add_at_portable(const float* __restrict a, const float* __restrict b, float* __restrict c,
                                   int64_t m, int64_t n, int64_t k) {
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

#if FLASH4_CPU_AVX2_BLOCKS
namespace tile_math_detail {

constexpr int kRows = 4, kCols = 16;  // the register block: 4 x 16 fp32 accumulators (8 AVX2 registers)

// Eight fp32 lanes, one AVX2 register (GCC / Clang vector extension): explicit vectors keep the register block in
// registers at every optimization level.
typedef float Lanes __attribute__((vector_size(32)));

FLASH4_AVX2_INLINE Lanes load_lanes(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
FLASH4_AVX2_INLINE void store_lanes(float* p, Lanes v) { __builtin_memcpy(p, &v, sizeof(v)); }

// c(i0 .. i0 + R - 1, j0 .. j0 + 8 V - 1) (+)= sum over x of a(i, x) * b(x, j), x ascending; a(i, x) through
// `a_at`. kSkipZeros: a zero a(i, x) adds nothing (not even 0 * inf or 0 * NaN: masked probabilities meet rows
// the mask hides).
template <int R, int V, bool kAccumulate, bool kSkipZeros, class A>
FLASH4_AVX2_INLINE void block(const A& a_at, const float* __restrict b, float* __restrict c, int64_t i0, int64_t j0,
                             int64_t n, int64_t k) {
  Lanes acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = kAccumulate ? load_lanes(c + (i0 + r) * n + j0 + 8 * v) : Lanes{};
  for (int64_t x = 0; x < k; ++x) {
    Lanes bx[V];
    for (int v = 0; v < V; ++v) bx[v] = load_lanes(b + x * n + j0 + 8 * v);
    for (int r = 0; r < R; ++r) {
      const float ar = a_at(i0 + r, x);
      if (kSkipZeros && ar == 0.0f) continue;
      for (int v = 0; v < V; ++v) acc[r][v] += ar * bx[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) store_lanes(c + (i0 + r) * n + j0 + 8 * v, acc[r][v]);
}

// One column j0 of rows [i0, i0 + R), for the columns past the last whole 16.
template <int R, bool kAccumulate, bool kSkipZeros, class A>
FLASH4_AVX2_INLINE void column(const A& a_at, const float* b, float* c, int64_t i0, int64_t j0, int64_t n,
                              int64_t k) {
  for (int r = 0; r < R; ++r) {
    float acc = kAccumulate ? c[(i0 + r) * n + j0] : 0.0f;
    for (int64_t x = 0; x < k; ++x) {
      const float ar = a_at(i0 + r, x);
      if (kSkipZeros && ar == 0.0f) continue;
      acc += ar * b[x * n + j0];
    }
    c[(i0 + r) * n + j0] = acc;
  }
}

// Rows [i0, i0 + R) of c, in 16-column blocks, then 8, then one column at a time. The per-element zero test only
// where these rows of a hold a zero (a branch inside the k loop keeps the compiler from holding the accumulators
// in registers; rows without zeros are the common case).
template <int R, bool kAccumulate, bool kSkipZeros, class A>
FLASH4_AVX2_INLINE void rows(const A& a_at, const float* b, float* c, int64_t i0, int64_t n, int64_t k) {
  if constexpr (kSkipZeros) {
    bool zero = false;
    for (int64_t x = 0; x < k; ++x)
      for (int r = 0; r < R; ++r) zero = zero || a_at(i0 + r, x) == 0.0f;
    if (!zero) return rows<R, kAccumulate, false>(a_at, b, c, i0, n, k);
  }
  int64_t j0 = 0;
  for (; j0 + kCols <= n; j0 += kCols) block<R, kCols / 8, kAccumulate, kSkipZeros>(a_at, b, c, i0, j0, n, k);
  for (; j0 + 8 <= n; j0 += 8) block<R, 1, kAccumulate, kSkipZeros>(a_at, b, c, i0, j0, n, k);
  for (; j0 < n; ++j0) column<R, kAccumulate, kSkipZeros>(a_at, b, c, i0, j0, n, k);
}

// c(m x n) (+)= A(m x k) b(k x n), A's elements through a_at(i, x).
template <bool kAccumulate, bool kSkipZeros, class A>
FLASH4_AVX2_INLINE void product(const A& a_at, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  int64_t i0 = 0;
  for (; i0 + kRows <= m; i0 += kRows) rows<kRows, kAccumulate, kSkipZeros>(a_at, b, c, i0, n, k);
  for (; i0 < m; ++i0) rows<1, kAccumulate, kSkipZeros>(a_at, b, c, i0, n, k);
}


// Entry points compiled for AVX2 and FMA (called only where the CPU has them: cpu_has_avx2_fma).
__attribute__((target("avx2,fma"))) inline void matmul_set_avx2(const float* a, const float* bt, float* c, int64_t m,
                                                                 int64_t n, int64_t k) {
  const auto a_at = [a, k](int64_t i, int64_t x) { return a[i * k + x]; };
  product</*kAccumulate=*/false, /*kSkipZeros=*/false>(a_at, bt, c, m, n, k);
}
__attribute__((target("avx2,fma"))) inline void matmul_add_avx2(const float* a, const float* b, float* c, int64_t m,
                                                                 int64_t n, int64_t k) {
  const auto a_at = [a, k](int64_t i, int64_t x) { return a[i * k + x]; };
  product</*kAccumulate=*/true, /*kSkipZeros=*/true>(a_at, b, c, m, n, k);
}
__attribute__((target("avx2,fma"))) inline void matmul_add_at_avx2(const float* a, const float* b, float* c,
                                                                    int64_t m, int64_t n, int64_t k) {
  const auto a_at = [a, m](int64_t i, int64_t x) { return a[x * m + i]; };
  product</*kAccumulate=*/true, /*kSkipZeros=*/true>(a_at, b, c, m, n, k);
}

inline bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

}  // namespace tile_math_detail
#endif  // FLASH4_CPU_AVX2_BLOCKS

// c(m x n) = a(m x k) * bt(k x n); bt is the second operand stored transposed (e.g. K^T for S = Q K^T).
inline void matmul_set(const float* a, const float* bt, float* c, int64_t m, int64_t n, int64_t k) {
#if FLASH4_CPU_AVX2_BLOCKS
  if (tile_math_detail::cpu_has_avx2_fma()) return tile_math_detail::matmul_set_avx2(a, bt, c, m, n, k);
#endif
  matmul_set_portable(a, bt, c, m, n, k);
}

// c(m x n) += a(m x k) * b(k x n), e.g. O += P V and dQ += dS K. Zeros of a (masked and underflowed
// probabilities, common) are skipped, which is exact.
inline void matmul_add(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
#if FLASH4_CPU_AVX2_BLOCKS
  if (tile_math_detail::cpu_has_avx2_fma()) return tile_math_detail::matmul_add_avx2(a, b, c, m, n, k);
#endif
  matmul_add_portable(a, b, c, m, n, k);
}

// c(m x n) += a(k x m)^T * b(k x n), e.g. dV += P^T dO and dK += dS^T Q (zeros of a skipped).
inline void matmul_add_at(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
#if FLASH4_CPU_AVX2_BLOCKS
  if (tile_math_detail::cpu_has_avx2_fma()) return tile_math_detail::matmul_add_at_avx2(a, b, c, m, n, k);
#endif
  matmul_add_at_portable(a, b, c, m, n, k);
}

}  // namespace flash4::cpu
