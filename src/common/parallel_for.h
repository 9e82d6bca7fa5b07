// A minimal fork-join loop over independent tasks, for host code (the CPU path, the fp64 reference, test
// baselines). Host-only.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flash4 {

// Runs task(0) ... task(n - 1), each exactly once, on up to std::thread::hardware_concurrency() threads (the
// caller's thread included), handing out indices dynamically (causal and windowed problems have tasks of very
// different cost). Tasks must not write to shared memory; the results are then independent of the scheduling,
// which keeps the CPU path deterministic. The first exception from a task is rethrown on the caller. Threads
// that cannot be created are done without: the tasks then run on fewer threads, never fail for it.
inline void parallel_for(int64_t n, const std::function<void(int64_t)>& task) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    try {
      for (int64_t i = next++; i < n; i = next++) task(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = n;  // stop handing out work
    }
  };
  std::vector<std::thread> pool;
  try {
    pool.reserve(static_cast<size_t>(threads - 1));
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  } catch (const std::exception&) {
    // No further thread (a process, thread or memory limit): the caller and the threads already started take
    // every task; nothing has been skipped, and unwinding here would have destroyed joinable threads.
  }
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flash4
