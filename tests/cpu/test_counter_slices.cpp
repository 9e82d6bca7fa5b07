// The zero-counter pool's slice per stream (src/kernels/sm90/counter_slices.h): a stream keeps its slice,
// different streams (and the per-thread default stream in different threads) never share one, and a full table
// answers -1 (the caller then zeroes counters of its own).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "kernels/sm90/counter_slices.h"

namespace flash4::sm90 {
namespace {

TEST(StreamSlices, OneSlicePerStreamForGood) {
  StreamSlices table(4);
  const int a = table.slice_of(0x1000, 0), b = table.slice_of(0x2000, 0);
  EXPECT_NE(a, b);
  for (int call = 0; call < 1000; ++call) {  // however many calls a stream queues, its slice stays its own
    EXPECT_EQ(table.slice_of(0x1000, 0), a);
    EXPECT_EQ(table.slice_of(0x2000, 0), b);
  }
  EXPECT_EQ(table.slice_of(0, 0), 2);  // the legacy default stream is one stream like any other
}

TEST(StreamSlices, FullTableAnswersMinusOne) {
  StreamSlices table(3);
  std::set<int> taken;
  for (uintptr_t s = 1; s <= 3; ++s) taken.insert(table.slice_of(s * 16, 0));
  EXPECT_EQ(taken, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(table.slice_of(4 * 16, 0), -1);  // a fourth stream: no slice, counters of its own
  EXPECT_EQ(table.slice_of(2 * 16, 0), 1);   // the owners keep theirs
}

TEST(StreamSlices, OneHandleInSeveralThreadsTakesSeveralSlices) {
  StreamSlices table(8);
  constexpr uintptr_t kPerThreadHandle = 0x2;
  const int main_slice = table.slice_of(kPerThreadHandle, 11);
  EXPECT_EQ(table.slice_of(kPerThreadHandle, 11), main_slice);
  EXPECT_NE(table.slice_of(kPerThreadHandle, 12), main_slice);
}

TEST(StreamSlices, ConcurrentFirstUsesGetDistinctSlices) {
  StreamSlices table(64);
  std::vector<int> got(16, -2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int call = 0; call < 100; ++call) got[t] = table.slice_of(0x100 + 16 * static_cast<uintptr_t>(t), 0);
    });
  }
  for (std::thread& th : threads) th.join();
  const std::set<int> distinct(got.begin(), got.end());
  EXPECT_EQ(distinct.size(), got.size());
  for (int s : got) EXPECT_TRUE(s >= 0 && s < 16) << s;
}

}  // namespace
}  // namespace flash4::sm90
