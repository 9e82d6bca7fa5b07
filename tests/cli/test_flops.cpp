// The FLOP count of `flash4 run`: FlashAttention's convention without a window, the visible pairs with one.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "check/problem_from_args.h"
#include "flops.h"

namespace {

flash4::ForwardArgs shape_args(int64_t seqlen_q, int64_t seqlen_k, int left, int right, bool causal) {
  flash4::ForwardArgs a;
  const flash4::Device cpu = flash4::Device::cpu();
  a.q = flash4::make_view(nullptr, flash4::DType::kBFloat16, cpu, 2, seqlen_q, 3, 64);
  a.k = flash4::make_view(nullptr, flash4::DType::kBFloat16, cpu, 2, seqlen_k, 3, 64);
  a.window_left = left;
  a.window_right = right;
  a.causal = causal;
  return a;
}

// Pairs the mask of the check library (the judges' mask) leaves visible, row by row.
double reference_pairs(const flash4::ForwardArgs& a) {
  const flash4::detail::Problem p = flash4::check::make_problem(a);
  double pairs = 0;
  for (int64_t i = 0; i < p.seqlen_q; ++i) {
    const auto keys = flash4::detail::key_range(p, i);
    if (keys.hi >= keys.lo) pairs += static_cast<double>(keys.hi - keys.lo + 1);
  }
  return pairs;
}

TEST(CliFlops, DenseAndCausalFollowFlashAttention) {
  const double per_pair = 4.0 * 2 * 3 * 64;
  EXPECT_EQ(flash4_cli::attention_flops(shape_args(100, 130, -1, -1, false), false), per_pair * 100 * 130);
  EXPECT_EQ(flash4_cli::attention_flops(shape_args(128, 128, -1, -1, true), false), per_pair * 128 * 128 / 2);
  EXPECT_EQ(flash4_cli::attention_flops(shape_args(128, 128, -1, -1, true), true), 2.5 * per_pair * 128 * 128 / 2);
}

TEST(CliFlops, WindowsCountVisiblePairs) {
  const double per_pair = 4.0 * 2 * 3 * 64;
  EXPECT_EQ(flash4_cli::attention_flops(shape_args(256, 256, 16, 0, false), false), per_pair * 4216);
  struct Case {
    int64_t sq, sk;
    int left, right;
    bool causal;
  };
  const Case cases[] = {{256, 256, 16, 0, false}, {100, 130, 32, 8, false}, {130, 100, 32, 8, true},
                        {64, 300, -1, 5, false},  {300, 64, 7, -1, false},  {50, 50, 0, 0, false},
                        {10, 500, 3, 3, true},    {500, 10, 1000, 1000, false}};
  for (const Case& c : cases) {
    const flash4::ForwardArgs a = shape_args(c.sq, c.sk, c.left, c.right, c.causal);
    EXPECT_EQ(flash4_cli::attention_flops(a, false), per_pair * reference_pairs(a))
        << c.sq << " x " << c.sk << " window " << c.left << "," << c.right << (c.causal ? " causal" : "");
  }
}

// An empty batch leaves the lengths unbounded by any tensor: the window's sides are compared with the distance
// to the edges, never added to a diagonal near int64's limit, and the rows of an empty batch are not walked.
TEST(CliFlops, HugeLengthsOfAnEmptyBatch) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(flash4_cli::visible_pairs(1, big, 0, 5, false), 1.0);  // the last key only: it is the diagonal
  EXPECT_EQ(flash4_cli::visible_pairs(2, big, 3, 7, false), 9.0);  // 5 + 4 keys of the two rows
  EXPECT_EQ(flash4_cli::visible_pairs(3, 0, 1, 1, false), 0.0);
  flash4::ForwardArgs a = shape_args(int64_t{1} << 62, big, 1, 1, false);
  a.q.shape[0] = a.k.shape[0] = 0;
  EXPECT_EQ(flash4_cli::attention_flops(a, true), 0.0);
}

}  // namespace
