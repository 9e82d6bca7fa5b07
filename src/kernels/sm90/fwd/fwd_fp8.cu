// The FP8 (e4m3) forward's host side and its V transpose (fwd_fp8.h).
//
// Why a transposed copy of V: FP8 wgmma reads both operands K-major, and P V reduces over keys, so V must lie
// (d, keys) in shared memory. Transposing in the kernel would take a warpgroup's shared-memory traffic per tile
// (the producer is one thread issuing TMA); a copy costs one read and one write of V per call (1 byte per
// element), which the matmuls' O(seqlen) reuse of every V tile amortizes beyond short sequences. The copy also
// takes two jobs off the kernel: its key columns are stored in the order the P fragments need (fwd_fp8_key_order.h),
// and its rows past seqlen_k are zeros, so a tile's tail needs no clearing.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "fwd_fp8_configs.inc"  // generated: FLASH4_FWD_FP8_CONFIGS(X), the compiled (head_dim, masked) set
#include "hw/sm90/tma_map.h"
#include "kernels/cuda_check.h"
#include "kernels/sm90/fwd/fwd_config.h"
#include "kernels/sm90/fwd/fwd_fp8.h"
#include "kernels/sm90/fwd/fwd_fp8_key_order.h"
#include "kernels/sm90/fwd/fwd_params.h"
#include "kernels/sm90/fwd/fwd_params_builder.h"
#include "kernels/stream_workspace.h"

namespace flash4::sm90 {
// Defined in fwd_launch.cuh and instantiated in the generated translation units.
template <int kHeadDim, bool kMasked>
void launch_forward_fp8(const FwdParams& params, bool persistent, cudaStream_t stream);
}  // namespace flash4::sm90

namespace flash4::detail {
namespace {

constexpr int kKeyTile = 128;  // the FP8 kernels' block_n: V^T's length is padded to whole tiles

// vt[b][hk][d][c] = v[b][sm90::fp8::key_of_column(c)][hk][d] for c < padded (zero past seqlen_k), one CTA per 64 keys x
// 64 columns of d of one (b, hk). v: e4m3 bytes with element strides, d contiguous, rows 16-byte aligned.
__global__ void __launch_bounds__(256) fp8_v_transpose_kernel(const uint8_t* v, int64_t stride_b, int64_t stride_s,
                                                              int64_t stride_h, int seqlen_k, int head_dim,
                                                              int heads_kv, int padded, uint8_t* vt) {
  __shared__ uint8_t tile[64][64 + 16];  // [key][d column], rows padded against bank conflicts
  const int key0 = blockIdx.x * 64, d0 = blockIdx.y * 64;
  const int b = blockIdx.z / heads_kv, hk = blockIdx.z % heads_kv;
  const int row = threadIdx.x / 4, part = (threadIdx.x % 4) * 16;  // 16 bytes per thread
  uint4 in = make_uint4(0u, 0u, 0u, 0u);
  if (key0 + row < seqlen_k)
    in = *reinterpret_cast<const uint4*>(v + b * stride_b + static_cast<int64_t>(key0 + row) * stride_s +
                                         hk * stride_h + d0 + part);
  *reinterpret_cast<uint4*>(&tile[row][part]) = in;
  __syncthreads();
  // Thread: d column d0 + row, columns key0 + part .. + 15 of V^T.
  uint32_t out[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) word |= uint32_t{tile[sm90::fp8::key_of_column(part + 4 * w + i)][row]} << (8 * i);
    out[w] = word;
  }
  uint8_t* dst = vt + ((static_cast<int64_t>(b) * heads_kv + hk) * head_dim + d0 + row) * padded + key0 + part;
  *reinterpret_cast<uint4*>(dst) = make_uint4(out[0], out[1], out[2], out[3]);
}

template <int D, bool M>
constexpr bool compiled_one(int d, bool masked) {
  return d == D && masked == M;
}
bool compiled_fp8(int head_dim, bool masked) {
  bool found = false;
#define FLASH4_MATCH_FP8(D, M) found = found || compiled_one<D, M>(head_dim, masked);
  FLASH4_FWD_FP8_CONFIGS(FLASH4_MATCH_FP8)
#undef FLASH4_MATCH_FP8
  return found;
}

void launch_compiled_fp8(const sm90::FwdParams& params, int head_dim, bool masked, bool persistent,
                         cudaStream_t s) {
#define FLASH4_LAUNCH_FP8(D, M) \
  if (head_dim == D && masked == M) return sm90::launch_forward_fp8<D, M>(params, persistent, s);
  FLASH4_FWD_FP8_CONFIGS(FLASH4_LAUNCH_FP8)
#undef FLASH4_LAUNCH_FP8
  throw Error(Status::kNotSupported, "flash4: no compiled FP8 GPU forward kernel for this configuration");
}

}  // namespace

