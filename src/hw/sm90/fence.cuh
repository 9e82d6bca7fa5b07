// Proxy fences: ordinary stores to shared memory (generic proxy) must be fenced before the async proxy
// (TMA stores, wgmma operand reads) may read them; likewise for global memory that TMA reduce-adds into.
#pragma once

#include <cuda/ptx>

namespace flash4::sm90 {

__device__ __forceinline__ void fence_async_shared() { cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); }
// Orders this thread's generic-proxy accesses of global memory with its async-proxy (TMA) accesses of it.
__device__ __forceinline__ void fence_async_global() { cuda::ptx::fence_proxy_async(cuda::ptx::space_global); }

}  // namespace flash4::sm90
