// The decode kernels' side of dispatch: what the GPU runs of a KV-cache call (and why not), the launch of append,
// attention and combine for it (packed queries included), and the dense forward's decode route (flash4::forward with few query rows per KV
// head, decode_dense.h). Sizes and split counts are decided here once; the kernels take them from DecodeParams.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "api/backends.h"
#include "api/kvcache_backends.h"
#include "common/decode_rows.h"
#include "decode_configs.inc"  // generated: FLASH4_DECODE_CONFIGS(X), the compiled (dtype, head_dim) set
#include "kernels/cuda_check.h"
#include "kernels/device_guard.h"
#include "kernels/sm90/decode/decode_config.h"
#include "kernels/sm90/decode/decode_dense.h"
#include "kernels/sm90/decode/decode_launch.h"
#include "kernels/sm90/fwd/fwd_empty.h"
#include "kernels/sm90/fwd/fwd_kvcache.h"
#include "kernels/sm90/head_dims.h"
#include "kernels/sm90/zero_counters.h"
#include "kernels/sm_count.h"
#include "kernels/stream_workspace.h"

namespace flash4::detail {
namespace {

using sm90::decode::AppendParams;
using sm90::decode::CombineParams;
using sm90::decode::DecodeParams;
using sm90::decode::RowsView;

template <class T>
constexpr bool compiled_decode(int64_t head_dim) {
  bool found = false;
#define FLASH4_MATCH_DECODE(Ty, D) found = found || (std::is_same_v<T, Ty> && head_dim == D);
  FLASH4_DECODE_CONFIGS(FLASH4_MATCH_DECODE)
#undef FLASH4_MATCH_DECODE
  return found;
}

bool compiled_decode_for(DType dtype, int64_t head_dim) {
  if (dtype == DType::kBFloat16) return compiled_decode<__nv_bfloat16>(head_dim);
  if (dtype == DType::kFloat16) return compiled_decode<__half>(head_dim);
  return false;
}

// cp.async copies 16 bytes: aligned base pointers and row strides of whole 16-byte chunks.
bool aligned16(const TensorView& t) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i + 1 < t.rank; ++i)
    if ((t.stride[i] * dtype_size(t.dtype)) % 16 != 0) return false;
  return true;
}

constexpr int64_t kMaxKeys = (int64_t{1} << 31) - 1;  // key positions, rows and grid sizes stay in int32
constexpr int64_t kMaxGridYz = 65535;

// Why the decode kernels cannot run these tensors; empty when they can. `rows`: the tensors read by cp.async.
std::string decode_refusal(const TensorView& q, int64_t head_dim, std::initializer_list<const TensorView*> rows) {
  if (!cuda_device_supported(q.device.index))
    return "flash4's GPU kernels need an sm_90 (Hopper) GPU; " + device_name(q.device) + " is not one";
  if (q.dtype != DType::kBFloat16 && q.dtype != DType::kFloat16)
    return std::string("the GPU decode kernels support bf16 and fp16, not ") + dtype_name(q.dtype) +
           "; use the CPU for fp32";
  // Every multiple of 8 up to 256 runs on the next compiled width (64, 128, 256), zero-padded.
  const int width = sm90::kernel_head_dim(head_dim, head_dim);
  if (!sm90::gpu_takes_head_dim(head_dim) || width == 0)
    return "head_dim " + std::to_string(head_dim) + " is not supported by the GPU decode kernels (supported: " +
           sm90::kGpuHeadDimsText + ")";
  if (!compiled_decode_for(q.dtype, width))
    return "head_dim " + std::to_string(head_dim) + " runs on the decode kernel of width " + std::to_string(width) +
           ", which is not compiled (FLASH4_HEAD_DIMS)";
  for (const TensorView* t : rows)
    if (t->data != nullptr && !aligned16(*t))
      return "the GPU decode kernels need 16-byte aligned data pointers and strides that are multiples of 8 "
             "elements (cp.async); make the tensors contiguous";
  return {};
}

RowsView rows_view(const TensorView& t) { return {t.data, t.stride[0], t.stride[1], t.stride[2]}; }

