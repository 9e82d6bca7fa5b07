// CUDA side of the backward (src/api/backends.h): what the GPU backward supports and why not, the workspace, and
// the three launches: preprocess (D, LSE * log2e, zeroed dQ accumulator), main kernel (dK, dV, dQ accumulator),
// postprocess (dQ).
//
// Two main kernels (one rule, use_wgmma_kernel below, picks one per call):
//   wgmma + TMA: head_dim 64 / 128 with seqlen_k > 64 (bwd_wgmma_kernel.cuh) and head_dim 256
//     (bwd_wgmma_hd256_kernel.cuh), seqlen_q >= 1 and tensors TMA can describe (16-byte aligned base, every stride
//     a non-zero multiple of 16 bytes);
//   mma.sync (bwd_mma_sync_kernel.cuh): everything else the GPU backward supports: tiny seqlen_k at d = 64 / 128 (one
//     64-key tile of the mma.sync kernel wastes less than the wgmma kernel's 128-key tile) and layouts TMA cannot
//     describe (at d = 256 two CTAs per K/V tile, one per 128-column half of dK, dV, dQ).
//
// Workspace: one cudaMallocAsync block on the caller's stream, freed with cudaFreeAsync on the same stream after
// the postprocess is enqueued (stream-ordered, so no synchronization; the device's default memory pool caches
// it between calls). Layout, each part 256-byte aligned:
//   dq_accum   fp32 (b, h, sq, d)   zeroed by the preprocess kernel
//   dsum       fp32 (b, h, sq)
//   lse_log2   fp32 (b, h, sq)
//   semaphores int  (column slices, b, h, m_blocks) zeroed; deterministic mode only (slices: mma.sync at d = 256)
//   work_counter int  zeroed by the preprocess kernel; the persistent wgmma kernel's item counter (only where
//                     persistent CTAs run: bwd_persistent_pays, not in deterministic mode)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "api/backends.h"
#include "kernels/cuda_check.h"
#include "kernels/device_guard.h"
#include "kernels/sm90/bwd/bwd_mma_sync_kernel.cuh"
#include "bwd_configs.inc"  // generated: FLASH4_BWD_CONFIGS(X), the compiled (dtype, head_dim) set
#include "common/mask.h"
#include "common/score_transform.h"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_prepost.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_config.h"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"
#include "kernels/sm_count.h"
#include "hw/sm90/tma_map.h"

namespace flash4::sm90 {
// Defined in bwd_mma_sync_launch.cuh and bwd_wgmma_launch.cuh, instantiated in the translation units that
// cmake/bwd_kernels.cmake generates for the compiled configurations (bwd_configs.inc).
template <class Element, int kHeadDim>
void launch_bwd_mma_sync(const BwdParams& params, bool masked, cudaStream_t stream);
template <class Element, int kHeadDim>
void launch_bwd_wgmma(const bwd::BwdWgmmaParams& params, bool masked, cudaStream_t stream);
}  // namespace flash4::sm90

