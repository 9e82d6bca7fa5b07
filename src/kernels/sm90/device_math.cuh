// Scalar device math the kernels share where the fast-math intrinsic is not accurate enough.
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

}  // namespace flash4::sm90
