// The native d = 192 forward candidate (fwd_native_hd192_tile_config), launched on validated arguments of a dense
// batch with keys. Not dispatched by the library (192 runs zero-padded on the 256 kernel) until it is measured
// faster; the GPU test (tests/gpu/test_native_hd192.cu) and the benchmark (flash4_bench --dims 192) compile it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "api/backends.h"
#include "kernels/sm90/fwd/fwd_launch.cuh"
#include "kernels/sm90/fwd/fwd_params_builder.h"

namespace flash4::sm90 {

template <class Element, bool kMasked>
void launch_native_hd192(const FwdParams& params, int seqlen_q, cudaStream_t stream) {
  launch_forward_kernel<Element, 192, kMasked, FwdNativeHd192Config>(
      params, fwd_launch_persistent(192, kMasked, seqlen_q), stream);
}

inline void native_hd192_forward(const ForwardArgs& a, cudaStream_t stream = nullptr) {
  const detail::Problem p = detail::validate(a);
  const FwdParams params = detail::make_fwd_params(a, p, fwd_native_hd192_tile_config());
  const int sq = static_cast<int>(p.seqlen_q);
  if (a.q.dtype == DType::kBFloat16) {
    if (p.has_mask()) launch_native_hd192<__nv_bfloat16, true>(params, sq, stream);
    else launch_native_hd192<__nv_bfloat16, false>(params, sq, stream);
  } else {
    if (p.has_mask()) launch_native_hd192<__half, true>(params, sq, stream);
    else launch_native_hd192<__half, false>(params, sq, stream);
  }
}

}  // namespace flash4::sm90
