// The in-place append before decode attention: new keys (rotated when rotary tables are given) and values are
// written into the caches at positions cache_length(b) .. + seqlen_new - 1 of each sequence (contiguous or paged,
// through PagedKeys, clamped: common/kvcache_problem.h), and q is rotated into a contiguous copy that the
// attention kernel reads. One warp per row (a (sequence, new key, KV head) row of k and v, or a (sequence, query,
// head) row of q); rotation in fp32 without fused multiply-adds, rounded once to the dtype, as the CPU path does
// (common/rotary.h), so both backends store the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda_check.h"
#include "kernels/sm90/decode/decode_launch.h"

namespace flash4::sm90::decode {
namespace {

constexpr int kWarpsPerCta = 4;

template <class Element>
__device__ __forceinline__ float to_float(Element x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}
template <class Element>
__device__ __forceinline__ Element from_float(float x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return __float2half_rn(x);
}

// dst = src with features [0, rotary_dim) rotated at table row `pos` (rotary_dim = 0: a copy). Warp-wide.
template <class Element>
__device__ void rotate_row(Element* dst, const Element* src, const AppendParams& p, int64_t pos, int lane) {
  const int64_t rotary_dim = p.kv.rotary_dim, half = rotary_dim / 2;
  if (rotary_dim > 0) {
    const int64_t row = p.kv.rotary_row(pos);
    const Element* cos = static_cast<const Element*>(p.cos) + row * p.cos_stride;
    const Element* sin = static_cast<const Element*>(p.sin) + row * p.sin_stride;
    for (int64_t k = lane; k < half; k += 32) {
      const int64_t a = p.kv.rotary_interleaved ? 2 * k : k, b = p.kv.rotary_interleaved ? 2 * k + 1 : k + half;
      const float xa = to_float(src[a]), xb = to_float(src[b]), c = to_float(cos[k]), s = to_float(sin[k]);
      dst[a] = from_float<Element>(__fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s)));
      dst[b] = from_float<Element>(__fadd_rn(__fmul_rn(xa, s), __fmul_rn(xb, c)));
    }
  }
  for (int64_t x = rotary_dim + lane; x < p.head_dim; x += 32) dst[x] = src[x];
}

template <class Element>
__global__ void __launch_bounds__(32 * kWarpsPerCta) append_kernel(const __grid_constant__ AppendParams p) {
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerCta + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t heads_kv = p.kv.attention.heads_kv, heads = p.kv.attention.heads;
  if (row < p.append_rows) {
    const int64_t hkv = row % heads_kv, t = (row / heads_kv) % p.kv.seqlen_new, b = row / (heads_kv * p.kv.seqlen_new);
    const int64_t pos = p.kv.cache_length(b) + t;
    const detail::CacheRow at = p.kv.keys(b).at(pos);
    const Element* k_src = static_cast<const Element*>(p.k_new.data) + b * p.k_new.stride_0 + t * p.k_new.stride_1 +
                           hkv * p.k_new.stride_h;
    const Element* v_src = static_cast<const Element*>(p.v_new.data) + b * p.v_new.stride_0 + t * p.v_new.stride_1 +
                           hkv * p.v_new.stride_h;
    Element* k_dst = static_cast<Element*>(p.k_cache) + at.slot * p.k_cache_strides.stride_0 +
                     at.row * p.k_cache_strides.stride_1 + hkv * p.k_cache_strides.stride_h;
    Element* v_dst = static_cast<Element*>(p.v_cache) + at.slot * p.v_cache_strides.stride_0 +
                     at.row * p.v_cache_strides.stride_1 + hkv * p.v_cache_strides.stride_h;
    rotate_row(k_dst, k_src, p, p.kv.rotary_position(b, pos), lane);
    for (int64_t x = lane; x < p.head_dim; x += 32) v_dst[x] = v_src[x];
    return;
  }
  const int64_t q_row = row - p.append_rows;
  if (q_row >= p.q_rows) return;
  const int64_t seqlen_q = p.kv.attention.seqlen_q;
  const int64_t h = q_row % heads, i = (q_row / heads) % seqlen_q, b = q_row / (heads * seqlen_q);
  const Element* src = static_cast<const Element*>(p.q.data) + b * p.q.stride_0 + i * p.q.stride_1 + h * p.q.stride_h;
  Element* dst = static_cast<Element*>(p.q_rotated) + q_row * p.head_dim;  // contiguous (b, i, h, d)
  const int64_t position = p.kv.cache_length(b) + (p.kv.rotary_q_per_row() ? i : 0);
  rotate_row(dst, src, p, p.kv.rotary_position(b, position), lane);
}

template <class Element>
void launch(const AppendParams& p, cudaStream_t stream) {
  const int64_t rows = p.append_rows + p.q_rows;
  append_kernel<Element><<<static_cast<unsigned>((rows + kWarpsPerCta - 1) / kWarpsPerCta), 32 * kWarpsPerCta, 0,
                           stream>>>(p);
  FLASH4_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_append(const AppendParams& p, DType dtype, cudaStream_t stream) {
  if (p.append_rows + p.q_rows == 0) return;
  if (dtype == DType::kBFloat16) return launch<__nv_bfloat16>(p, stream);
  launch<__half>(p, stream);
}

}  // namespace flash4::sm90::decode
