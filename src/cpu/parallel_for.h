// A minimal fork-join loop over independent tasks for the CPU path.
#pragma once

#include <cstdint>
#include <functional>

namespace flash4::cpu {

// Runs task(0) ... task(n - 1), each exactly once, on up to std::thread::hardware_concurrency() threads
// (the caller's thread included). Tasks must not write to shared memory; the results are then independent of
// the scheduling, which keeps the CPU path deterministic. Exceptions from tasks are rethrown on the caller.
void parallel_for(int64_t n, const std::function<void(int64_t)>& task);

}  // namespace flash4::cpu