// The split count and the launch of attention (and the combine when it splits) for a validated problem whose
// appended keys, if any, are already in the caches. q: the (possibly rotated) queries.
// max_seqlen_q: a packed batch shared with the dense forward (DecodeParams::max_seqlen_q), else 0. Its segments
// here are decode and verify steps whose counts only the device knows, mostly a few queries: they take the 16-row
// tile (tiles past a sequence's rows return at once) and the split count of one such tile per KV head, not the
// 64-row tile that the bound's rows (seqlen_q x group) would choose.
void run_attention(const KvCacheProblem& kv, const TensorView& q, const TensorView& k_cache,
                   const TensorView& v_cache, const TensorView& out, const TensorView& lse, cudaStream_t stream,
                   int64_t max_seqlen_q = 0) {
  const Problem& s = kv.attention;
  const int64_t rows = s.seqlen_q * s.group();
  // The rows the tiles are sized for.
  const int64_t tile_rows = max_seqlen_q > 0 ? std::min(rows, sm90::decode::kNarrowTileRows) : rows;
  const bool wide = sm90::decode::decode_wide_rows(tile_rows);
  const int64_t block_m = sm90::decode::decode_block_m(tile_rows);
  DecodeParams p;
  p.kv = kv;
  p.score = s.score_transform();
  p.q = rows_view(q);
  p.k_cache = rows_view(k_cache);
  p.v_cache = rows_view(v_cache);
  p.head_dim = static_cast<int>(s.head_dim);
  const int width = sm90::kernel_head_dim(s.head_dim, s.head_dim);  // the kernel's, >= head_dim (decode_refusal)
  p.out = out.data;
  p.out_stride_b = out.stride[0];
  p.out_stride_s = out.stride[1];
  p.out_stride_h = out.stride[2];
  if (lse.data != nullptr) {
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride_b = lse.stride[0];
    p.lse_stride_h = lse.stride[1];
  }
  p.group = static_cast<int>(s.group());
  p.rows = static_cast<int>(rows);
  p.cu_seqlens_q = s.cu_seqlens_q;  // a packed batch (the forward's route): q, out, lse views of one batch entry
  p.total_q = s.total_q;
  p.max_seqlen_q = max_seqlen_q;
  p.row_tiles = static_cast<int>((rows + block_m - 1) / block_m);
  p.splits = sm90::decode::decode_num_splits(kv.num_splits, current_device_sm_count(), s.batch, s.heads_kv,
                                             tile_rows, s.head_dim, kv.capacity);

  const auto launch = [&](const DecodeParams& params) {
#define FLASH4_LAUNCH_DECODE(T, D)                                                                \
  if (std::is_same_v<T, __nv_bfloat16> == (q.dtype == DType::kBFloat16) && width == D)       \
    return sm90::decode::launch_decode<T, D>(params, wide, stream);
    FLASH4_DECODE_CONFIGS(FLASH4_LAUNCH_DECODE)
#undef FLASH4_LAUNCH_DECODE
    throw Error(Status::kNotSupported, "flash4: no compiled GPU decode kernel for this configuration");
  };
  if (p.splits == 1) return launch(p);

  // Partials: o (splits, batch, heads, seqlen_q, width) and lse (splits, batch, heads, seqlen_q), fp32. The 16-row
  // tile's last CTA merges them (no combine kernel) with arrival counters from the pool (zero_counters.h), or
  // from the workspace, zeroed on the stream, where the pool has none to give.
  const size_t part_rows = static_cast<size_t>(p.splits) * s.batch * s.heads * s.seqlen_q;
  const size_t o_bytes = (part_rows * width * 4 + 255) & ~size_t{255};
  const size_t lse_bytes = (part_rows * 4 + 255) & ~size_t{255};
  const size_t counter_count = wide ? 0 : static_cast<size_t>(s.batch * s.heads_kv * p.row_tiles);
  StreamWorkspace workspace(o_bytes + lse_bytes + counter_count * sizeof(int), stream);
  p.o_partial = reinterpret_cast<float*>(workspace.data());
  p.lse_partial = reinterpret_cast<float*>(workspace.data() + o_bytes);
  if (!wide) {
    p.split_counters = sm90::pooled_zero_counters(counter_count, stream);
    if (p.split_counters == nullptr) {
      p.split_counters = reinterpret_cast<int*>(workspace.data() + o_bytes + lse_bytes);
      FLASH4_CUDA_CHECK(cudaMemsetAsync(p.split_counters, 0, counter_count * sizeof(int), stream));
    }
    return launch(p);
  }
  launch(p);
  CombineParams c;
  c.o_partial = p.o_partial;
  c.lse_partial = p.lse_partial;
  c.splits = p.splits;
  c.batch = static_cast<int>(s.batch);
  c.heads = static_cast<int>(s.heads);
  c.seqlen_q = static_cast<int>(s.seqlen_q);
  c.sink = s.learnable_sink;
  c.out = out.data;
  c.out_stride_b = p.out_stride_b;
  c.out_stride_s = p.out_stride_s;
  c.out_stride_h = p.out_stride_h;
  c.out_cols = p.head_dim;
  c.lse = p.lse;
  c.lse_stride_b = p.lse_stride_b;
  c.lse_stride_h = p.lse_stride_h;
  c.cu_seqlens_q = p.cu_seqlens_q;
  c.total_q = p.total_q;
  c.max_seqlen_q = p.max_seqlen_q;
  sm90::decode::launch_combine(c, q.dtype, width, stream);
}

