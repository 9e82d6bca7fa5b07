// The split-KV policy shared by the CPU and GPU paths: the split-count heuristic, the key ranges of the splits
// (common/split_kv.h) and the LSE combine (common/lse_combine.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/lse_combine.h"
#include "common/split_kv.h"

namespace flash4::detail {
namespace {

// The heuristic is constexpr: a launch configuration can be computed at compile time.
static_assert(choose_num_splits(132, 1024, 8192) == 1);  // enough work to fill the GPU without splitting

TEST(SplitKv, HeuristicSplitsOnlyWhenWorkersIdle) {
  EXPECT_EQ(choose_num_splits(132, 132, 65536), 1);  // every SM busy
  EXPECT_EQ(choose_num_splits(132, 8, 100), 1);      // too few keys to split
  EXPECT_EQ(choose_num_splits(1, 1, 65536), 1);      // one worker
  for (int64_t items : {1, 2, 8, 32, 64}) {
    for (int64_t keys : {1024, 8192, 65536, 1 << 20}) {
      const int s = choose_num_splits(132, items, keys);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, kMaxSplits);
      EXPECT_LE(s, std::max<int64_t>(1, keys / kMinKeysPerSplit)) << items << " " << keys;
    }
  }
  // Batch 1, 8 KV heads, a 64k cache on 132 SMs: the splits fill most of the SMs.
  const int s = choose_num_splits(132, 8, 65536);
  EXPECT_GT(s, 1);
  EXPECT_GE(8.0 * s / (std::ceil(8.0 * s / 132.0) * 132.0), kSplitWaveEfficiency * 0.99);
}

TEST(SplitKv, SplitsCoverTheKeysOnce) {
  for (int64_t first : {0, 5, 64}) {
    for (int64_t count : {0, 1, 63, 64, 65, 1000}) {
      for (int64_t splits : {1, 2, 3, 7, 64, 128}) {
        int64_t next = first;
        for (int64_t s = 0; s < splits; ++s) {
          int64_t lo = 0, hi = -1;
          split_keys(first, first + count - 1, 64, splits, s, lo, hi);
          if (lo > hi) continue;  // an empty split
          EXPECT_EQ(lo, next);
          EXPECT_EQ((lo - first) % 64, 0);
          next = hi + 1;
        }
        EXPECT_EQ(next, first + count) << first << " " << count << " " << splits;
      }
    }
  }
}

// Splitting a row's scores into parts and combining the parts' (out, lse) gives the whole row's result.
TEST(LseCombine, MatchesTheWholeRow) {
  const std::vector<double> scores = {0.3, -1.2, 4.0, 2.5, -0.7, 1.1, 3.3};
  const std::vector<double> values = {1.0, -2.0, 0.5, 3.0, -1.0, 2.0, 0.25};
  double whole_sum = 0.0, whole_out = 0.0;
  for (size_t j = 0; j < scores.size(); ++j) {
    whole_sum += std::exp(scores[j]);
    whole_out += std::exp(scores[j]) * values[j];
  }
  const double sink = 0.9;
  for (const bool with_sink : {false, true}) {
    const std::vector<size_t> cuts = {0, 2, 2, 5, 7};  // parts [0,2), [2,2) (empty), [2,5), [5,7)
    std::vector<float> lse, out;
    for (size_t p = 0; p + 1 < cuts.size(); ++p) {
      double sum = 0.0, o = 0.0;
      for (size_t j = cuts[p]; j < cuts[p + 1]; ++j) {
        sum += std::exp(scores[j]);
        o += std::exp(scores[j]) * values[j];
      }
      lse.push_back(sum > 0 ? static_cast<float>(std::log(sum)) : -std::numeric_limits<float>::infinity());
      out.push_back(sum > 0 ? static_cast<float>(o / sum) : 0.0f);
    }
    const float merged =
        combined_lse(lse.data(), static_cast<int64_t>(lse.size()), 1, with_sink, static_cast<float>(sink));
    double o = 0.0;
    for (size_t p = 0; p < lse.size(); ++p) o += combine_weight(lse[p], merged) * out[p];
    const double total = whole_sum + (with_sink ? std::exp(sink) : 0.0);
    EXPECT_NEAR(merged, std::log(total), 1e-6);
    EXPECT_NEAR(o, whole_out / total, 1e-6);
  }
}

TEST(LseCombine, EmptyParts) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const float none[3] = {ninf, ninf, ninf};
  EXPECT_EQ(combined_lse(none, 3, 1, false, 0.0f), ninf);
  EXPECT_EQ(combine_weight(ninf, ninf), 0.0f);
  EXPECT_FLOAT_EQ(combined_lse(none, 3, 1, true, 1.5f), 1.5f);  // only the sink
  EXPECT_EQ(combine_weight(ninf, 1.5f), 0.0f);
  const float one[2] = {ninf, 2.0f};
  EXPECT_FLOAT_EQ(combined_lse(one, 2, 1, false, 0.0f), 2.0f);
  EXPECT_EQ(combine_weight(2.0f, 2.0f), 1.0f);  // a single part passes through exactly
}

}  // namespace
}  // namespace flash4::detail