Support cuda_can_forward_fp8(const ForwardArgs& args, const Problem& p) {
  if (p.head_dim != p.head_dim_v || (p.head_dim != 128 && p.head_dim != 256))
    return {false, "the FP8 GPU forward takes head_dim 128 or 256 (v's equal to q's), not (" +
                       std::to_string(p.head_dim) + ", " + std::to_string(p.head_dim_v) + "); the CPU runs FP8 at any"};
  if (!compiled_fp8(static_cast<int>(p.head_dim), p.has_mask()))
    return {false, "head_dim " + std::to_string(p.head_dim) + " is not compiled for the FP8 GPU forward"};
  if (p.varlen() || p.seqused_q != nullptr || p.seqused_k != nullptr)
    return {false, "the FP8 GPU forward takes dense batches only (no cu_seqlens, seqused_q / seqused_k); the CPU "
                   "runs packed FP8 batches"};
  if (args.out.dtype != DType::kBFloat16)
    return {false, std::string("the FP8 GPU forward writes bf16 out, not ") + dtype_name(args.out.dtype) +
                       "; the CPU writes fp16 too"};
  for (const auto* t : {&args.q, &args.k, &args.v, &args.out}) {
    if (!tma_compatible(*t))
      return {false, "the FP8 GPU forward needs 16-byte aligned data pointers and byte strides that are multiples "
                     "of 16 (TMA); make the tensors contiguous"};
  }
  constexpr int64_t kMax = (int64_t{1} << 31) - 1 - kKeyTile;  // TMA coordinates are 32-bit
  if (p.seqlen_q > kMax || p.seqlen_k > kMax || p.heads > 65535 || p.batch * p.heads_kv > 65535 || p.batch > 65535)
    return {false, "the FP8 GPU forward supports seqlen < 2^31 - 128, batch, heads and batch * heads_kv <= 65535"};
  return fwd_int32_limits(p, sm90::fwd_fp8_tile_config(static_cast<int>(p.head_dim)).block_m);
}

void cuda_forward_fp8(const ForwardArgs& args, const Problem& p, cudaStream_t stream) {
  using namespace flash4::sm90;
  const int d = static_cast<int>(p.head_dim);
  const bool masked = p.has_mask();
  const FwdTileConfig tile = fwd_fp8_tile_config(d);
  const int padded = static_cast<int>((p.seqlen_k + kKeyTile - 1) / kKeyTile * kKeyTile);

  // V^T: (batch, heads_kv, d, padded) e4m3, written whole (zeros past seqlen_k).
  const size_t vt_bytes = static_cast<size_t>(p.batch * p.heads_kv) * d * padded;
  StreamWorkspace vt(vt_bytes, stream);
  const auto& v = args.v;
  const dim3 grid(static_cast<unsigned>(padded / 64), static_cast<unsigned>(d / 64),
                  static_cast<unsigned>(p.batch * p.heads_kv));
  fp8_v_transpose_kernel<<<grid, 256, 0, stream>>>(static_cast<const uint8_t*>(v.data), v.stride[0], v.stride[1],
                                                   v.stride[2], static_cast<int>(p.seqlen_k), d,
                                                   static_cast<int>(p.heads_kv), padded,
                                                   reinterpret_cast<uint8_t*>(vt.data()));
  FLASH4_CUDA_CHECK_LAUNCH();

  FwdParams params = fwd_params_without_maps(args, p, tile);
  const auto& q = args.q;
  const auto& k = args.k;
  // e4m3 tensors as bytes: boxes of 128 columns (one 128-byte swizzle chunk) by a tile's rows.
  params.tma_q = make_tensor_map_4d(q.data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.batch, p.seqlen_q, p.heads, d,
                                    q.stride[0], q.stride[1], q.stride[2], 128, tile.block_m);
  params.tma_k = make_tensor_map_4d(k.data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.batch, p.seqlen_k, p.heads_kv, d,
                                    k.stride[0], k.stride[1], k.stride[2], 128, tile.block_n);
  // V^T as a (b, hkv, d, keys) tensor: "rows" are d, "columns" keys; a box is 128 keys by all d rows.
  params.tma_v = make_tensor_map_4d(vt.data(), CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.batch, d, p.heads_kv, padded,
                                    int64_t{p.heads_kv} * d * padded, padded, int64_t{d} * padded, 128, d);
  params.clear_key_tail = false;
  params.q_descale = p.q_descale;
  params.k_descale = p.k_descale;
  params.v_descale = p.v_descale;
  launch_compiled_fp8(params, d, masked, fwd_launch_persistent(d, masked, static_cast<int>(p.seqlen_q)), stream);
}

}  // namespace flash4::detail
