// TMA (the bulk tensor copy engine): 4-D tiled loads that complete on an mbarrier, and tiled stores and
// reduce-adds from shared memory. The tensor map (built on the host by tma_map.h) is passed as a __grid_constant__ parameter.
// Coordinates are in elements, innermost first: {head_dim, seqlen, head, batch}.
#pragma once

#include <cuda.h>
#include <cuda/ptx>

#include <cstdint>

namespace flash4::sm90::tma {

// One elected thread: copy the box at `coords` into `smem_dst`; completes `bytes` on `bar`.
__device__ __forceinline__ void load_4d(void* smem_dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                        int32_t c3, uint64_t* bar) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_dst, map, coords, bar);
}

// One elected thread: write the box at `coords` from `smem_src` (rows outside the tensor are clipped).
__device__ __forceinline__ void store_4d(const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                                         const void* smem_src) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords, smem_src);
}

// One elected thread: global box at `coords` += `smem_src` (element-wise add in the map's type, fp32 here; rows
// outside the tensor are clipped). Part of the thread's bulk group like the stores.
__device__ __forceinline__ void reduce_add_4d(const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                                              const void* smem_src) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_reduce_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, map,
                                         coords, smem_src);
}

// Wait until the committed stores / reduce-adds are complete (their global writes performed).
__device__ __forceinline__ void store_wait_all() { cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{}); }

__device__ __forceinline__ void store_commit() { cuda::ptx::cp_async_bulk_commit_group(); }
// Wait until the committed stores have finished reading shared memory (so it may be reused or the CTA exit).
__device__ __forceinline__ void store_wait_read_all() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); }

__device__ __forceinline__ void prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace flash4::sm90::tma
