// Device math the kernels share: scalar functions where the fast-math intrinsic is not accurate enough, and warp
// reductions.
#pragma once

#include <cuda_runtime.h>

#include "common/score_transform.h"

namespace flash4::sm90 {

// tanh to ~1e-7 absolute, as 1 - 2 / (exp(2y) + 1): tanhf compiles to tanh.approx.f32 under --use_fast_math, whose
// 2^-11 relative error the softcap multiplies into the score (and so into P). |y| >= 15 rounds to +-1.
__device__ __forceinline__ float tanh_accurate(float y) {
  const float clamped = fminf(fmaxf(y, -15.0f), 15.0f);
  const float e = exp2f(clamped * (2.0f * detail::kLog2e));  // exp(2y)
  return 1.0f - 2.0f / (e + 1.0f);
}

// The maximum and the sum of x over the 32 lanes of a full warp, in every lane.
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, d));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) x += __shfl_xor_sync(0xffffffffu, x, d);
  return x;
}

}  // namespace flash4::sm90