// A packed (total, heads, head_dim) tensor as (sequences, rows_per_sequence, heads, head_dim) with batch stride
// `sequence_stride` rows: total / sequences for equal segments, 0 where each sequence finds its rows itself (the
// queries: DecodeParams::cu_seqlens_q).
TensorView packed_view(const TensorView& t, int64_t sequences, int64_t rows, int64_t sequence_stride) {
  TensorView v = t;
  v.rank = 4;
  v.shape[0] = sequences;
  v.shape[1] = rows;
  v.shape[2] = t.shape[1];
  v.shape[3] = t.shape[2];
  v.stride[0] = sequence_stride * t.stride[0];
  v.stride[1] = t.stride[0];
  v.stride[2] = t.stride[1];
  v.stride[3] = t.stride[2];
  return v;
}

// The (heads, total_q) LSE of a packed call as one batch entry of (1, heads, total_q).
TensorView packed_lse_view(const TensorView& lse) {
  TensorView v = lse;
  if (lse.data != nullptr) {
    v.rank = 3;
    v.shape[0] = 1;
    v.shape[1] = lse.shape[0];
    v.shape[2] = lse.shape[1];
    v.stride[0] = 0;
    v.stride[1] = lse.stride[0];
    v.stride[2] = lse.stride[1];
  }
  return v;
}

// Rows of a packed q in no segment (after cu_seqlens_q[batch], or of a segment longer than max_seqlen_q): out 0,
// LSE -inf, as the packed forward leaves them.
void clear_uncovered_query_rows(const TensorView& out, const TensorView& lse, const Problem& p, cudaStream_t s) {
  ForwardArgs rows;
  rows.out = out;
  rows.lse = lse;
  sm90::launch_forward_uncovered_rows(rows, p, s);
}

