// The forward's CUDA side of dispatch: decides whether the Hopper kernels can run a validated problem (and says
// why not), chooses the launch configuration once (fwd_launch_config), fills the kernel parameters for it and
// launches the compiled kernel. The backward's counterpart is bwd/bwd_api.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "api/backends.h"
#include "common/decode_rows.h"
#include "fwd_configs.inc"  // generated: FLASH4_FWD_CONFIGS(X), the compiled (dtype, head_dim, masked) set
#include "hw/sm90/tma_map.h"
#include "kernels/cuda_check.h"
#include "kernels/device_guard.h"
#include "kernels/sm90/decode/decode_dense.h"
#include "kernels/sm90/fwd/fwd_config.h"
#include "kernels/sm90/fwd/fwd_empty.h"
#include "kernels/sm90/fwd/fwd_fp8.h"
#include "kernels/sm90/fwd/fwd_kvcache.h"
#include "kernels/sm90/fwd/fwd_params.h"
#include "kernels/sm90/fwd/fwd_params_builder.h"
#include "kernels/sm90/fwd/fwd_tile_scheduler.h"
#include "kernels/sm90/head_dims.h"
#include "kernels/sm_count.h"
#include "kernels/stream_workspace.h"

namespace flash4::sm90 {
// Defined in fwd_launch.cuh and instantiated in the generated translation units.
template <class Element, int kHeadDim, bool kMasked>
void launch_forward(const FwdParams& params, const FwdLaunchConfig& launch, cudaStream_t stream);
template <class Element, int kHeadDim, int kHeadDimV, bool kMasked>
void launch_forward_split(const FwdParams& params, const FwdLaunchConfig& launch, cudaStream_t stream);
}  // namespace flash4::sm90

namespace flash4::detail {
namespace {

template <class T>
constexpr bool compiled_fwd(int head_dim, bool masked) {
  bool found = false;
#define FLASH4_MATCH_FWD(Ty, D, M) found = found || (std::is_same_v<T, Ty> && head_dim == D && masked == M);
  FLASH4_FWD_CONFIGS(FLASH4_MATCH_FWD)
#undef FLASH4_MATCH_FWD
  return found;
}

bool compiled_fwd_for(DType dtype, int64_t head_dim, bool masked) {
  if (dtype == DType::kBFloat16) return compiled_fwd<__nv_bfloat16>(static_cast<int>(head_dim), masked);
  if (dtype == DType::kFloat16) return compiled_fwd<__half>(static_cast<int>(head_dim), masked);
  return false;
}

std::string compiled_head_dims(DType dtype) {
  std::string out;
  for (int64_t d : sm90::kFwdKernelHeadDims) {
    if (compiled_fwd_for(dtype, d, false)) out += (out.empty() ? "" : ", ") + std::to_string(d);
  }
  return out.empty() ? "none" : out;
}

// The v / out width of the kernel that runs head dims (d, dv): the split kernel's own (fwd_has_split_kernel),
// else the q / k kernel width (v zero-padded to it).
int kernel_head_dim_v(int64_t d, int64_t dv) {
  const int width = sm90::fwd_kernel_head_dim(d, dv);
  return sm90::fwd_has_split_kernel(width, static_cast<int>(dv)) ? static_cast<int>(dv) : width;
}

// Launches the compiled forward kernel of (dtype, kernel head dims, mask) with these parameters.
void launch_compiled_forward(const sm90::FwdParams& params, const sm90::FwdLaunchConfig& launch, DType dtype,
                             int width, int width_v, bool masked, cudaStream_t s) {
  const bool bf16 = dtype == DType::kBFloat16;
#define FLASH4_LAUNCH_FWD(T, D, M)                                                           \
  if (std::is_same_v<T, __nv_bfloat16> == bf16 && width == D && width_v == D && masked == M) \
    return sm90::launch_forward<T, D, M>(params, launch, s);
  FLASH4_FWD_CONFIGS(FLASH4_LAUNCH_FWD)
#undef FLASH4_LAUNCH_FWD
#define FLASH4_LAUNCH_FWD_SPLIT(T, D, DV, M)                                                  \
  if (std::is_same_v<T, __nv_bfloat16> == bf16 && width == D && width_v == DV && masked == M) \
    return sm90::launch_forward_split<T, D, DV, M>(params, launch, s);
  FLASH4_FWD_SPLIT_CONFIGS(FLASH4_LAUNCH_FWD_SPLIT)
#undef FLASH4_LAUNCH_FWD_SPLIT
  throw Error(Status::kNotSupported, "flash4: no compiled GPU forward kernel for this configuration");
}


// An attention tensor as the kernels address it, (batch, seqlen, heads, head_dim) element strides: a packed
// (total, heads, head_dim) tensor is one batch entry of `total` rows.
struct BshdView {
  int64_t batch, seqlen, stride_b, stride_s, stride_h;
};
BshdView bshd(const TensorView& t) {
  if (t.rank == 3) return {1, t.shape[0], 0, t.stride[0], t.stride[1]};
  return {t.shape[0], t.shape[1], t.stride[0], t.stride[1], t.stride[2]};
}

}  // namespace

// TMA needs 16-byte aligned base addresses and byte strides (all but the contiguous last) that are multiples
// of 16.
bool tma_compatible(const TensorView& t) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i + 1 < t.rank; ++i)
    if ((t.stride[i] * dtype_size(t.dtype)) % 16 != 0) return false;
  return true;
}

