// The split-KV combine: merges the partial outputs and LSEs of every split of a (sequence, head, query) row with
// the math of common/lse_combine.h (the CPU's split and the context-parallel merge use the same functions), folds in
// the learnable sink, and writes out (Element) and lse. One warp per row; each lane owns 4 or 8 columns (2 at
// d = 64), read as float2 from the (splits, rows, d) fp32 partials.
// The kernel is latency-bound (a few KB per row, just written to L2 by the attention kernel), so it keeps loads in
// flight instead of walking the splits one by one: lane l reads the LSEs of splits l, l + 32, ... and the warp
// reduces them with shuffles, then the partial outputs are read several splits at a time. It is launched as a
// programmatic dependent of the attention kernel (hw/sm90/grid_dependency.cuh), so its launch overlaps that
// kernel's tail.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/lse_combine.h"
#include "common/split_kv.h"
#include "hw/sm90/grid_dependency.cuh"
#include "kernels/cuda_check.h"
#include "kernels/sm90/decode/decode_launch.h"
#include "kernels/sm90/decode/decode_split_merge.cuh"
#include "kernels/sm90/device_math.cuh"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::decode {
namespace {

constexpr int kWarpsPerCta = 4;
constexpr int kSplitsPerLane = detail::kMaxSplits / 32;  // LSEs per lane
static_assert(detail::kMaxSplits % 32 == 0, "whole lanes");

template <class Element, int kPerLane>
__global__ void __launch_bounds__(32 * kWarpsPerCta) combine_kernel(const __grid_constant__ CombineParams p) {
  constexpr int kBatch = 32 / kPerLane;  // splits in flight per lane: 32 floats of partial output (d = 256: no spills)
  grid_dependency_wait();  // the attention kernel's partials are complete and visible
  const int64_t rows = int64_t{p.batch} * p.heads * p.seqlen_q;
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerCta + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int splits = min(p.splits, detail::kMaxSplits);
  const int64_t i = row % p.seqlen_q, h = (row / p.seqlen_q) % p.heads, b = row / (int64_t{p.seqlen_q} * p.heads);
  const DecodeSpan ds = decode_span(p.cu_seqlens_q, p.total_q, p.seqlen_q, p.max_seqlen_q, b);
  // A packed sequence with fewer queries, or the dense kernel's: no partial was written for this row.
  if (i >= ds.span.count || !ds.computed) return;
  const QuerySpan span = ds.span;
  constexpr int kHeadDim = 32 * kPerLane;
  const float* lse_parts = p.lse_partial + row;  // split s at s * rows
  const bool has_sink = p.sink != nullptr;
  const float sink = has_sink ? p.sink[h] : 0.0f;

  // The LSE of every split, lane l holding splits l + 32 k, merged by the warp.
  float lse_s[kSplitsPerLane], weight[kSplitsPerLane];
#pragma unroll
  for (int k = 0; k < kSplitsPerLane; ++k) {
    const int s = lane + 32 * k;
    lse_s[k] = s < splits ? lse_parts[s * rows] : detail::negative_infinity();
  }
  const float lse = warp_combined_lse(lse_s, has_sink, sink, weight);

  // out = sum_s weight_s o_s, kBatch splits' loads issued before their sums; weight_s from lane s % 32.
  float acc[kPerLane] = {};
  const float* o_lane = p.o_partial + row * kHeadDim + lane * kPerLane;  // split s at s * rows * kHeadDim
#pragma unroll
  for (int k = 0; k < kSplitsPerLane; ++k) {
    if (32 * k >= splits) break;
#pragma unroll
    for (int j0 = 0; j0 < 32; j0 += kBatch) {
      if (32 * k + j0 >= splits) break;
      float w[kBatch];
      float2 v[kBatch][kPerLane / 2];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        w[j] = __shfl_sync(0xffffffffu, weight[k], j0 + j);  // 0 past the last split
        const float* o = o_lane + (32 * k + j0 + j) * rows * kHeadDim;
#pragma unroll
        for (int x = 0; x < kPerLane / 2; ++x)  // an empty split's partial output is never read
          v[j][x] = w[j] != 0.0f ? *reinterpret_cast<const float2*>(o + 2 * x) : make_float2(0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
#pragma unroll
        for (int x = 0; x < kPerLane / 2; ++x) {
          acc[2 * x] += w[j] * v[j][x].x;
          acc[2 * x + 1] += w[j] * v[j][x].y;
        }
    }
  }
  Element* out = static_cast<Element*>(p.out) + b * p.out_stride_b + (span.first + i) * p.out_stride_s +
                 h * p.out_stride_h + lane * kPerLane;
  // Columns past the head dim (a kernel wider than it: decode_kernel_width) are the zero padding: not written.
#pragma unroll
  for (int x = 0; x < kPerLane; x += 2)
    if (lane * kPerLane + x < p.out_cols) *reinterpret_cast<uint32_t*>(out + x) = pack2<Element>(acc[x], acc[x + 1]);
  if (lane == 0 && p.lse != nullptr) p.lse[b * p.lse_stride_b + h * p.lse_stride_h + span.first + i] = lse;
}

template <class Element>
void launch(const CombineParams& p, int head_dim, cudaStream_t stream) {
  const int64_t rows = int64_t{p.batch} * p.heads * p.seqlen_q;
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerCta - 1) / kWarpsPerCta));
  // A programmatic dependent of the kernel before it on the stream (the attention kernel): it may launch during
  // that kernel's tail and waits in grid_dependency_wait before reading the partials.
  cudaLaunchAttribute programmatic;
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(32 * kWarpsPerCta);
  config.stream = stream;
  config.attrs = &programmatic;
  config.numAttrs = 1;
  switch (head_dim) {
    case 64: FLASH4_CUDA_CHECK(cudaLaunchKernelEx(&config, combine_kernel<Element, 2>, p)); break;
    case 128: FLASH4_CUDA_CHECK(cudaLaunchKernelEx(&config, combine_kernel<Element, 4>, p)); break;
    case 256: FLASH4_CUDA_CHECK(cudaLaunchKernelEx(&config, combine_kernel<Element, 8>, p)); break;
    default: throw Error(Status::kNotSupported, "flash4: the decode combine supports head_dim 64, 128, 256");
  }
}

}  // namespace

void launch_combine(const CombineParams& p, DType dtype, int head_dim, cudaStream_t stream) {
  if (int64_t{p.batch} * p.heads * p.seqlen_q == 0) return;
  if (dtype == DType::kBFloat16) return launch<__nv_bfloat16>(p, head_dim, stream);
  launch<__half>(p, head_dim, stream);
}

}  // namespace flash4::sm90::decode
