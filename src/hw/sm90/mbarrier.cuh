// mbarrier: the shared-memory barrier that TMA completes (transaction bytes) and that producer/consumer warps
// use to hand shared-memory stages to each other. Thin wrappers over CCCL's cuda::ptx.
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace flash4::sm90::mbarrier {

// One thread initializes; make the init visible to the async proxy (TMA) before anyone uses the barrier.
__device__ __forceinline__ void init(uint64_t* bar, uint32_t arrival_count) {
  cuda::ptx::mbarrier_init(bar, arrival_count);
}
__device__ __forceinline__ void fence_init() { cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster); }

// Arrive once and announce `bytes` of TMA transactions that will complete this phase.
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar, bytes);
}

__device__ __forceinline__ void arrive(uint64_t* bar) { (void)cuda::ptx::mbarrier_arrive(bar); }

// Block until the phase with parity `phase` has completed.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, phase)) {
  }
}

}  // namespace flash4::sm90::mbarrier
