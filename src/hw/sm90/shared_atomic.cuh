// Relaxed atomic reads and writes of a 32-bit word in shared memory, addressed in the shared state space (ATOMS).
// A generic pointer into shared memory that the compiler cannot prove shared (the forward's dynamic buffer is
// aligned through an integer) makes atomicAdd / atomicExch generic atomics, which take the global memory path and
// wait behind the warp's outstanding global stores. Ordering is the caller's (an mbarrier); the atomics only keep
// racecheck from reporting the mbarrier-ordered reuse of the word.
#pragma once

#include <cstdint>

namespace flash4::sm90 {

// p: a generic pointer into shared memory.
__device__ __forceinline__ int shared_atomic_load(const int* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  int v;
  asm volatile("atom.shared.add.u32 %0, [%1], 0;\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Writes v; returns the word's previous value.
__device__ __forceinline__ int shared_atomic_exchange(int* p, int v) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  int old;
  asm volatile("atom.shared.exch.b32 %0, [%1], %2;\n" : "=r"(old) : "r"(addr), "r"(v) : "memory");
  return old;
}

}  // namespace flash4::sm90
