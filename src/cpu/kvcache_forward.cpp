// CPU KV-cache attention (flash4/kvcache.h): append the new keys and values to the cache (rotated when asked),
// then split-KV attention: one task per (sequence, KV head, 64-row tile of the group's query rows, split)
// streams its part of the sequence's keys through an online softmax into a partial output and LSE (fp32), and a
// combine step merges the splits by their LSE (common/lse_combine.h), as the GPU's split and combine kernels do.
// Keys are found through the sequence's PagedKeys (common/paged_keys.h), so contiguous and paged caches share
// every loop. Packed queries (cu_seqlens_q) run one sequence at a time through the same code.
#include <algorithm>
#include <limits>
#include <thread>
#include <vector>

#include "api/kvcache_backends.h"
#include "common/lse_combine.h"
#include "common/parallel_for.h"
#include "common/rotary.h"
#include "common/split_kv.h"
#include "cpu/exp2_row.h"
#include "cpu/multiversion.h"
#include "cpu/online_softmax.h"
#include "cpu/score_transform.h"
#include "cpu/tile_config.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"

namespace flash4::detail {
namespace {

using namespace flash4::cpu;

// x rounded to `dtype` (what storing it to a tensor of that dtype keeps).
float round_to(float x, DType dtype) {
  return dtype == DType::kFloat16 ? round_to_half(x) : dtype == DType::kBFloat16 ? round_to_bf16(x) : x;
}

// Row `pos` of a (seqlen_ro, rotary_dim / 2) table as fp32.
void load_table_row(const TensorView& t, int64_t pos, float* dst) {
  const int64_t n = t.shape[1];
  if (t.dtype == DType::kFloat32) {
    const float* src = static_cast<const float*>(t.data) + pos * t.stride[0];
    std::copy(src, src + n, dst);
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(t.data) + pos * t.stride[0];
    for (int64_t i = 0; i < n; ++i) dst[i] = load_element(src + i, t.dtype);
  }
}

// Rotates the row x (fp32, head_dim features) at `pos` and rounds the result to the tensors' dtype.
struct Rotary {
  const KvCacheArgs& a;
  const KvCacheProblem& p;
  std::vector<float> cos, sin;
  Rotary(const KvCacheArgs& args, const KvCacheProblem& problem)
      : a(args), p(problem), cos(problem.rotary_dim / 2), sin(problem.rotary_dim / 2) {}
  void operator()(float* x, int64_t pos) {
    if (p.rotary_dim == 0) return;
    load_table_row(a.rotary_cos, p.rotary_row(pos), cos.data());
    load_table_row(a.rotary_sin, p.rotary_row(pos), sin.data());
    apply_rotary(x, cos.data(), sin.data(), p.rotary_dim, p.rotary_interleaved);
    for (int64_t i = 0; i < p.rotary_dim; ++i) x[i] = round_to(x[i], a.q.dtype);
  }
};

// Writes k, v (rotated) at positions cache_length(b) .. + seqlen_new - 1 of every sequence. Tasks are KV heads:
// sequences whose cache_batch_idx repeat write the same rows from one task, in sequence order.
void append_new_keys(const KvCacheArgs& a, const KvCacheProblem& p) {
  const Problem& s = p.attention;
  if (p.seqlen_new == 0) return;
  parallel_for(s.heads_kv, [&](int64_t hk) {
    std::vector<float> row(s.head_dim);
    Rotary rotate(a, p);
    for (int64_t b = 0; b < s.batch; ++b) {
      const PagedKeys keys = p.keys(b);
      const int64_t first = p.cache_length(b);
      for (int64_t t = 0; t < p.seqlen_new; ++t) {
        const CacheRow dst = keys.at(first + t);
        load_rows(a.k, b, t, 1, hk, row.data());
        rotate(row.data(), p.rotary_position(b, first + t));
        store_rows(row.data(), a.k_cache, dst.slot, dst.row, 1, hk);
        load_rows(a.v, b, t, 1, hk, row.data());
        store_rows(row.data(), a.v_cache, dst.slot, dst.row, 1, hk);
      }
    }
  });
}

constexpr int64_t kDotScoreRows = 16;

struct SplitTiles {
  std::vector<float> q, kt, v, s, o;  // (M, d), (d, N), (N, d), (M, N), (M, d)
  explicit SplitTiles(int64_t d)
      : q(kBlockM * d), kt(d * kBlockN), v(kBlockN * d), s(kBlockM * kBlockN), o(kBlockM * d) {}
};

// Partial results of every split: o (splits, batch, heads, seqlen_q, head_dim) normalized by its own softmax
// denominator, lse (splits, batch, heads, seqlen_q), natural log, -inf for a split that saw no key of the row.
struct Partials {
  int64_t rows_per_split = 0, head_dim = 0;  // batch * heads * seqlen_q
  std::vector<float> o, lse;
  float* o_row(int64_t split, int64_t row) { return o.data() + (split * rows_per_split + row) * head_dim; }
  float& lse_of(int64_t split, int64_t row) { return lse[split * rows_per_split + row]; }
};

// Keys rows [j0, j0 + n) of sequence b, KV head hk: K transposed into kt (d x kBlockN), V into v (n x d).
// Keys [j0, j0 + n) of KV head hk into t. Keys of one page (all of them in a contiguous cache) are consecutive
// rows of one slot: one lookup per run. K goes to t.kt transposed (d x kBlockN) for matmul_set, or as its rows
// (n x d) for matmul_set_dot. Then the next block's rows, up to key `prefetch_end`, are asked of the memory
// system, to arrive while this block computes: a task reads one KV head of the cache, a row every heads_kv rows,
// which the hardware prefetchers do not run ahead of.
FLASH4_CPU_MULTIVERSION void load_keys(const KvCacheArgs& a, const PagedKeys& keys, int64_t j0, int64_t n,
                                       int64_t hk, bool k_rows, int64_t prefetch_end, SplitTiles& t) {
  const int64_t d = a.q.shape[3];
  for (int64_t r = 0; r < n;) {
    int64_t run = 1;
    while (r + run < n && keys.same_page(j0 + r, j0 + r + run)) ++run;
    const CacheRow src = keys.at(j0 + r);
    if (k_rows) {
      load_rows(a.k_cache, src.slot, src.row, run, hk, t.kt.data() + r * d);
    } else {
      load_rows_transposed(a.k_cache, src.slot, src.row, run, hk, t.kt.data() + r, kBlockN);
    }
    load_rows(a.v_cache, src.slot, src.row, run, hk, t.v.data() + r * d);
    r += run;
  }
  for (int64_t j = j0 + n; j < std::min(j0 + 2 * n, prefetch_end); ++j) {
    const CacheRow src = keys.at(j);
    for (const TensorView* cache : {&a.k_cache, &a.v_cache}) {
      const int64_t element = cache->dtype == DType::kFloat32 ? 4 : cache->dtype == DType::kFloat8E4M3 ? 1 : 2;
      const char* row = static_cast<const char*>(cache->data) +
                        element * (src.slot * cache->stride[0] + src.row * cache->stride[1] + hk * cache->stride[2]);
      for (int64_t byte = 0; byte < d * element; byte += 64) __builtin_prefetch(row + byte);
    }
  }
}

// The query rows of one KV head, packed: the `group` query heads that share KV head hk take turns row by row,
// row r being query i = r / group of head hk * group + r % group. A tile of these rows reads each key and value
// once for every head of the group (the GPU's decode kernel packs its rows the same way).
struct GroupRows {
  int64_t hk, group;
  int64_t query(int64_t r) const { return r / group; }
  int64_t head(int64_t r) const { return hk * group + r % group; }
};

// Split `split` of packed rows [r0, r0 + kBlockM) of sequence b, KV head hk (GroupRows).
FLASH4_CPU_MULTIVERSION void attend_split(const KvCacheArgs& a, const KvCacheProblem& p, int64_t b, int64_t hk,
                                          int64_t r0, int64_t split, int64_t splits, Partials& out, SplitTiles& t) {
  const Problem& s = p.attention;
  const int64_t d = s.head_dim;
  const GroupRows packed{hk, s.group()};
  const int64_t rows = std::min<int64_t>(kBlockM, s.seqlen_q * packed.group - r0);
  const SequenceMask mask = p.sequence_mask(b);
  const IndexRange visible = mask.keys_of_any_row(packed.query(r0), packed.query(r0 + rows - 1));
  int64_t lo = 0, hi = -1;
  split_keys(visible.lo, visible.hi, kBlockN, splits, split, lo, hi);

  // Few rows (decode) take their scores as dot products with K's rows: transposing K would cost more.
  const bool dot_scores = rows <= kDotScoreRows;
  OnlineSoftmaxRow state[kBlockM];
  std::fill(t.o.begin(), t.o.end(), 0.0f);
  if (lo <= hi) {
    const ScoreTransform transform = s.score_transform();
    const PagedKeys keys = p.keys(b);
    Rotary rotate(a, p);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = packed.query(r0 + r);
      load_rows(a.q, b, i, 1, packed.head(r0 + r), t.q.data() + r * d);
      const int64_t position = p.cache_length(b) + (p.rotary_q_per_row() ? i : 0);
      rotate(t.q.data() + r * d, p.rotary_position(b, position));
    }
    for (int64_t k0 = lo; k0 <= hi; k0 += kBlockN) {
      const int64_t n = std::min<int64_t>(kBlockN, hi + 1 - k0);
      load_keys(a, keys, k0, n, hk, dot_scores, hi + 1, t);
      if (dot_scores) {
        matmul_set_dot(t.q.data(), t.kt.data(), t.s.data(), rows, n, d, kBlockN);  // S = Q K^T, n columns
      } else {
        matmul_set(t.q.data(), t.kt.data(), t.s.data(), rows, kBlockN, d);  // S = Q K^T (columns >= n unused)
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* row = t.s.data() + r * kBlockN;
        const TileSpan span = tile_span(mask, packed.query(r0 + r), k0, n);
        std::fill(row + n, row + kBlockN, 0.0f);
        if (span.empty()) {
          std::fill(row, row + n, 0.0f);
          continue;
        }
        apply_score_transform(transform, row + span.begin, span.end - span.begin);
        const float m_tile = *std::max_element(row + span.begin, row + span.end);
        const float factor = state[r].update(m_tile, /*conditional=*/true);  // FA4's conditional rescaling
        if (factor != 1.0f)
          for (int64_t x = 0; x < d; ++x) t.o[r * d + x] *= factor;
        std::fill(row, row + span.begin, 0.0f);
        std::fill(row + span.end, row + n, 0.0f);
        exp2_row(row + span.begin, state[r].m_ref, row + span.begin, span.end - span.begin, false);
        float sum = 0.0f;
        for (int64_t j = span.begin; j < span.end; ++j) sum += row[j];
        state[r].l += sum;
      }
      matmul_add(t.s.data(), t.v.data(), t.o.data(), rows, d, kBlockN);  // O += P V
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = state[r].l > 0.0f ? 1.0f / state[r].l : 0.0f;
    const int64_t row = (b * s.heads + packed.head(r0 + r)) * s.seqlen_q + packed.query(r0 + r);
    float* o = out.o_row(split, row);
    for (int64_t x = 0; x < d; ++x) o[x] = t.o[r * d + x] * scale;
    out.lse_of(split, row) = state[r].lse();
  }
}

// Merges the splits of query i of sequence b, head h into out and lse (with the sink); o: head_dim floats.
void combine_row(const KvCacheArgs& a, const KvCacheProblem& p, int64_t b, int64_t h, int64_t i, int64_t splits,
                 Partials& parts, std::vector<float>& o) {
  const Problem& s = p.attention;
  const bool has_sink = s.learnable_sink != nullptr;
  const float sink = has_sink ? s.learnable_sink[h] : 0.0f;
  const int64_t row = (b * s.heads + h) * s.seqlen_q + i;
  const float lse = combined_lse(&parts.lse_of(0, row), splits, parts.rows_per_split, has_sink, sink);
  std::fill(o.begin(), o.end(), 0.0f);
  for (int64_t split = 0; split < splits; ++split) {
    const float w = combine_weight(parts.lse_of(split, row), lse);
    if (w == 0.0f) continue;
    const float* part = parts.o_row(split, row);
    for (int64_t x = 0; x < s.head_dim; ++x) o[x] += w * part[x];
  }
  store_rows(o.data(), a.out, b, i, 1, h);
  if (a.lse.data != nullptr) *lse_ptr(a.lse, b, h, i) = lse;
}

// Rows [first, first + count) of a packed (total_q, heads, head_dim) tensor as a (1, count, heads, head_dim) one.
TensorView query_rows(const TensorView& t, int64_t first, int64_t count) {
  TensorView v = t;
  v.rank = 4;
  v.shape[0] = 1, v.shape[1] = count, v.shape[2] = t.shape[1], v.shape[3] = t.shape[2];
  v.stride[0] = 0, v.stride[1] = t.stride[0], v.stride[2] = t.stride[1], v.stride[3] = t.stride[2];
  // An empty tensor (heads or head_dim 0) may have no data: no offset from a null pointer.
  if (t.data != nullptr) v.data = static_cast<char*>(t.data) + first * t.stride[0] * dtype_size(t.dtype);
  return v;
}

// Columns [first, first + count) of a packed (heads, total_q) LSE as a (1, heads, count) one.
TensorView lse_columns(const TensorView& lse, int64_t first, int64_t count) {
  TensorView v = lse;
  if (lse.data == nullptr) return v;
  v.rank = 3;
  v.shape[0] = 1, v.shape[1] = lse.shape[0], v.shape[2] = count;
  v.stride[0] = 0, v.stride[1] = lse.stride[0], v.stride[2] = lse.stride[1];
  v.data = static_cast<float*>(lse.data) + first * lse.stride[1];
  return v;
}

// Packed queries (cu_seqlens_q; on the CPU the offsets were checked by validation): each sequence runs as a call
// of its own over views of its query rows, with its entry of each index tensor and its row of the block table,
// so its mask is aligned to its own query count. Rows after the last segment get out 0 and lse -inf.
void packed_queries_forward(const KvCacheArgs& a, const KvCacheProblem& p) {
  const Problem& s = p.attention;
  const int* cu = s.cu_seqlens_q;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t first = cu[b], count = int64_t{cu[b + 1]} - cu[b];
    if (count == 0) continue;
    KvCacheArgs one = a;
    one.cu_seqlens_q = TensorView{};
    one.max_seqlen_q = 0;
    one.q = query_rows(a.q, first, count);
    one.out = query_rows(a.out, first, count);
    one.lse = lse_columns(a.lse, first, count);
    KvCacheProblem sequence = p;
    sequence.attention.batch = 1;
    sequence.attention.seqlen_q = count;
    sequence.attention.total_q = count;
    sequence.attention.cu_seqlens_q = nullptr;
    if (p.cache_seqlens != nullptr) sequence.cache_seqlens = p.cache_seqlens + b;
    if (p.cache_batch_idx != nullptr) sequence.cache_batch_idx = p.cache_batch_idx + b;
    if (p.cache_leftpad != nullptr) sequence.cache_leftpad = p.cache_leftpad + b;
    if (p.paged) sequence.block_table = p.block_table + b * p.block_table_stride;
    if (!p.paged && p.cache_batch_idx == nullptr) {  // sequence b's cache row b, as row 0 of a one-row cache
      for (TensorView* cache : {&one.k_cache, &one.v_cache}) {
        if (cache->data != nullptr)  // an empty cache may have no data: no offset from a null pointer
          cache->data = static_cast<char*>(cache->data) + b * cache->stride[0] * dtype_size(cache->dtype);
        cache->shape[0] = 1;
      }
      sequence.num_slots = 1;
    }
    cpu_forward_kvcache(one, sequence);
  }
  const int64_t tail = s.total_q - cu[s.batch];
  if (tail <= 0) return;
  const TensorView out = query_rows(a.out, cu[s.batch], tail), lse = lse_columns(a.lse, cu[s.batch], tail);
  const std::vector<float> zeros(static_cast<size_t>(s.head_dim), 0.0f);
  for (int64_t i = 0; i < tail; ++i)
    for (int64_t h = 0; h < s.heads; ++h) {
      store_rows(zeros.data(), out, 0, i, 1, h);
      if (lse.data != nullptr) *lse_ptr(lse, 0, h, i) = -std::numeric_limits<float>::infinity();
    }
}

}  // namespace