bool cuda_device_supported(int device_index) {
  // Answers are cached per device: the property query is slow and the answer never changes in a process.
  constexpr int kMaxDevices = 64;
  static std::atomic<int8_t> cache[kMaxDevices] = {};  // 0 unknown, 1 supported, -1 not
  if (device_index < 0 || device_index >= kMaxDevices) return false;
  const int8_t known = cache[device_index].load(std::memory_order_relaxed);
  if (known != 0) return known > 0;
  int count = 0;
  bool ok = false;
  if (cudaGetDeviceCount(&count) == cudaSuccess && device_index < count) {
    int major = 0, minor = 0;
    ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index) == cudaSuccess &&
         major == 9 && minor == 0;
  }
  cudaGetLastError();  // a failed query (no driver, no device) must not leave a sticky error behind
  cache[device_index].store(ok ? 1 : -1, std::memory_order_relaxed);
  return ok;
}

Support cuda_can_forward(const ForwardArgs& args, const Problem& p) {
  if (!cuda_device_supported(args.q.device.index))
    return {false, "flash4's GPU kernels need an sm_90 (Hopper) GPU; " + device_name(args.q.device) + " is not one"};
  if (args.q.dtype == DType::kFloat8E4M3) return cuda_can_forward_fp8(args, p);
  if (args.q.dtype != DType::kBFloat16 && args.q.dtype != DType::kFloat16)
    return {false, std::string("the GPU forward supports bf16 and fp16, not ") + dtype_name(args.q.dtype) +
                       "; use the CPU for fp32"};
  if (const std::string why = sm90::head_dim_refusal(p, "forward"); !why.empty()) return {false, why};
  const int width = sm90::fwd_kernel_head_dim(p.head_dim, p.head_dim_v);
  if (!compiled_fwd_for(args.q.dtype, width, p.has_mask()))
    return {false, "head_dim " + std::to_string(p.head_dim) + " is not compiled for the GPU forward (it runs on the " +
                       std::to_string(width) + " kernel; available for " + dtype_name(args.q.dtype) + ": " +
                       compiled_head_dims(args.q.dtype) + ")"};
  for (const auto* t : {&args.q, &args.k, &args.v, &args.out}) {
    if (!tma_compatible(*t))
      return {false, "the GPU forward needs 16-byte aligned data pointers and strides that are multiples of 8 "
                     "elements (TMA); make the tensors contiguous"};
  }
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;  // TMA coordinates are 32-bit
  if (p.seqlen_q > kMax || p.seqlen_k > kMax || p.total_q > kMax || p.total_k > kMax || p.heads > 65535 ||
      p.batch > 65535)
    return {false, "the GPU forward supports seqlen and total tokens < 2^31 and batch, heads <= 65535"};
  return fwd_int32_limits(p, choose_fwd_launch(p).tile.block_m);
}

