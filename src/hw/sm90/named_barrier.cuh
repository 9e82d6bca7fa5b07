// Named barriers (bar.sync / bar.arrive with an id and a thread count): synchronize subsets of the CTA, e.g.
// one warpgroup, or hand a turn from one consumer warpgroup to the other. All ids live in this one registry.
#pragma once

#include <cstdint>

namespace flash4::sm90 {

enum class NamedBarrier : uint32_t {
  kSyncThreads = 0,       // reserved: __syncthreads
  kConsumerWg0 = 1,       // one consumer warpgroup's own barrier (epilogue), + warpgroup index
  kConsumerWg1 = 2,
  kConsumerWg2 = 3,
  kPingPongTurnWg0 = 4,   // "consumer warpgroup i may issue its matmuls now", + warpgroup index
  kPingPongTurnWg1 = 5,
  kPingPongTurnWg2 = 6,
  kBwdDsReady = 7,        // backward: both consumer warpgroups have written their half of dS to shared memory
  kBwdPReady = 8,         // backward d = 256: the S warpgroup has written P^T for the dP warpgroup
  kCount
};
static_assert(static_cast<uint32_t>(NamedBarrier::kCount) <= 16, "the hardware has 16 named barriers");

__device__ __forceinline__ uint32_t barrier_id(NamedBarrier base, int offset) {
  return static_cast<uint32_t>(base) + static_cast<uint32_t>(offset);
}

// All `num_threads` threads (a multiple of 32) wait until that many have arrived.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}
// Arrive without waiting (the partner warps call named_barrier_sync with the same count).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

}  // namespace flash4::sm90