void cpu_forward_kvcache(const KvCacheArgs& a, const KvCacheProblem& p) {
  const Problem& s = p.attention;
  if (a.cu_seqlens_q.data != nullptr) return packed_queries_forward(a, p);
  if (a.out.numel() == 0) return append_new_keys(a, p);
  const int64_t q_tiles = (s.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t packed_tiles = (s.seqlen_q * s.group() + kBlockM - 1) / kBlockM;  // per (sequence, KV head)
  int64_t max_keys = 0;  // of the longest sequence, appended keys included (known before the append)
  for (int64_t b = 0; b < s.batch; ++b) max_keys = std::max(max_keys, p.seqlen_k(b));
  const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  // More splits than the longest sequence has key blocks would only be empty (split_keys deals out whole
  // blocks): a larger num_splits runs as that many, with the same result.
  const int64_t key_blocks = std::max<int64_t>(1, (max_keys + kBlockN - 1) / kBlockN);
  const int64_t wanted =
      p.num_splits > 0 ? p.num_splits : choose_num_splits(threads, s.batch * s.heads_kv * packed_tiles, max_keys);
  const int64_t splits = std::min(key_blocks, wanted);

  // The partial results are allocated before the append writes the caches, so that running out of memory
  // leaves them as they were.
  Partials parts;
  parts.rows_per_split = s.batch * s.heads * s.seqlen_q;
  parts.head_dim = s.head_dim;
  parts.o.resize(static_cast<size_t>(splits * parts.rows_per_split * s.head_dim));
  parts.lse.resize(static_cast<size_t>(splits * parts.rows_per_split));
  append_new_keys(a, p);
  // Without splits a task's rows are complete when it ends: it merges them itself (the same arithmetic), which
  // saves small calls a second round of tasks.
  parallel_for(s.batch * s.heads_kv * packed_tiles * splits, [&](int64_t task) {
    SplitTiles t(s.head_dim);
    const int64_t split = task % splits, tile = task / splits;
    const int64_t pt = tile % packed_tiles, bhk = tile / packed_tiles;
    const int64_t b = bhk / s.heads_kv, hk = bhk % s.heads_kv, r0 = pt * kBlockM;
    attend_split(a, p, b, hk, r0, split, splits, parts, t);
    if (splits > 1) return;
    const GroupRows packed{hk, s.group()};
    std::vector<float> o(static_cast<size_t>(s.head_dim));
    for (int64_t r = r0; r < std::min(r0 + kBlockM, s.seqlen_q * packed.group); ++r)
      combine_row(a, p, b, packed.head(r), packed.query(r), splits, parts, o);
  });
  if (splits == 1) return;
  parallel_for(s.batch * s.heads * q_tiles, [&](int64_t task) {  // (sequence, head, 64 queries)
    std::vector<float> o(static_cast<size_t>(s.head_dim));
    const int64_t q0 = task % q_tiles * kBlockM, bh = task / q_tiles;
    for (int64_t i = q0; i < std::min(q0 + kBlockM, s.seqlen_q); ++i)
      combine_row(a, p, bh / s.heads, bh % s.heads, i, splits, parts, o);
  });
}

}  // namespace flash4::detail
