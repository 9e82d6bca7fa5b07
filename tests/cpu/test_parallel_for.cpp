// parallel_for (common/parallel_for.h): every task exactly once, the first exception rethrown, nested calls and
// calls from several host threads at once (the second does without the shared workers), and a forked child that
// runs its own.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/parallel_for.h"

#if defined(__unix__)
#include <sys/wait.h>
#include <unistd.h>
#endif

namespace flash4 {
namespace {

// Whether parallel_for runs each of n tasks exactly once.
bool runs_each_once(int64_t n) {
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  parallel_for(n, [&](int64_t i) { seen[static_cast<size_t>(i)]++; });
  for (const auto& s : seen)
    if (s.load() != 1) return false;
  return true;
}

TEST(ParallelFor, EveryTaskOnce) {
  for (int64_t n : {0, 1, 2, 3, 17, 1000})
    for (int round = 0; round < 20; ++round) EXPECT_TRUE(runs_each_once(n)) << n;
}

TEST(ParallelFor, FirstExceptionRethrownAndThePoolStillWorks) {
  EXPECT_THROW(parallel_for(100, [](int64_t i) {
                 if (i == 42) throw std::runtime_error("task 42");
               }),
               std::runtime_error);
  EXPECT_TRUE(runs_each_once(100));
}

TEST(ParallelFor, NestedCalls) {
  std::atomic<int64_t> total{0};
  parallel_for(8, [&](int64_t) { parallel_for(8, [&](int64_t j) { total += j; }); });
  EXPECT_EQ(total.load(), 8 * 28);
}

TEST(ParallelFor, HostThreadsAtOnce) {
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round)
        if (runs_each_once(64)) ok++;
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(ok.load(), 200);
}

#if defined(__unix__)
TEST(ParallelFor, ForkedChildRunsItsOwn) {
  EXPECT_TRUE(runs_each_once(64));  // the parent's workers exist
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(runs_each_once(64) ? 0 : 1);  // would hang on the parent's (absent) workers
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
#endif

}  // namespace
}  // namespace flash4
