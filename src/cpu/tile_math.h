// The small matrix products of attention on contiguous fp32 tiles. Each of the three register-blocked products
// sums every element over k in ascending order (the CPU path is deterministic). Where the CPU has AVX-512F, 8 rows
// x 32 columns of the result are computed at a time in registers, with AVX2 and FMA 4 x 16: the columns of b are
// loaded once per k step for all rows of the block, and c is read and written once per block instead of once per
// k step. Elsewhere the plain loops, which the compiler vectorizes for any target. matmul_set_dot computes scores
// as dot products with K's rows, for tiles of few rows.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(FLASH4_NO_MULTIVERSION)
#define FLASH4_CPU_AVX2_BLOCKS 1
// Inlined into the entry points below, which are compiled for AVX2 and FMA or AVX-512 whatever the build's
// baseline.
#define FLASH4_TILE_INLINE inline __attribute__((always_inline))
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

// fp32 lanes of one AVX2 (8) or AVX-512 (16) register (GCC / Clang vector extensions): explicit vectors keep the
// register block in registers at every optimization level. Loaded and stored with memcpy (unaligned) inside the
// functions compiled for the wide ISA, never passed or returned by a function compiled without it.
typedef float Lanes8 __attribute__((vector_size(32)));
typedef float Lanes16 __attribute__((vector_size(64)));

