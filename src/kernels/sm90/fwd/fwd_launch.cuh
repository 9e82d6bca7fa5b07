// Host launch of one forward configuration; instantiated once per (dtype, head dim, masked) in generated
// translation units (cmake/kernels.cmake) so the matrix compiles in parallel.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/sm90/fwd/fwd_kernel.cuh"

namespace flash4::sm90 {

template <class Element, int kHeadDim, bool kMasked>
void launch_forward(const FwdParams& params, cudaStream_t stream);

template <class Element, int kHeadDim, bool kMasked, class Variant>
void launch_forward_variant(const FwdParams& params, cudaStream_t stream) {
  using Kernel = FwdKernel<Element, kHeadDim, kMasked, Variant>;
  constexpr int kSmemBytes = static_cast<int>(sizeof(typename Kernel::SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 232448, "forward tile configuration exceeds the 227 KB shared-memory limit");
  auto* kernel = &fwd_kernel<Kernel>;
  FLASH4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  // Causal/window CTAs are ordered longest first (blockIdx.x is reversed in the kernel) so the short tail
  // tiles fill in at the end.
  const dim3 grid(params.num_m_blocks, params.heads, params.batch);
  kernel<<<grid, Kernel::kThreads, kSmemBytes, stream>>>(params);
  FLASH4_CUDA_CHECK_LAUNCH();
}

template <class Element, int kHeadDim, bool kMasked>
void launch_forward(const FwdParams& params, cudaStream_t stream) {
  launch_forward_variant<Element, kHeadDim, kMasked, FwdVariant<>>(params, stream);
}

}  // namespace flash4::sm90