Support fwd_int32_limits(const Problem& p, int64_t block_m) {
  // The kernels count rows and tiles in int (a packed batch's tiles come from max_seqlen_q, however short its
  // sequences): a tile's last row, a masked row's last key (row + band_hi, band_hi up to seqlen_k) and the tile
  // ids a CTA claims (up to twice the tile count on a one-CTA-per-tile grid) must stay below 2^31.
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  const int64_t tiles = p.batch * p.heads * ((p.seqlen_q + block_m - 1) / block_m);
  if (p.seqlen_q > kMax - block_m || 2 * tiles + 1024 > kMax)
    return {false, "the GPU forward supports batch * heads * ceil(seqlen_q / " + std::to_string(block_m) +
                       ") < 2^30 query tiles and seqlen_q < 2^31 - " + std::to_string(block_m) +
                       " (for a packed batch, seqlen_q is max_seqlen_q: give the longest segment's length)"};
  if (p.has_mask() && p.seqlen_q + p.seqlen_k > kMax)
    return {false, "the GPU forward supports causal and windowed attention with seqlen_q + seqlen_k < 2^31"};
  return {true, ""};
}

sm90::FwdLaunchConfig choose_fwd_launch(const Problem& p) {
  // The configuration of the kernel that runs the problem (head dims without a kernel of their own run
  // zero-padded on the next wider one: head_dims.h).
  return sm90::fwd_launch_config(sm90::fwd_kernel_head_dim(p.head_dim, p.head_dim_v),
                                 kernel_head_dim_v(p.head_dim, p.head_dim_v), p.has_mask(),
                                 static_cast<int>(p.seqlen_q));
}

sm90::FwdParams make_fwd_params(const ForwardArgs& args, const Problem& p, const sm90::FwdTileConfig& tile) {
  using namespace flash4::sm90;
  const int block_m = tile.block_m, block_n = tile.block_n;
  FwdParams params = fwd_params_without_maps(args, p, tile);
  const auto& q = args.q;
  const auto& k = args.k;
  const auto& v = args.v;
  const BshdView qv = bshd(q), kv = bshd(k), vv = bshd(v);
  params.tma_q = make_tensor_map_bshd(q.data, qv.batch, qv.seqlen, p.heads, p.head_dim, qv.stride_b, qv.stride_s,
                                      qv.stride_h, block_m);
  params.tma_k = make_tensor_map_bshd(k.data, kv.batch, kv.seqlen, p.heads_kv, p.head_dim, kv.stride_b, kv.stride_s,
                                      kv.stride_h, block_n);
  params.tma_v = make_tensor_map_bshd(v.data, vv.batch, vv.seqlen, p.heads_kv, p.head_dim_v, vv.stride_b,
                                      vv.stride_s, vv.stride_h, block_n);
  return params;
}

