// Conversions between fp32 pairs and one 32-bit register of two 16-bit elements (bf16 or fp16): the form in which
// mma.sync / wgmma fragments and 16-byte global stores carry them. One definition for the forward and the backward.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace flash4::sm90 {

// Two fp32 values -> one register of two Elements, rounded to nearest; `lo` (the first value, the lower column of
// a fragment) in the low half.
template <class Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// The inverse: the low half in .x, the high half in .y.
template <class Element>
__device__ __forceinline__ float2 unpack2(uint32_t bits) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  }
}

}  // namespace flash4::sm90
