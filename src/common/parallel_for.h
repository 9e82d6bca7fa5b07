// A minimal fork-join loop over independent tasks, for host code (the CPU path, the fp64 reference, test
// baselines). Host-only.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace flash4 {
namespace parallel_detail {

// Hands out task indices of one call and keeps its first exception.
struct Job {
  const std::function<void(int64_t)>* task = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;

  void work() {
    try {
      for (int64_t i = next++; i < n; i = next++) (*task)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = n;  // stop handing out work
    }
  }
};

// Worker threads kept for the process, created on the first parallel call, so that a call costs a wake-up instead
// of creating and joining threads (tens of microseconds each, per call). One call at a time uses them; a call made
// while they are busy (another host thread) or from inside a task creates its own threads as before. After fork()
// the child starts a pool of its own (the parent's threads do not exist there). The pool is never destroyed: its
// threads wait on a condition variable when the process exits.
class Pool {
 public:
  static Pool* get() {
    static std::once_flag once;
    std::call_once(once, [] {
#if defined(__unix__) || defined(__APPLE__)
      pthread_atfork(nullptr, nullptr, [] { instance() = nullptr; });
#endif
    });
    static std::mutex creation;
    std::lock_guard<std::mutex> lock(creation);
    Pool*& p = instance();
    if (p == nullptr) p = new Pool();  // first use, or first use in a forked child
    return p;
  }

  // Runs `job` on the calling thread and every worker; false (nothing run) when the pool is busy.
  bool run(Job& job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      active_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    inside_task() = true;
    job.work();
    inside_task() = false;
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    job_ = nullptr;
    return true;
  }

  // Whether the calling thread is running a task (of any call): nested calls do not use the pool.
  static bool& inside_task() {
    static thread_local bool inside = false;
    return inside;
  }

 private:
  Pool() {
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned t = 1; t < threads; ++t) {
      try {
        workers_.emplace_back([this] { loop(); });
      } catch (const std::exception&) {
        break;  // no further thread (a process, thread or memory limit): fewer workers, never a failure
      }
    }
    for (std::thread& t : workers_) t.detach();
  }

  static Pool*& instance() {
    static Pool* p = nullptr;
    return p;
  }

  void loop() {
    inside_task() = true;
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      Job* job = job_;
      lock.unlock();
      job->work();
      lock.lock();
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::mutex busy_;   // held by the call that uses the workers
  std::mutex mutex_;  // guards job_, active_, generation_
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;
  int active_ = 0;  // workers not yet done with the current job
  uint64_t generation_ = 0;
};

// The same job on threads created for this call (the caller's thread included).
inline void run_on_new_threads(Job& job, int64_t threads) {
  std::vector<std::thread> pool;
  try {
    pool.reserve(static_cast<size_t>(threads - 1));
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back([&job] { job.work(); });
  } catch (const std::exception&) {
    // No further thread: the caller and the threads already started take every task; nothing has been skipped,
    // and unwinding here would have destroyed joinable threads.
  }
  job.work();
  for (auto& t : pool) t.join();
}

}  // namespace parallel_detail

// Runs task(0) ... task(n - 1), each exactly once, on up to std::thread::hardware_concurrency() threads (the
// caller's thread included), handing out indices dynamically (causal and windowed problems have tasks of very
// different cost). Tasks must not write to shared memory; the results are then independent of the scheduling,
// which keeps the CPU path deterministic. The first exception from a task is rethrown on the caller. Threads
// that cannot be created are done without: the tasks then run on fewer threads, never fail for it.
inline void parallel_for(int64_t n, const std::function<void(int64_t)>& task) {
  if (n <= 0) return;
  parallel_detail::Job job;
  job.task = &task;
  job.n = n;
  const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads == 1) {
    job.work();
  } else if (parallel_detail::Pool::inside_task() || !parallel_detail::Pool::get()->run(job)) {
    parallel_detail::run_on_new_threads(job, threads);
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace flash4
