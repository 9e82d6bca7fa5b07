// The CPU path's tile products (src/cpu/tile_math.h): every register-block width this CPU runs against an fp64
// product, the AVX2 and AVX-512 blocks bit for bit against each other, and zeros of the left operand skipped
// (a masked probability meets a NaN or inf row of the right operand without making it NaN); the decode
// scores' dot products.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/tile_math.h"

namespace flash4::cpu {
namespace {

enum class Op { kSet, kAdd, kAddAt };

struct Operands {
  int64_t m, n, k;
  std::vector<float> a, b, c0;  // a: m x k (k x m for kAddAt), b: k x n, c0: the accumulator's start
};

Operands random_operands(int64_t m, int64_t n, int64_t k, uint32_t seed, double zero_share) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<double> uniform;
  Operands o{m, n, k, std::vector<float>(m * k), std::vector<float>(k * n), std::vector<float>(m * n)};
  for (float& x : o.a) x = uniform(rng) < zero_share ? 0.0f : normal(rng);
  for (float& x : o.b) x = normal(rng);
  for (float& x : o.c0) x = normal(rng);
  return o;
}

// c as the given entry point leaves it.
using Entry = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t);
std::vector<float> run(Entry entry, const Operands& o) {
  std::vector<float> c = o.c0;
  entry(o.a.data(), o.b.data(), c.data(), o.m, o.n, o.k);
  return c;
}

double a_at(const Operands& o, Op op, int64_t i, int64_t x) {
  return op == Op::kAddAt ? o.a[x * o.m + i] : o.a[i * o.k + x];
}

void expect_near_fp64(const std::vector<float>& c, const Operands& o, Op op) {
  for (int64_t i = 0; i < o.m; ++i) {
    for (int64_t j = 0; j < o.n; ++j) {
      double ref = op == Op::kSet ? 0.0 : o.c0[i * o.n + j], mag = std::abs(ref);
      for (int64_t x = 0; x < o.k; ++x) {
        ref += a_at(o, op, i, x) * o.b[x * o.n + j];
        mag += std::abs(a_at(o, op, i, x) * o.b[x * o.n + j]);
      }
      ASSERT_NEAR(c[i * o.n + j], ref, 1e-6 * mag + 1e-30) << "row " << i << " column " << j;
    }
  }
}

struct Widths {
  Entry set, add, add_at;
};

// The entry points this CPU can run, public ones first (they pick the widest).
std::vector<Widths> runnable() {
  std::vector<Widths> w = {{matmul_set, matmul_add, matmul_add_at}};
#if FLASH4_CPU_AVX2_BLOCKS
  const int width = tile_math_detail::cpu_vector_width();
  if (width >= 256)
    w.push_back({tile_math_detail::matmul_set_avx2, tile_math_detail::matmul_add_avx2,
                 tile_math_detail::matmul_add_at_avx2});
  if (width >= 512)
    w.push_back({tile_math_detail::matmul_set_avx512, tile_math_detail::matmul_add_avx512,
                 tile_math_detail::matmul_add_at_avx512});
#endif
  return w;
}

Entry entry_of(const Widths& w, Op op) { return op == Op::kSet ? w.set : op == Op::kAdd ? w.add : w.add_at; }

// Shapes of the CPU tiles (64 x 64, head dims 64..256) and ragged ones that reach every remainder path: rows not a
// multiple of 8 or 4, columns not a multiple of 32, 16 or 8.
const int64_t kShapes[][3] = {{64, 64, 128}, {64, 128, 64}, {64, 256, 64}, {13, 96, 40}, {7, 57, 9},
                              {9, 200, 3},   {1, 1, 1},     {64, 192, 64}, {5, 24, 17}, {12, 49, 64}};

TEST(TileMath, EveryWidthMatchesFp64) {
  uint32_t seed = 1;
  for (const Widths& w : runnable()) {
    for (const auto& shape : kShapes) {
      for (Op op : {Op::kSet, Op::kAdd, Op::kAddAt}) {
        const Operands o = random_operands(shape[0], shape[1], shape[2], seed++, 0.3);
        SCOPED_TRACE(testing::Message() << "shape " << shape[0] << " x " << shape[1] << " x " << shape[2]
                                        << " op " << static_cast<int>(op));
        expect_near_fp64(run(entry_of(w, op), o), o, op);
      }
    }
  }
}

TEST(TileMath, Avx2AndAvx512BlocksGiveTheSameBits) {
  const std::vector<Widths> w = runnable();
  if (w.size() < 3) GTEST_SKIP() << "this CPU has no AVX-512F";
  uint32_t seed = 100;
  for (const auto& shape : kShapes) {
    for (Op op : {Op::kSet, Op::kAdd, Op::kAddAt}) {
      const Operands o = random_operands(shape[0], shape[1], shape[2], seed++, 0.3);
      const std::vector<float> narrow = run(entry_of(w[1], op), o), wide = run(entry_of(w[2], op), o);
      ASSERT_EQ(std::memcmp(narrow.data(), wide.data(), narrow.size() * sizeof(float)), 0)
          << "shape " << shape[0] << " x " << shape[1] << " x " << shape[2] << " op " << static_cast<int>(op);
    }
  }
}

TEST(TileMath, ZerosOfTheLeftOperandSkipNonFiniteRows) {
  for (const Widths& w : runnable()) {
    for (Op op : {Op::kAdd, Op::kAddAt}) {
      Operands o = random_operands(16, 48, 8, 7, 0.0);
      // Row x = 3 of b is NaN / inf, and every a(i, 3) is 0: the products must leave c finite.
      for (int64_t j = 0; j < o.n; ++j)
        o.b[3 * o.n + j] = j % 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < o.m; ++i) (op == Op::kAddAt ? o.a[3 * o.m + i] : o.a[i * o.k + 3]) = 0.0f;
      const std::vector<float> c = run(entry_of(w, op), o);
      for (float x : c) ASSERT_TRUE(std::isfinite(x)) << "op " << static_cast<int>(op);
    }
  }
}

// matmul_set_dot (decode scores: b row-major, rows of c ldc apart) against fp64; columns past n untouched.
TEST(TileMath, DotProductsMatchFp64) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const int64_t shapes[][3] = {{4, 64, 128}, {1, 1, 8}, {16, 37, 96}, {7, 64, 256}, {3, 5, 24}};  // k % 16 = 0, 8
  for (const auto& shape : shapes) {
    const int64_t m = shape[0], n = shape[1], k = shape[2], ldc = n + 3;
    std::vector<float> a(m * k), b(n * k), c(m * ldc, -7.0f);
    for (float& x : a) x = normal(rng);
    for (float& x : b) x = normal(rng);
    matmul_set_dot(a.data(), b.data(), c.data(), m, n, k, ldc);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        if (j >= n) {
          ASSERT_EQ(c[i * ldc + j], -7.0f) << "column " << j << " past n was written";
          continue;
        }
        double ref = 0.0, mag = 0.0;
        for (int64_t x = 0; x < k; ++x) {
          ref += static_cast<double>(a[i * k + x]) * b[j * k + x];
          mag += std::abs(static_cast<double>(a[i * k + x]) * b[j * k + x]);
        }
        ASSERT_NEAR(c[i * ldc + j], ref, 1e-6 * mag) << "m " << m << " n " << n << " k " << k << " at " << i << ", "
                                                      << j;
      }
    }
  }
}

}  // namespace
}  // namespace flash4::cpu
