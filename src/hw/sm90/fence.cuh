// Proxy fences: ordinary stores to shared memory (generic proxy) must be fenced before the async proxy
// (TMA stores, wgmma operand reads) may read them.
#pragma once

#include <cuda/ptx>

namespace flash4::sm90 {

__device__ __forceinline__ void fence_async_shared() { cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); }

}  // namespace flash4::sm90