// A call with packed queries (cu_seqlens_q): q, out and lse as one batch entry in which sequence b's queries start
// at cu_seqlens_q[b]. Segments of up to decode_max_queries(group) queries (decode and verify steps) run on the
// decode kernel. Where longer ones may occur (max_seqlen_q above that: prefill chunks beside decode steps) and the
// dense forward can read the cache, they run on the dense kernel, in a second launch over the same offsets: each
// kernel reads the counts on the device and leaves the other's sequences alone, so the call needs no host
// synchronisation whatever the offsets hold. Otherwise (cache_leftpad, pages smaller than a K/V tile, a few long
// caches: decode_rows_on_few_ctas) every segment runs on the decode kernel.
// Rows in no segment are cleared by the decode kernel itself (decode_uncovered_rows.cuh); with no sequence at all
// there is no kernel (a grid of no CTAs is no launch), nor without a decode launch: then the clearing kernel does it.
void packed_queries_forward(const KvCacheArgs& a, const KvCacheProblem& p, cudaStream_t s) {
  const Problem& pr = p.attention;
  if (pr.batch == 0) return clear_uncovered_query_rows(a.out, a.lse, pr, s);
  // The dense route's question for max_seqlen_q: a segment may exceed the decode kernel's rows
  // (max_seqlen_q > decode_max_queries), and the dense kernel can take it.
  if (!kvcache_dense_route(a, p)) {
    return run_attention(p, packed_view(a.q, pr.batch, pr.seqlen_q, 0), a.k_cache, a.v_cache,
                         packed_view(a.out, pr.batch, pr.seqlen_q, 0), packed_lse_view(a.lse), s);
  }
  const int64_t decode_queries = decode_max_queries(pr.group());
  if (decode_queries > 0) {
    KvCacheProblem short_segments = p;
    short_segments.attention.seqlen_q = decode_queries;
    run_attention(short_segments, packed_view(a.q, pr.batch, decode_queries, 0), a.k_cache, a.v_cache,
                  packed_view(a.out, pr.batch, decode_queries, 0), packed_lse_view(a.lse), s, pr.seqlen_q);
  } else {
    clear_uncovered_query_rows(a.out, a.lse, pr, s);
  }
  kvcache_dense_forward(p, a, a.q, s, decode_queries + 1);
}

}  // namespace

Support cuda_can_forward_kvcache(const KvCacheArgs& a, const KvCacheProblem& p) {
  const Problem& s = p.attention;
  if (const std::string why = decode_refusal(a.q, s.head_dim, {&a.q, &a.k_cache, &a.v_cache, &a.out});
      !why.empty())
    return {false, why};
  if (p.capacity > kMaxKeys || s.batch > kMaxGridYz || s.heads_kv > kMaxGridYz ||
      s.batch * s.seqlen_q * s.heads > kMaxKeys)
    return {false, "the GPU decode kernels support caches of < 2^31 keys per sequence, batch and heads_kv <= "
                   "65535 and batch * seqlen_q * heads < 2^31"};
  if (a.lse.data != nullptr && a.lse.stride[a.lse.rank - 1] != 1)
    return {false, "the GPU decode kernels write lse with unit stride along the queries; pass a contiguous lse"};
  return {};
}

void cuda_forward_kvcache(const KvCacheArgs& a, const KvCacheProblem& p, Stream stream) {
  DeviceGuard guard(a.q.device.index);
  const auto s = static_cast<cudaStream_t>(stream);
  const Problem& pr = p.attention;
  const bool rotary = p.rotary_dim > 0;
  const size_t q_bytes = static_cast<size_t>(pr.batch * pr.seqlen_q * pr.heads * pr.head_dim) * 2;
  std::optional<StreamWorkspace> q_rotated;  // the rotated queries, contiguous (batch, seqlen_q, heads, d)
  if (rotary) q_rotated.emplace(std::max<size_t>(q_bytes, 256), s);
  TensorView q = a.q;
  if (p.seqlen_new > 0 || rotary) {
    AppendParams ap;
    ap.kv = p;
    ap.head_dim = static_cast<int>(pr.head_dim);
    if (p.seqlen_new > 0) {
      ap.k_new = rows_view(a.k);
      ap.v_new = rows_view(a.v);
      ap.k_cache = a.k_cache.data;
      ap.v_cache = a.v_cache.data;
      ap.k_cache_strides = rows_view(a.k_cache);
      ap.v_cache_strides = rows_view(a.v_cache);
      ap.append_rows = pr.batch * p.seqlen_new * pr.heads_kv;
    }
    if (rotary) {
      ap.q = rows_view(a.q);
      ap.q_rotated = q_rotated->data();
      ap.q_rows = pr.batch * pr.seqlen_q * pr.heads;
      ap.cos = a.rotary_cos.data;
      ap.sin = a.rotary_sin.data;
      ap.cos_stride = a.rotary_cos.stride[0];
      ap.sin_stride = a.rotary_sin.stride[0];
      q = make_view(q_rotated->data(), a.q.dtype, a.q.device, pr.batch, pr.seqlen_q, pr.heads, pr.head_dim);
    }
    sm90::decode::launch_append(ap, a.q.dtype, s);
  }
  if (a.out.numel() == 0) return;
  if (pr.varlen()) return packed_queries_forward(a, p, s);
  if (kvcache_dense_route(a, p)) return kvcache_dense_forward(p, a, q, s);  // many rows per KV head
  run_attention(p, q, a.k_cache, a.v_cache, a.out, a.lse, s);
}