sm90::FwdParams fwd_params_without_maps(const ForwardArgs& args, const Problem& p, const sm90::FwdTileConfig& tile) {
  using namespace flash4::sm90;
  FwdParams params{};
  const auto& o = args.out;
  const BshdView ov = bshd(o);
  params.head_dim_v = static_cast<int>(p.head_dim_v);
  params.out = o.data;
  params.out_stride_b = ov.stride_b;
  params.out_stride_s = ov.stride_s;
  params.out_stride_h = ov.stride_h;
  if (args.lse.data != nullptr) {  // (batch, heads, seqlen_q), or (heads, total_q) when packed
    params.lse = static_cast<float*>(args.lse.data);
    params.lse_stride_b = args.lse.rank == 2 ? 0 : args.lse.stride[0];
    params.lse_stride_h = args.lse.rank == 2 ? args.lse.stride[0] : args.lse.stride[1];
  }
  params.learnable_sink = p.learnable_sink;
  params.batch = static_cast<int>(p.batch);
  params.heads = static_cast<int>(p.heads);
  params.group = static_cast<int>(p.group());
  params.num_m_blocks = static_cast<int>((p.seqlen_q + tile.block_m - 1) / tile.block_m);
  params.tile_section = fwd_tile_section(p.batch * p.heads, p.group(), p.seqlen_k, p.head_dim, p.head_dim_v,
                                         dtype_size(args.q.dtype));
  params.seq = p.layout();
  params.mask = p.mask();
  params.score = p.score_transform();
  params.clear_key_tail = p.seqused_k != nullptr || p.varlen();  // rows past a sequence may hold anything
  params.conditional_rescale = args.tuning.conditional_rescale;
  params.exp2_poly = args.tuning.exp2 != Exp2Mode::kExact;
  return params;
}

void cuda_forward(const ForwardArgs& args, const Problem& p, Stream stream) {
  using namespace flash4::sm90;
  DeviceGuard guard(args.q.device.index);
  const bool masked = p.has_mask();
  const auto& q = args.q;
  auto s = static_cast<cudaStream_t>(stream);
  // No key, or a packed batch of no sequence (cu_seqlens of one entry: every row is in none, and a kernel's grid
  // would have no CTA): the rows are cleared, nothing else runs.
  if (p.seqlen_k == 0 || p.total_k == 0 || p.batch == 0) return launch_forward_no_keys(args, p, s);
  if (q.dtype == DType::kFloat8E4M3) return cuda_forward_fp8(args, p, s);
  if (dense_decode_route(args, p)) return dense_decode_forward(args, p, s);  // decode-like: the split-KV kernel
  // A packed batch's short segments beside long ones: the decode kernel takes them (and clears the rows in no
  // segment). Otherwise rows in no sequence (past seqused_q or the last packed segment) are cleared first; the
  // kernel writes the rest.
  const int64_t decode_queries = packed_decode_share(args, p);
  if (decode_queries > 0) dense_decode_forward(args, p, s, decode_queries);
  else if (p.varlen() || p.seqused_q != nullptr) launch_forward_uncovered_rows(args, p, s);
  const FwdLaunchConfig launch = choose_fwd_launch(p);
  FwdParams params = make_fwd_params(args, p, launch.tile);
  if (decode_queries > 0) params.seq.min_seqlen_q = decode_queries + 1;
  launch_compiled_forward(params, launch, q.dtype, fwd_kernel_head_dim(p.head_dim, p.head_dim_v),
                          kernel_head_dim_v(p.head_dim, p.head_dim_v), masked, s);
}

namespace {

// Keys each sequence of a KV-cache call attends to (its cache length plus the appended keys), for the dense
// kernel's layout (seqused_k).
__global__ void kvcache_lengths_kernel(KvCacheProblem kv, int* lengths) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < kv.attention.batch;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x)
    lengths[b] = static_cast<int>(kv.seqlen_k(b));
}

// Rows per TMA box of a cache: one K/V tile, which must lie in one cache row (contiguous) or one page (a page
// size that is a multiple of the tile and a power of two: the producer shifts by it). 0: the dense kernel cannot
// read this cache (smaller pages stay on the decode kernel, which gathers rows).
int cache_rows_per_load(const KvCacheProblem& p, int block_n) {
  if (!p.paged) return block_n;
  if (p.page_shift >= 0 && p.page_size % block_n == 0) return block_n;
  return 0;
}

bool tma_rows(const TensorView& t) { return t.data == nullptr || tma_compatible(t); }

}  // namespace

