// cp.async: 16-byte global -> shared copies that complete asynchronously (Ampere's LDGSTS, still the simplest way
// to gather rows that a TMA tensor map cannot describe, such as the pages of a paged KV cache), grouped with
// commit_group and waited for with wait_group.
#pragma once

#include <cstdint>

namespace flash4::sm90 {

// The 32-bit shared-memory address of a generic pointer into shared memory (what cp.async and ldmatrix take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy bypassing L1 (.cg); bytes beyond src_bytes (0 or 16) are zero-filled, so a row
// outside the data is loaded as zeros from any valid address.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// The same with the L2::128B prefetch hint: L2 fetches the whole 128-byte line on a miss. For streams of whole
// lines (a KV cache's rows), the line's other sectors are then L2 hits.
__device__ __forceinline__ void cp_async_16_line(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// Closes the group of this thread's cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace flash4::sm90
