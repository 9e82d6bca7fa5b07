// The split-KV combine: merges the partial outputs and LSEs of every split of a (sequence, head, query) row with
// the math of common/lse_combine.h (the CPU's split and the context-parallel merge use the same functions), folds in
// the learnable sink, and writes out (Element) and lse. One warp per row; each lane owns 4 or 8 columns (2 at
// d = 64), read as float4 / float2 from the (splits, rows, d) fp32 partials.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/lse_combine.h"
#include "kernels/cuda_check.h"
#include "kernels/sm90/decode/decode_launch.h"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::decode {
namespace {

constexpr int kWarpsPerCta = 4;

template <class Element, int kPerLane>
__global__ void __launch_bounds__(32 * kWarpsPerCta) combine_kernel(const __grid_constant__ CombineParams p) {
  const int64_t rows = int64_t{p.batch} * p.heads * p.seqlen_q;
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerCta + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t i = row % p.seqlen_q, h = (row / p.seqlen_q) % p.heads, b = row / (int64_t{p.seqlen_q} * p.heads);
  constexpr int kHeadDim = 32 * kPerLane;
  const float* lse_parts = p.lse_partial + row;  // split s at s * rows
  const bool has_sink = p.sink != nullptr;
  // Every lane merges the LSEs itself (the same loads, broadcast): the one definition of the math.
  const float lse = detail::combined_lse(lse_parts, p.splits, rows, has_sink, has_sink ? p.sink[h] : 0.0f);
  float acc[kPerLane] = {};
  for (int s = 0; s < p.splits; ++s) {
    const float w = detail::combine_weight(lse_parts[s * rows], lse);
    if (w == 0.0f) continue;  // an empty split: its partial output is never read
    const float* o = p.o_partial + (s * rows + row) * kHeadDim + lane * kPerLane;
#pragma unroll
    for (int x = 0; x < kPerLane; x += 2) {
      const float2 v = *reinterpret_cast<const float2*>(o + x);
      acc[x] += w * v.x;
      acc[x + 1] += w * v.y;
    }
  }
  Element* out = static_cast<Element*>(p.out) + b * p.out_stride_b + i * p.out_stride_s + h * p.out_stride_h +
                 lane * kPerLane;
#pragma unroll
  for (int x = 0; x < kPerLane; x += 2) *reinterpret_cast<uint32_t*>(out + x) = pack2<Element>(acc[x], acc[x + 1]);
  if (lane == 0 && p.lse != nullptr) p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i] = lse;
}

template <class Element>
void launch(const CombineParams& p, int head_dim, cudaStream_t stream) {
  const int64_t rows = int64_t{p.batch} * p.heads * p.seqlen_q;
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerCta - 1) / kWarpsPerCta));
  switch (head_dim) {
    case 64: combine_kernel<Element, 2><<<grid, 32 * kWarpsPerCta, 0, stream>>>(p); break;
    case 128: combine_kernel<Element, 4><<<grid, 32 * kWarpsPerCta, 0, stream>>>(p); break;
    case 256: combine_kernel<Element, 8><<<grid, 32 * kWarpsPerCta, 0, stream>>>(p); break;
    default: throw Error(Status::kNotSupported, "flash4: the decode combine supports head_dim 64, 128, 256");
  }
  FLASH4_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_combine(const CombineParams& p, DType dtype, int head_dim, cudaStream_t stream) {
  if (int64_t{p.batch} * p.heads * p.seqlen_q == 0) return;
  if (dtype == DType::kBFloat16) return launch<__nv_bfloat16>(p, head_dim, stream);
  launch<__half>(p, head_dim, stream);
}

}  // namespace flash4::sm90::decode