bool kvcache_dense_route(const KvCacheArgs& a, const KvCacheProblem& p) {
  const Problem& s = p.attention;
  if (decode_rows(s.seqlen_q, s.group())) return false;  // the decode kernel's rows
  if (decode_rows_on_few_ctas(s.seqlen_q, s.group(), s.batch, s.heads, p.capacity, current_device_sm_count()))
    return false;  // one long cache's few dozen queries: the decode kernel's split keys
  if (p.cache_leftpad != nullptr) return false;  // the dense kernel reads each sequence's keys from row 0
  // Unpadded widths the decode kernels share (a 192 cache is refused with theirs: no GPU test reads a cache with
  // the 192 kernel yet).
  if (s.split_head_dims() || sm90::kernel_head_dim(s.head_dim, s.head_dim_v) != s.head_dim) return false;
  if (p.capacity <= 0 || p.capacity >= (int64_t{1} << 31) || s.batch > 65535 || s.heads > 65535) return false;
  if (!compiled_fwd_for(a.q.dtype, static_cast<int>(s.head_dim), s.has_mask())) return false;
  const sm90::FwdTileConfig tile = choose_fwd_launch(s).tile;
  if (cache_rows_per_load(p, tile.block_n) == 0) return false;
  Problem over_cache = s;  // the dense kernel's view: every sequence as long as the cache's capacity
  over_cache.seqlen_k = p.capacity;
  if (!fwd_int32_limits(over_cache, tile.block_m).ok) return false;  // the decode kernel takes it
  return tma_rows(a.q) && tma_rows(a.k_cache) && tma_rows(a.v_cache) && tma_rows(a.out);
}

void kvcache_dense_forward(const KvCacheProblem& kv, const KvCacheArgs& a, const TensorView& q, cudaStream_t s,
                           int64_t min_seqlen_q) {
  using namespace flash4::sm90;
  Problem p = kv.attention;
  p.seqlen_k = kv.capacity;
  p.total_k = p.batch * kv.capacity;
  StreamWorkspace lengths(std::max<size_t>(static_cast<size_t>(p.batch) * sizeof(int), 256), s);
  kvcache_lengths_kernel<<<static_cast<unsigned>((p.batch + 255) / 256), 256, 0, s>>>(
      kv, reinterpret_cast<int*>(lengths.data()));
  FLASH4_CUDA_CHECK_LAUNCH();
  p.seqused_k = reinterpret_cast<const int*>(lengths.data());

  ForwardArgs fa;
  fa.q = q;
  fa.k = a.k_cache;
  fa.v = a.v_cache;
  fa.out = a.out;
  fa.lse = a.lse;
  const FwdLaunchConfig launch = choose_fwd_launch(p);
  FwdParams params = make_fwd_params(fa, p, launch.tile);
  params.seq.min_seqlen_q = min_seqlen_q;
  // The caches as (slots, rows, heads_kv, d), one box per cache row run or page (cache_rows_per_load).
  const int rows = cache_rows_per_load(kv, launch.tile.block_n);
  const TensorView &k = a.k_cache, &v = a.v_cache;
  params.tma_k = make_tensor_map_bshd(k.data, k.shape[0], k.shape[1], p.heads_kv, p.head_dim, k.stride[0],
                                      k.stride[1], k.stride[2], rows);
  params.tma_v = make_tensor_map_bshd(v.data, v.shape[0], v.shape[1], p.heads_kv, p.head_dim_v, v.stride[0],
                                      v.stride[1], v.stride[2], rows);
  params.kv_cache = true;
  params.kv_rows_per_load = rows;
  params.kv = kv;
  params.clear_key_tail = true;  // a cache's rows past a sequence's length hold anything
  launch_compiled_forward(params, launch, q.dtype, static_cast<int>(p.head_dim), static_cast<int>(p.head_dim),
                          p.has_mask(), s);
}

}  // namespace flash4::detail