// c(i0 .. i0 + R - 1, j0 .. j0 + V lanes - 1) (+)= sum over x of a(i, x) * b(x, j), x ascending; a(i, x) through
// `a_at`. Each element is the same chain of fused multiply-adds whatever the register width, so the AVX2 and
// AVX-512 blocks give the same bits. kSkipZeros: a zero a(i, x) adds nothing (not even 0 * inf or 0 * NaN:
// masked probabilities meet rows the mask hides).
template <class L, int R, int V, bool kAccumulate, bool kSkipZeros, class A>
FLASH4_TILE_INLINE void block(const A& a_at, const float* __restrict b, float* __restrict c, int64_t i0, int64_t j0,
                              int64_t n, int64_t k) {
  constexpr int kLanes = sizeof(L) / sizeof(float);
  L acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      if (kAccumulate) {
        __builtin_memcpy(&acc[r][v], c + (i0 + r) * n + j0 + kLanes * v, sizeof(L));
      } else {
        acc[r][v] = L{};
      }
  for (int64_t x = 0; x < k; ++x) {
    L bx[V];
    for (int v = 0; v < V; ++v) __builtin_memcpy(&bx[v], b + x * n + j0 + kLanes * v, sizeof(L));
    for (int r = 0; r < R; ++r) {
      const float ar = a_at(i0 + r, x);
      if (kSkipZeros && ar == 0.0f) continue;
      for (int v = 0; v < V; ++v) acc[r][v] += ar * bx[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) __builtin_memcpy(c + (i0 + r) * n + j0 + kLanes * v, &acc[r][v], sizeof(L));
}

// One column j0 of rows [i0, i0 + R), for the columns past the last whole 8.
template <int R, bool kAccumulate, bool kSkipZeros, class A>
FLASH4_TILE_INLINE void column(const A& a_at, const float* b, float* c, int64_t i0, int64_t j0, int64_t n,
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

// Rows [i0, i0 + R) of c: blocks of 32 columns in AVX-512 registers or 16 in AVX2 ones, then 8, then one
// column at a time. The per-element zero test only where these rows of a hold a zero (a branch inside the k loop
// keeps the compiler from holding the accumulators in registers; rows without zeros are the common case).
template <bool kAvx512, int R, bool kAccumulate, bool kSkipZeros, class A>
FLASH4_TILE_INLINE void rows(const A& a_at, const float* b, float* c, int64_t i0, int64_t n, int64_t k) {
  if constexpr (kSkipZeros) {
    bool zero = false;
    for (int64_t x = 0; x < k; ++x)
      for (int r = 0; r < R; ++r) zero = zero || a_at(i0 + r, x) == 0.0f;
    if (!zero) return rows<kAvx512, R, kAccumulate, false>(a_at, b, c, i0, n, k);
  }
  int64_t j0 = 0;
  if constexpr (kAvx512) {
    for (; j0 + 32 <= n; j0 += 32) block<Lanes16, R, 2, kAccumulate, kSkipZeros>(a_at, b, c, i0, j0, n, k);
    for (; j0 + 16 <= n; j0 += 16) block<Lanes16, R, 1, kAccumulate, kSkipZeros>(a_at, b, c, i0, j0, n, k);
  } else {
    for (; j0 + 16 <= n; j0 += 16) block<Lanes8, R, 2, kAccumulate, kSkipZeros>(a_at, b, c, i0, j0, n, k);
  }
  for (; j0 + 8 <= n; j0 += 8) block<Lanes8, R, 1, kAccumulate, kSkipZeros>(a_at, b, c, i0, j0, n, k);
  for (; j0 < n; ++j0) column<R, kAccumulate, kSkipZeros>(a_at, b, c, i0, j0, n, k);
}

// c(m x n) (+)= A(m x k) b(k x n), A's elements through a_at(i, x). Register blocks: AVX2 4 rows x 16 columns
// (8 of its 16 registers), AVX-512 8 rows x 32 columns (16 of its 32): each loaded row of b serves every row of
// the block, and the more rows share it, the fewer loads per multiply-add.
template <bool kAvx512, bool kAccumulate, bool kSkipZeros, class A>
FLASH4_TILE_INLINE void product(const A& a_at, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  constexpr int kRows = kAvx512 ? 8 : 4;
  int64_t i0 = 0;
  for (; i0 + kRows <= m; i0 += kRows) rows<kAvx512, kRows, kAccumulate, kSkipZeros>(a_at, b, c, i0, n, k);
  for (; i0 < m; ++i0) rows<kAvx512, 1, kAccumulate, kSkipZeros>(a_at, b, c, i0, n, k);
}

// Entry points compiled for AVX2 and FMA, or AVX-512 (called only where the CPU has them: cpu_vector_width).
#define FLASH4_TILE_ENTRY_POINTS(kAvx512, suffix, target_isa)                                                   \
  __attribute__((target(target_isa))) inline void matmul_set_##suffix(const float* a, const float* bt, float* c,  \
                                                                      int64_t m, int64_t n, int64_t k) {        \
    const auto a_at = [a, k](int64_t i, int64_t x) { return a[i * k + x]; };                                    \
    product<kAvx512, /*kAccumulate=*/false, /*kSkipZeros=*/false>(a_at, bt, c, m, n, k);                       \
  }                                                                                                             \
  __attribute__((target(target_isa))) inline void matmul_add_##suffix(const float* a, const float* b, float* c,   \
                                                                      int64_t m, int64_t n, int64_t k) {        \
    const auto a_at = [a, k](int64_t i, int64_t x) { return a[i * k + x]; };                                    \
    product<kAvx512, /*kAccumulate=*/true, /*kSkipZeros=*/true>(a_at, b, c, m, n, k);                          \
  }                                                                                                             \
  __attribute__((target(target_isa))) inline void matmul_add_at_##suffix(const float* a, const float* b,         \
                                                                         float* c, int64_t m, int64_t n,         \
                                                                         int64_t k) {                            \
    const auto a_at = [a, m](int64_t i, int64_t x) { return a[x * m + i]; };                                    \
    product<kAvx512, /*kAccumulate=*/true, /*kSkipZeros=*/true>(a_at, b, c, m, n, k);                          \
  }
FLASH4_TILE_ENTRY_POINTS(false, avx2, "avx2,fma")
FLASH4_TILE_ENTRY_POINTS(true, avx512, "avx512f,avx2,fma")
#undef FLASH4_TILE_ENTRY_POINTS

// 512 where the CPU has AVX-512F, 256 where it has AVX2 and FMA, else 0 (the plain loops).
inline int cpu_vector_width() {
  static const int width = __builtin_cpu_supports("avx512f")                                 ? 512
                           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 256
                                                                                             : 0;
  return width;
}

}  // namespace tile_math_detail
#endif  // FLASH4_CPU_AVX2_BLOCKS

