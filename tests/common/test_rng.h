// Seeded randomness for tests: a fresh seed every run (so runs explore new inputs), printed with every failure
// and reproducible through FLASH4_TEST_SEED=<seed>.
#pragma once

#include <cstdint>
#include <random>

#include <gtest/gtest.h>

namespace flash4::test {

// FLASH4_TEST_SEED from the environment if set, else a new random seed.
uint64_t fresh_seed();

class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(seed), engine_(seed) {}
  uint64_t seed() const { return seed_; }
  double normal() { return normal_(engine_); }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }
  int64_t uniform_int(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(engine_); }

 private:
  uint64_t seed_;
  std::mt19937_64 engine_;
  std::normal_distribution<double> normal_{0.0, 1.0};
};

}  // namespace flash4::test

// Declares `Rng name` with a fresh seed and attaches "seed = N (rerun with FLASH4_TEST_SEED=N)" to every failure
// in the enclosing scope.
#define FLASH4_TEST_RNG(name)                                                                        \
  ::flash4::test::Rng name(::flash4::test::fresh_seed());                                            \
  SCOPED_TRACE("seed = " + std::to_string(name.seed()) + " (rerun with FLASH4_TEST_SEED=" +        \
               std::to_string(name.seed()) + ")")
