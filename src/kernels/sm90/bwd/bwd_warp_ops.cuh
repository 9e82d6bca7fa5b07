// Warp-level building blocks of the backward kernel: 16-byte cp.async, ldmatrix and mma.sync m16n8k16 from the
// Hopper layer (hw/sm90/cp_async.cuh, hw/sm90/mma_sync.cuh, where their fragment layouts are documented), and the
// deterministic mode's acquire / release semaphore accesses.
#pragma once

#include <cstdint>

#include "hw/sm90/cp_async.cuh"
#include "hw/sm90/mma_sync.cuh"

namespace flash4::sm90::bwd {

using sm90::cp_async_16;
using sm90::cp_async_commit;
using sm90::cp_async_wait;
using sm90::ldsm_x4;
using sm90::ldsm_x4_trans;
using sm90::mma_16816;
using sm90::smem_addr;

// Acquire load / release add at GPU scope, for the deterministic mode's per-tile semaphores.
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace flash4::sm90::bwd