// c(m x n, rows ldc apart) = a(m x k) * b(n x k)^T with b row-major (K as the cache stores it, not transposed):
// each element a dot product, its k terms summed in 16 lanes (term x in lane x % 16, in ascending x), the two
// halves of the lanes added, the last 8 terms (k % 16 = 8) added to those, then a fixed tree: a given shape
// always gives the same bits. For few rows of a (decode: the query rows of one KV head), where transposing b
// for matmul_set would cost more than the products. k is a multiple of 8.
inline void matmul_set_dot(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, int64_t ldc) {
  typedef float L8 __attribute__((vector_size(32)));  // the 16 lanes as two halves: one AVX2 register each
  typedef float L4 __attribute__((vector_size(16)));
  const int64_t k16 = k / 16 * 16;
  for (int64_t j = 0; j < n; ++j) {
    const float* bj = b + j * k;
    for (int64_t i = 0; i < m; ++i) {
      const float* ai = a + i * k;
      L8 low = {}, high = {}, a0, a1, b0, b1;
      for (int64_t x = 0; x < k16; x += 16) {
        __builtin_memcpy(&a0, ai + x, sizeof(a0));
        __builtin_memcpy(&a1, ai + x + 8, sizeof(a1));
        __builtin_memcpy(&b0, bj + x, sizeof(b0));
        __builtin_memcpy(&b1, bj + x + 8, sizeof(b1));
        low += a0 * b0;
        high += a1 * b1;
      }
      L8 half = low + high;
      if (k16 < k) {  // the last 8 terms
        __builtin_memcpy(&a0, ai + k16, sizeof(a0));
        __builtin_memcpy(&b0, bj + k16, sizeof(b0));
        half += a0 * b0;
      }
      const L4 quarter =
          __builtin_shufflevector(half, half, 0, 1, 2, 3) + __builtin_shufflevector(half, half, 4, 5, 6, 7);
      c[i * ldc + j] = (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
    }
  }
}

// c(m x n) = a(m x k) * bt(k x n); bt is the second operand stored transposed (e.g. K^T for S = Q K^T).
inline void matmul_set(const float* a, const float* bt, float* c, int64_t m, int64_t n, int64_t k) {
#if FLASH4_CPU_AVX2_BLOCKS
  if (tile_math_detail::cpu_vector_width() == 512) return tile_math_detail::matmul_set_avx512(a, bt, c, m, n, k);
  if (tile_math_detail::cpu_vector_width() == 256) return tile_math_detail::matmul_set_avx2(a, bt, c, m, n, k);
#endif
  matmul_set_portable(a, bt, c, m, n, k);
}

// c(m x n) += a(m x k) * b(k x n), e.g. O += P V and dQ += dS K. Zeros of a (masked and underflowed
// probabilities, common) are skipped, which is exact.
inline void matmul_add(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
#if FLASH4_CPU_AVX2_BLOCKS
  if (tile_math_detail::cpu_vector_width() == 512) return tile_math_detail::matmul_add_avx512(a, b, c, m, n, k);
  if (tile_math_detail::cpu_vector_width() == 256) return tile_math_detail::matmul_add_avx2(a, b, c, m, n, k);
#endif
  matmul_add_portable(a, b, c, m, n, k);
}

// c(m x n) += a(k x m)^T * b(k x n), e.g. dV += P^T dO and dK += dS^T Q (zeros of a skipped).
inline void matmul_add_at(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
#if FLASH4_CPU_AVX2_BLOCKS
  if (tile_math_detail::cpu_vector_width() == 512) return tile_math_detail::matmul_add_at_avx512(a, b, c, m, n, k);
  if (tile_math_detail::cpu_vector_width() == 256) return tile_math_detail::matmul_add_at_avx2(a, b, c, m, n, k);
#endif
  matmul_add_at_portable(a, b, c, m, n, k);
}

}  // namespace flash4::cpu