namespace {

// Whether the decode kernel can run this forward problem's queries at all (the routes below add the row rules).
// A packed batch's sequences may hold different numbers of queries (max_seqlen_q at most) and keys (cu_seqlens_k,
// seqused_k).
bool decode_kernel_runs(const ForwardArgs& a, const Problem& p) {
  if (p.seqused_q != nullptr || p.split_head_dims() || p.seqlen_q == 0) return false;
  if (a.lse.data != nullptr && a.lse.stride[a.lse.rank - 1] != 1) return false;  // the kernel's LSE rows are dense
  if (p.seqlen_k == 0) return false;
  if (p.seqlen_k > kMaxKeys || p.batch > kMaxGridYz || p.heads_kv > kMaxGridYz) return false;
  return decode_refusal(a.q, p.head_dim, {&a.q, &a.k, &a.v, &a.out}).empty();
}

}  // namespace

bool dense_decode_route(const ForwardArgs& a, const Problem& p) {
  // Few query rows per KV head (seqlen_q <= 16: the dense kernel's 128-row tile would be at most 1/8 used and
  // would read K / V once per query head), every sequence with all its queries.
  if (!decode_rows(p.seqlen_q, p.group()) &&
      !decode_rows_on_few_ctas(p.seqlen_q, p.group(), p.batch, p.heads, p.seqlen_k, current_device_sm_count()))
    return false;
  return decode_kernel_runs(a, p);
}

int64_t packed_decode_share(const ForwardArgs& a, const Problem& p) {
  const int64_t queries = decode_max_queries(p.group());
  if (!p.varlen() || queries == 0 || p.seqlen_q <= queries) return 0;
  return decode_kernel_runs(a, p) ? queries : 0;
}

void dense_decode_forward(const ForwardArgs& a, const Problem& p, cudaStream_t stream, int64_t decode_queries) {
  // The batch as a contiguous cache of the keys, nothing appended: dense, every sequence's seqlen_k keys (or
  // seqused_k of them); packed, one slot of total_k rows in which sequence b starts at cu_seqlens_k[b].
  KvCacheProblem kv;
  kv.attention = p;
  if (decode_queries > 0) kv.attention.seqlen_q = decode_queries;  // the short segments only (packed_decode_share)
  kv.capacity = p.seqlen_k;
  kv.cache_seqlen = p.seqlen_k;
  kv.cache_seqlens = p.seqused_k;
  if (!p.varlen()) {
    kv.num_slots = p.batch;
    kv.page_size = p.seqlen_k;
    return run_attention(kv, a.q, a.k, a.v, a.out, a.lse, stream);
  }
  kv.num_slots = 1;
  kv.page_size = p.total_k;
  kv.cu_seqlens_k = p.cu_seqlens_k;
  kv.total_k = p.total_k;
  // q, out and lse (heads, total_q) as one batch entry, in which sequence b's queries start at cu_seqlens_q[b].
  const int64_t rows = kv.attention.seqlen_q;
  run_attention(kv, packed_view(a.q, p.batch, rows, 0), packed_view(a.k, 1, p.total_k, p.total_k),
                packed_view(a.v, 1, p.total_k, p.total_k), packed_view(a.out, p.batch, rows, 0),
                packed_lse_view(a.lse), stream, decode_queries > 0 ? p.seqlen_q : 0);
  // Rows in no segment get out 0 and LSE -inf, as from the packed forward kernel: the decode kernel clears them
  // (decode_uncovered_rows.cuh; the forward runs no kernel for a batch of no sequence).
}

}  // namespace flash4::detail