namespace flash4::detail {
namespace {

constexpr int64_t kMaxSeqlen = int64_t{1} << 30;  // keeps every key-minus-query offset in int32 (bwd_params.h)

// A stream-ordered allocation released (stream-ordered) when the scope ends, also on an exception.
class StreamWorkspace {
 public:
  StreamWorkspace(size_t bytes, cudaStream_t stream) : stream_(stream) {
    FLASH4_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
  }
  ~StreamWorkspace() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  }
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

constexpr size_t align256(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

bool supported_bwd_head_dim(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

// Whether this build compiled the backward kernels of (Element, head_dim) (FLASH4_DTYPES x FLASH4_HEAD_DIMS).
template <class T>
constexpr bool compiled_bwd(int64_t head_dim) {
  bool found = false;
#define FLASH4_MATCH_BWD(Ty, D) found = found || (std::is_same_v<T, Ty> && head_dim == D);
  FLASH4_BWD_CONFIGS(FLASH4_MATCH_BWD)
#undef FLASH4_MATCH_BWD
  return found;
}

bool compiled_bwd_for(DType dtype, int64_t head_dim) {
  if (dtype == DType::kBFloat16) return compiled_bwd<__nv_bfloat16>(head_dim);
  if (dtype == DType::kFloat16) return compiled_bwd<__half>(head_dim);
  return false;
}

std::string compiled_bwd_head_dims(DType dtype) {
  std::string out;
  for (int d : {64, 128, 256}) {
    if (compiled_bwd_for(dtype, d)) out += (out.empty() ? "" : ", ") + std::to_string(d);
  }
  return out.empty() ? "none" : out;
}

// Column slices (CTAs per K/V tile) of the mma.sync kernel; each slice has its own deterministic-mode semaphores.
int mma_col_slices(int64_t head_dim) {
  static_assert(sm90::bwd::MmaSyncTile<64>::kColSlices == 1 && sm90::bwd::MmaSyncTile<128>::kColSlices == 1);
  return head_dim == 256 ? sm90::bwd::MmaSyncTile<256>::kColSlices : 1;
}

// 16-byte aligned rows: the kernels move head-dim rows in 16-byte vectors (cp.async, uint4).
bool rows_16b_aligned(const TensorView& t) {
  if (t.numel() == 0) return true;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (t.shape[i] > 1 && (t.stride[i] * dtype_size(t.dtype)) % 16 != 0) return false;
  return true;
}

sm90::BshdStrides strides_of(const TensorView& t) { return {t.stride[0], t.stride[1], t.stride[2]}; }

template <class Element>
void launch_mma_sync(const sm90::BwdParams& params, int64_t head_dim, bool masked, cudaStream_t stream) {
#define FLASH4_LAUNCH_BWD(T, D) \
  if (std::is_same_v<T, Element> && head_dim == D) return sm90::launch_bwd_mma_sync<T, D>(params, masked, stream);
  FLASH4_BWD_CONFIGS(FLASH4_LAUNCH_BWD)
#undef FLASH4_LAUNCH_BWD
  throw Error(Status::kNotSupported, "flash4::backward: no compiled GPU backward kernel for head_dim " +
                                         std::to_string(head_dim));
}

// TMA can describe the tensor: 16-byte aligned base, every stride (also of size-1 dimensions) a non-zero multiple
// of 16 bytes.
bool tma_describable(const TensorView& t) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (t.stride[i] <= 0 || (t.stride[i] * dtype_size(t.dtype)) % 16 != 0) return false;
  return true;
}

// The one selection rule between the two main kernels (see the top of this file).
bool use_wgmma_kernel(const BackwardArgs& args, const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
  if ((p.head_dim != 256 && p.seqlen_k <= 64) || p.seqlen_q < 1 || p.batch < 1 || p.heads < 1 || p.heads_kv < 1) return false;
  for (const TensorView* t : {&args.q, &args.k, &args.v, &args.dout})
    if (!tma_describable(*t)) return false;
  return true;
}

template <class Element>
void launch_wgmma(const sm90::bwd::BwdWgmmaParams& params, int64_t head_dim, bool masked, cudaStream_t stream) {
#define FLASH4_LAUNCH_BWD(T, D) \
  if (std::is_same_v<T, Element> && head_dim == D) return sm90::launch_bwd_wgmma<T, D>(params, masked, stream);
  FLASH4_BWD_CONFIGS(FLASH4_LAUNCH_BWD)
#undef FLASH4_LAUNCH_BWD
  throw Error(Status::kNotSupported, "flash4::backward: no compiled wgmma backward kernel for head_dim " +
                                         std::to_string(head_dim));
}

template <class Element>
void launch_prepost(const sm90::BwdParams& params, int64_t rows, bool post, cudaStream_t stream) {
  using namespace flash4::sm90::bwd;
  const int64_t blocks = post ? (rows * (params.head_dim / 8) + kPrepostThreads - 1) / kPrepostThreads
                              : (rows + kPrepostThreads / kPreLanesPerRow - 1) / (kPrepostThreads / kPreLanesPerRow);
  if (blocks > INT_MAX) throw Error(Status::kNotSupported, "flash4::backward: problem too large for the GPU backward");
  if (post) {
    bwd_postprocess_dq_kernel<Element><<<static_cast<unsigned>(blocks), kPrepostThreads, 0, stream>>>(params);
  } else {
    bwd_preprocess_kernel<Element><<<static_cast<unsigned>(blocks), kPrepostThreads, 0, stream>>>(params);
  }
  FLASH4_CUDA_CHECK_LAUNCH();
}

}  // namespace

Support cuda_can_backward(const BackwardArgs& args, const Problem& p) {
  if (!cuda_device_supported(args.q.device.index))
    return {false, "flash4's GPU kernels need an sm_90 (Hopper) GPU; " + device_name(args.q.device) + " is not one"};
  if (args.q.dtype != DType::kBFloat16 && args.q.dtype != DType::kFloat16)
    return {false, "fp32 is not supported on the GPU; use bf16/fp16 or the CPU"};
  if (!supported_bwd_head_dim(p.head_dim))
    return {false, "head_dim " + std::to_string(p.head_dim) +
                       " is not supported by the GPU backward (supported: 64, 128, 256; use the CPU)"};
  if (!compiled_bwd_for(args.q.dtype, p.head_dim))
    return {false, "head_dim " + std::to_string(p.head_dim) + " is not compiled for the GPU backward (available for " +
                       dtype_name(args.q.dtype) + ": " + compiled_bwd_head_dims(args.q.dtype) + ")"};
  const std::pair<const TensorView*, const char*> tensors[] = {
      {&args.q, "q"},   {&args.k, "k"},       {&args.v, "v"},   {&args.out, "out"},
      {&args.dout, "dout"}, {&args.dq, "dq"}, {&args.dk, "dk"}, {&args.dv, "dv"}};
  for (const auto& [t, name] : tensors) {
    if (!rows_16b_aligned(*t))
      return {false, std::string("the GPU backward needs 16-byte aligned data pointers and strides that are "
                                 "multiples of 8 elements; ") +
                         name + " is not (make it contiguous)"};
  }
  if (p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen || p.heads > 65535 || p.heads_kv > 65535 ||
      p.batch > 65535)
    return {false, "the GPU backward supports seqlen <= 2^30 and batch, heads <= 65535"};
  // Work items of the wgmma kernels (bwd_schedule.h) are numbered in 32 bits; 64 keys per item at least.
  if ((p.seqlen_k + 63) / 64 * p.heads_kv * p.batch >= (int64_t{1} << 31))
    return {false, "the GPU backward supports fewer than 2^31 (64-key tiles x kv heads x batch)"};
  return {true, ""};
}

void cuda_backward(const BackwardArgs& args, const Problem& p, Stream stream) {
  using sm90::BwdParams;
  DeviceGuard guard(args.q.device.index);
  const auto s = static_cast<cudaStream_t>(stream);
  constexpr int kOldBlockM = sm90::bwd::MmaSyncTile<64>::kBlockM, kOldBlockN = sm90::bwd::MmaSyncTile<64>::kBlockN;
  static_assert(kOldBlockM == sm90::bwd::MmaSyncTile<128>::kBlockM && kOldBlockN == sm90::bwd::MmaSyncTile<128>::kBlockN &&
                    kOldBlockM == sm90::bwd::MmaSyncTile<256>::kBlockM && kOldBlockN == sm90::bwd::MmaSyncTile<256>::kBlockN,
                "the mma.sync kernel has one tile shape for every head dim");
  const bool wgmma = use_wgmma_kernel(args, p);
  // Tile shape of the chosen kernel: m_blocks sizes the deterministic-mode semaphores, n_blocks the grid.
  const int block_m = !wgmma              ? kOldBlockM
                      : p.head_dim == 64  ? sm90::bwd::WgmmaTile<64>::kBlockM
                      : p.head_dim == 128 ? sm90::bwd::WgmmaTile<128>::kBlockM
                                          : sm90::bwd::WgmmaTileHd256::kBlockM;
  const int block_n = !wgmma ? kOldBlockN
                      : p.head_dim == 256 ? sm90::bwd::WgmmaTileHd256::kBlockN
                                          : sm90::bwd::WgmmaTile<128>::kBlockN;
  static_assert(sm90::bwd::WgmmaTile<64>::kBlockN == sm90::bwd::WgmmaTile<128>::kBlockN);

  BwdParams params{};
  params.q = args.q.data;
  params.k = args.k.data;
  params.v = args.v.data;
  params.out = args.out.data;
  params.dout = args.dout.data;
  params.lse = static_cast<const float*>(args.lse.data);
  params.lse_stride_b = args.lse.stride[0];
  params.lse_stride_h = args.lse.stride[1];
  params.q_stride = strides_of(args.q);
  params.k_stride = strides_of(args.k);
  params.v_stride = strides_of(args.v);
  params.out_stride = strides_of(args.out);
  params.dout_stride = strides_of(args.dout);
  params.dq = args.dq.data;
  params.dk = args.dk.data;
  params.dv = args.dv.data;
  params.dq_stride = strides_of(args.dq);
  params.dk_stride = strides_of(args.dk);
  params.dv_stride = strides_of(args.dv);

  params.batch = static_cast<int>(p.batch);
  params.seqlen_q = static_cast<int>(p.seqlen_q);
  params.seqlen_k = static_cast<int>(p.seqlen_k);
  params.heads = static_cast<int>(p.heads);
  params.heads_kv = static_cast<int>(p.heads_kv);
  params.group = static_cast<int>(p.group());
  params.head_dim = static_cast<int>(p.head_dim);
  params.m_blocks = static_cast<int>((p.seqlen_q + block_m - 1) / block_m);
  params.n_blocks = static_cast<int>((p.seqlen_k + block_n - 1) / block_n);
  // The common mask and score transform (common/mask.h, common/score_transform.h); the band in int for the kernels'
  // compares, unbounded sides as the sentinels every real offset satisfies.
  const SequenceMask band = SequenceMask::make(p.mask(), p.seqlen_q, p.seqlen_k);
  params.band_lo = sm90::clamp_band(band.band_lo);
  params.band_hi = sm90::clamp_band(band.band_hi);
  const ScoreTransform score = p.score_transform();
  params.softmax_scale = score.softmax_scale;
  params.softcap = score.softcap;
  params.tanh_scale = score.tanh_scale;
  params.log2_scale = score.log2_scale;
  params.deterministic = args.deterministic;
  if (args.deterministic && wgmma) {
    // Key tiles of one (batch, kv head) that fit on half the SMs: all resident together, with room left for other
    // work on the GPU.
    const int resident_key_tiles = detail::current_device_sm_count() / 2;
    // Rotated deterministic order (bwd_schedule.h): a CTA may wait on CTAs of its (batch, kv head) launched after
    // it, so all of them must be resident together. It also ties every CTA of a head to the pace of the
    // latest-launched one, which pays while start tiles are spread apart: up to 32 key tiles per step of spacing
    // between start tiles (the measurements are in docs/performance.md).
    if (!p.has_mask() && params.n_blocks > 0) {
      const int spacing = std::max(1, params.m_blocks / params.n_blocks);
      params.det_rotated = params.n_blocks <= std::min(resident_key_tiles, 32 * spacing);
    }
    // d = 256: release dQ additions one tile late (bwd_wgmma_hd256_kernel.cuh), so that the release fence stops
    // stalling the warpgroup; not where each CTA waits on its predecessor's release in lockstep (unmasked,
    // unrotated, and a head's CTAs resident together), where the late release lengthens the chain.
    if (p.head_dim == 256) {
      params.det_defer_release = p.has_mask() || params.det_rotated || params.n_blocks > resident_key_tiles;
    }
  }

  const int64_t rows = p.batch * p.heads * p.seqlen_q;
  const size_t accum_bytes = align256(static_cast<size_t>(rows * p.head_dim) * sizeof(float));
  const size_t row_bytes = align256(static_cast<size_t>(rows) * sizeof(float));
  const int64_t col_slices = wgmma ? 1 : mma_col_slices(p.head_dim);
  const size_t sem_bytes =
      args.deterministic
          ? align256(static_cast<size_t>(col_slices * p.batch * p.heads * params.m_blocks) * sizeof(int))
          : 0;
  // Persistent CTAs where they pay (bwd_schedule.h); their item counter is zeroed by the preprocess kernel, which
  // runs whenever rows > 0.
  const bool persistent = wgmma && !args.deterministic && p.head_dim <= 128 && rows > 0 &&
                          sm90::bwd::bwd_persistent_pays(params, block_m);
  const size_t counter_bytes = persistent ? 256 : 0;
  StreamWorkspace workspace(std::max<size_t>(accum_bytes + 2 * row_bytes + sem_bytes + counter_bytes, 256), s);
  char* ws = workspace.data();
  params.dq_accum = reinterpret_cast<float*>(ws);
  params.dsum = reinterpret_cast<float*>(ws + accum_bytes);
  params.lse_log2 = reinterpret_cast<float*>(ws + accum_bytes + row_bytes);
  params.semaphores = reinterpret_cast<int*>(ws + accum_bytes + 2 * row_bytes);
  // dq_accum is zeroed by the preprocess kernel (bwd_prepost.cuh), which runs whenever it is non-empty.
  if (persistent) {
    params.work_counter = reinterpret_cast<int*>(ws + accum_bytes + 2 * row_bytes + sem_bytes);
  }
  if (sem_bytes > 0) FLASH4_CUDA_CHECK(cudaMemsetAsync(params.semaphores, 0, sem_bytes, s));

  const bool bf16 = args.q.dtype == DType::kBFloat16;
  if (rows > 0) {
    if (bf16) launch_prepost<__nv_bfloat16>(params, rows, /*post=*/false, s);
    else launch_prepost<__half>(params, rows, /*post=*/false, s);
  }
  // The main kernel also writes dK = dV = 0 when no query can see a key tile (seqlen_q == 0, heads == 0, masks).
  if (params.n_blocks > 0 && p.batch > 0) {
    if (wgmma) {
      sm90::bwd::BwdWgmmaParams wp{};
      wp.p = params;
      const TensorView &q = args.q, &k = args.k, &v = args.v, &dout = args.dout;
      wp.tma_q = sm90::make_tensor_map_bshd(q.data, p.batch, p.seqlen_q, p.heads, p.head_dim, q.stride[0],
                                            q.stride[1], q.stride[2], block_m);
      wp.tma_do = sm90::make_tensor_map_bshd(dout.data, p.batch, p.seqlen_q, p.heads, p.head_dim, dout.stride[0],
                                             dout.stride[1], dout.stride[2], block_m);
      wp.tma_k = sm90::make_tensor_map_bshd(k.data, p.batch, p.seqlen_k, p.heads_kv, p.head_dim, k.stride[0],
                                            k.stride[1], k.stride[2], block_n);
      wp.tma_v = sm90::make_tensor_map_bshd(v.data, p.batch, p.seqlen_k, p.heads_kv, p.head_dim, v.stride[0],
                                            v.stride[1], v.stride[2], block_n);
      wp.tma_dq = sm90::make_tensor_map_f32_bhsd(params.dq_accum, p.batch, p.heads, p.seqlen_q, p.head_dim, 64);
      if (bf16) launch_wgmma<__nv_bfloat16>(wp, p.head_dim, p.has_mask(), s);
      else launch_wgmma<__half>(wp, p.head_dim, p.has_mask(), s);
    } else {
      if (bf16) launch_mma_sync<__nv_bfloat16>(params, p.head_dim, p.has_mask(), s);
      else launch_mma_sync<__half>(params, p.head_dim, p.has_mask(), s);
    }
  }
  if (rows > 0) {
    if (bf16) launch_prepost<__nv_bfloat16>(params, rows, /*post=*/true, s);
    else launch_prepost<__half>(params, rows, /*post=*/true, s);
  }
}

}  // namespace flash4::detail
