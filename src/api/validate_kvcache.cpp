// Validation of KV-cache attention arguments (flash4/kvcache.h): shapes, dtypes, devices and aliasing of every
// tensor, and where the index tensors are host-resident, every value a sequence will use. Nothing is read or
// written before all of it passed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "api/checker.h"
#include "api/kvcache_backends.h"
#include "api/validate_sequences.h"
#include "common/split_kv.h"

namespace flash4::detail {
namespace {

using std::to_string;

constexpr int64_t kMaxHeadDim = 256;  // the CPU path's rule for every entry point (src/api/validate.cpp)
constexpr int64_t kHeadDimMultiple = 8;

constexpr const char* kQDims[4] = {"batch", "seqlen_q", "heads", "head_dim"};
constexpr const char* kPackedQDims[3] = {"total_q", "heads", "head_dim"};
constexpr const char* kPackedLseDims[2] = {"heads", "total_q"};
constexpr const char* kOffsetDims[1] = {"batch + 1"};
constexpr const char* kCacheDims[4] = {"batch_cache", "seqlen_cache", "heads_kv", "head_dim"};
constexpr const char* kPagedCacheDims[4] = {"num_pages", "page_size", "heads_kv", "head_dim"};
constexpr const char* kNewDims[4] = {"batch", "seqlen_new", "heads_kv", "head_dim"};
constexpr const char* kRotaryDims[2] = {"seqlen_ro", "rotary_dim / 2"};
constexpr const char* kTableDims[2] = {"batch", "max_pages"};
constexpr const char* kLseDims[3] = {"batch", "heads", "seqlen_q"};
constexpr const char* kVectorDims[1] = {"n"};

bool host(const TensorView& t) { return t.device.kind == DeviceKind::kCpu; }

// q's dimension `what` ("heads" or "head_dim", dims 2 and 3 of a (batch, seqlen_q, ...) q) as messages name it.
std::string q_dim(const KvCacheArgs& a, const char* what) {
  const int dense = std::string(what) == "heads" ? 2 : 3;
  return "q.shape[" + to_string(present(a.cu_seqlens_q) ? dense - 1 : dense) + "] (" + what + ")";
}

// Where the batch size comes from, for messages: q's first dimension, or the packed queries' offsets.
std::string batch_source(const KvCacheArgs& a) {
  return present(a.cu_seqlens_q) ? "cu_seqlens_q.shape[0] - 1" : "q.shape[0]";
}

void check_like(const Checker& c, const TensorView& t, const char* name, const TensorView& like,
                const char* like_name) {
  FLASH4_REQUIRE(c, t.dtype == like.dtype,
                 std::string(name) + ".dtype is " + dtype_name(t.dtype) + " but " + like_name + ".dtype is " +
                     dtype_name(like.dtype) + "; they must match");
  check_same_device(c, t, name, like, like_name);
}

void check_dim(const Checker& c, const TensorView& t, const char* name, int i, const char* const* dims,
               int64_t expected, const std::string& why) {
  FLASH4_REQUIRE(c, t.shape[i] == expected,
                 dim_label(name, i, dims) + " = " + to_string(t.shape[i]) + " but expected " + to_string(expected) +
                     " (" + why + ")");
}

// An optional int32 (n) index vector on q's device, one entry per sequence.
void check_index_vector(const Checker& c, const TensorView& t, const char* name, int64_t n, const KvCacheArgs& a) {
  check_tensor(c, t, name, 1, kVectorDims);
  FLASH4_REQUIRE(c, t.dtype == DType::kInt32,
                 std::string(name) + ".dtype is " + dtype_name(t.dtype) + " but must be int32");
  check_same_device(c, t, name, a.q, "q");
  check_dim(c, t, name, 0, kVectorDims, n, "one entry per sequence: " + batch_source(a));
}

// Packed queries (cu_seqlens_q): q (total_q, heads, head_dim), the offsets and max_seqlen_q; fills batch, seqlen_q
// (the most queries a sequence has), heads, head_dim and the offsets of p.attention. Host offsets are checked.
void check_packed_queries(const Checker& c, const KvCacheArgs& a, Problem& s) {
  check_tensor(c, a.q, "q", 3, kPackedQDims);
  check_tensor(c, a.cu_seqlens_q, "cu_seqlens_q", 1, kOffsetDims);
  FLASH4_REQUIRE(c, a.cu_seqlens_q.dtype == DType::kInt32,
                 std::string("cu_seqlens_q.dtype is ") + dtype_name(a.cu_seqlens_q.dtype) + " but must be int32");
  check_same_device(c, a.cu_seqlens_q, "cu_seqlens_q", a.q, "q");
  FLASH4_REQUIRE(c, a.cu_seqlens_q.shape[0] >= 1,
                 "cu_seqlens_q.shape[0] (batch + 1) = 0 but must be >= 1 (cu_seqlens_q[0] = 0 is always present)");
  FLASH4_REQUIRE(c, !present(a.k) && !present(a.v),
                 "k and v (an append) are set with cu_seqlens_q; packed queries attend to the cache as it is: "
                 "append the new keys in a call of their own first");
  s.batch = a.cu_seqlens_q.shape[0] - 1;
  s.total_q = a.q.shape[0];
  s.heads = a.q.shape[1];
  s.head_dim = a.q.shape[2];
  FLASH4_REQUIRE(c, s.total_q <= std::numeric_limits<int32_t>::max(),
                 "q.shape[0] (total_q) = " + to_string(s.total_q) + " exceeds the int32 offsets' range");
  FLASH4_REQUIRE(c, a.max_seqlen_q >= 0 && a.max_seqlen_q <= std::numeric_limits<int32_t>::max(),
                 "max_seqlen_q = " + to_string(a.max_seqlen_q) + " must be in [0, 2^31 - 1]");
  // 0 would clamp every segment to nothing: almost surely a forgotten argument.
  FLASH4_REQUIRE(c, a.max_seqlen_q >= 1 || s.total_q == 0,
                 "max_seqlen_q = 0 but q has " + to_string(s.total_q) +
                     " rows; set it to the most queries a sequence has");
  s.seqlen_q = a.max_seqlen_q;
  s.cu_seqlens_q = static_cast<const int*>(a.cu_seqlens_q.data);
  if (host(a.cu_seqlens_q) && a.cu_seqlens_q.data != nullptr)
    check_host_offsets(c, s.cu_seqlens_q, "cu_seqlens_q", s.batch, s.total_q, s.seqlen_q, "q.shape[0] (total_q)",
                       "max_seqlen_q");
}

// q, the caches and the optional new k, v: fills the sizes of p.attention and the cache's geometry.
void check_tensors(const Checker& c, const KvCacheArgs& a, KvCacheProblem& p) {
  p.paged = present(a.block_table);
  const char* const* cache_dims = p.paged ? kPagedCacheDims : kCacheDims;
  Problem& s = p.attention;
  if (present(a.cu_seqlens_q)) {
    check_packed_queries(c, a, s);
  } else {
    FLASH4_REQUIRE(c, a.max_seqlen_q == 0,
                   "max_seqlen_q = " + to_string(a.max_seqlen_q) +
                       " but it is only used with cu_seqlens_q (packed queries); leave it 0");
    check_tensor(c, a.q, "q", 4, kQDims);
    s.batch = a.q.shape[0];
    s.seqlen_q = a.q.shape[1];
    s.heads = a.q.shape[2];
    s.head_dim = a.q.shape[3];
    s.total_q = s.batch * s.seqlen_q;
  }
  FLASH4_REQUIRE(c, a.q.dtype == DType::kFloat32 || a.q.dtype == DType::kFloat16 || a.q.dtype == DType::kBFloat16,
                 std::string("q.dtype is ") + dtype_name(a.q.dtype) + " but KV-cache attention takes fp32, fp16 or bf16");
  check_tensor(c, a.k_cache, "k_cache", 4, cache_dims);
  check_tensor(c, a.v_cache, "v_cache", 4, cache_dims);
  check_like(c, a.k_cache, "k_cache", a.q, "q");
  check_like(c, a.v_cache, "v_cache", a.q, "q");
  for (int i = 0; i < 4; ++i)
    check_dim(c, a.v_cache, "v_cache", i, cache_dims, a.k_cache.shape[i], "v_cache must have the shape of k_cache");
  check_dim(c, a.k_cache, "k_cache", 3, cache_dims, s.head_dim, "q's head_dim");

  FLASH4_REQUIRE(c, s.seqlen_q <= kMaxSequenceLength,
                 (present(a.cu_seqlens_q) ? "max_seqlen_q" : "q.shape[1] (seqlen_q)") + std::string(" = ") +
                     to_string(s.seqlen_q) + " exceeds the 2^40 - 1 tokens a sequence may have");
  s.heads_kv = a.k_cache.shape[2];
  s.head_dim_v = s.head_dim;  // one head dim for q, k and v (v_cache has k_cache's shape)
  FLASH4_REQUIRE(c, s.heads_kv >= 1, "k_cache.shape[2] (heads_kv) = " + to_string(s.heads_kv) + " must be >= 1");
  FLASH4_REQUIRE(c, s.heads % s.heads_kv == 0,
                 q_dim(a, "heads") + " = " + to_string(s.heads) +
                     " is not a multiple of k_cache.shape[2] (heads_kv) = " +
                     to_string(s.heads_kv) + "; GQA/MQA needs heads % heads_kv == 0");
  FLASH4_REQUIRE(
      c, s.head_dim % kHeadDimMultiple == 0 && s.head_dim >= kHeadDimMultiple && s.head_dim <= kMaxHeadDim,
      q_dim(a, "head_dim") + " = " + to_string(s.head_dim) + " but head_dim must be a multiple of 8 in [8, 256]");

  p.num_slots = a.k_cache.shape[0];
  p.page_size = a.k_cache.shape[1];
  if (p.paged) {
    check_tensor(c, a.block_table, "block_table", 2, kTableDims);
    FLASH4_REQUIRE(c, a.block_table.dtype == DType::kInt32,
                   std::string("block_table.dtype is ") + dtype_name(a.block_table.dtype) + " but must be int32");
    check_same_device(c, a.block_table, "block_table", a.q, "q");
    check_dim(c, a.block_table, "block_table", 0, kTableDims, s.batch, "one row per sequence: " + batch_source(a));
    FLASH4_REQUIRE(c, !present(a.cache_batch_idx),
                   "cache_batch_idx is set with block_table; a paged cache selects its pages through block_table");
    FLASH4_REQUIRE(c, !present(a.cache_leftpad),
                   "cache_leftpad is set with block_table; left padding is for contiguous caches (as in flash-attn)");
    FLASH4_REQUIRE(c, p.page_size >= 1,
                   "k_cache.shape[1] (page_size) = " + to_string(p.page_size) + " must be >= 1 for a paged cache");
    FLASH4_REQUIRE(c, s.batch == 0 || p.num_slots >= 1,
                   "k_cache.shape[0] (num_pages) = 0 but a paged cache needs at least one page");
    p.max_pages = a.block_table.shape[1];
    for (int shift = 0; shift < 62; ++shift)
      if (p.page_size == int64_t{1} << shift) p.page_shift = shift;
    p.block_table = static_cast<const int*>(a.block_table.data);
    p.block_table_stride = a.block_table.stride[0];
  } else if (!present(a.cache_batch_idx)) {
    FLASH4_REQUIRE(c, p.num_slots >= s.batch,
                   "k_cache.shape[0] (batch_cache) = " + to_string(p.num_slots) + " but " + batch_source(a) +
                       " (batch) = " + to_string(s.batch) + "; without cache_batch_idx sequence b uses cache row b");
  } else {
    FLASH4_REQUIRE(c, s.batch == 0 || p.num_slots >= 1,
                   "k_cache.shape[0] (batch_cache) = 0 but cache_batch_idx selects rows of it");
  }
  // Key positions must stay representable: a zero stride lets block_table's or the pool's shape be anything.
  p.capacity = p.page_size;
  FLASH4_REQUIRE(c, !p.paged || !__builtin_mul_overflow(p.page_size, p.max_pages, &p.capacity),
                 "block_table.shape[1] (max_pages) = " + to_string(p.max_pages) + " pages of page_size " +
                     to_string(p.page_size) + " keys overflow int64 key positions");
  s.seqlen_k = p.capacity;
  FLASH4_REQUIRE(c, p.capacity <= kMaxSequenceLength,
                 std::string(p.paged ? "max_pages * page_size" : "k_cache.shape[1] (seqlen_cache)") + " = " +
                     to_string(p.capacity) + " exceeds the 2^40 - 1 keys a sequence may have");

  FLASH4_REQUIRE(c, present(a.k) == present(a.v),
                 std::string(present(a.k) ? "k" : "v") + " is set but " + (present(a.k) ? "v" : "k") +
                     " is not; new keys and values are appended together");
  if (present(a.k)) {
    for (const auto& [t, name] : {std::pair{&a.k, "k"}, std::pair{&a.v, "v"}}) {
      check_tensor(c, *t, name, 4, kNewDims);
      check_like(c, *t, name, a.q, "q");
      check_dim(c, *t, name, 0, kNewDims, s.batch, "q.shape[0]");
      check_dim(c, *t, name, 2, kNewDims, s.heads_kv, "k_cache.shape[2] (heads_kv)");
      check_dim(c, *t, name, 3, kNewDims, s.head_dim, "q's head_dim");
    }
    check_dim(c, a.v, "v", 1, kNewDims, a.k.shape[1], "k.shape[1]: one value per new key");
    p.seqlen_new = a.k.shape[1];
  }
}

void check_rotary(const Checker& c, const KvCacheArgs& a, KvCacheProblem& p) {
  const bool cos = present(a.rotary_cos), sin = present(a.rotary_sin);
  FLASH4_REQUIRE(c, cos == sin,
                 std::string(cos ? "rotary_cos" : "rotary_sin") + " is set but " + (cos ? "rotary_sin" : "rotary_cos") +
                     " is not; rotary embedding needs both");
  if (!cos) return;
  FLASH4_REQUIRE(c, present(a.k),
                 "rotary_cos and rotary_sin are set but k and v are not; rotary embedding applies to new keys (and q)");
  for (const auto& [t, name] : {std::pair{&a.rotary_cos, "rotary_cos"}, std::pair{&a.rotary_sin, "rotary_sin"}}) {
    check_tensor(c, *t, name, 2, kRotaryDims);
    check_like(c, *t, name, a.q, "q");
  }
  for (int i = 0; i < 2; ++i)
    check_dim(c, a.rotary_sin, "rotary_sin", i, kRotaryDims, a.rotary_cos.shape[i], "the shape of rotary_cos");
  p.seqlen_ro = a.rotary_cos.shape[0];
  // Compared before doubling: a shape near int64's limit must not overflow.
  const int64_t half = a.rotary_cos.shape[1];
  FLASH4_REQUIRE(c, half >= 1 && half <= p.attention.head_dim / 2,
                 "rotary_cos.shape[1] (rotary_dim / 2) = " + to_string(half) +
                     " but rotary_dim must be in [2, head_dim = " + to_string(p.attention.head_dim) + "]");
  p.rotary_dim = 2 * half;
  FLASH4_REQUIRE(c, p.seqlen_ro >= 1, "rotary_cos.shape[0] (seqlen_ro) = 0 but the tables need a row per position");
  p.rotary_interleaved = a.rotary_interleaved;
}

void check_scalars(const Checker& c, const KvCacheArgs& a, KvCacheProblem& p) {
  check_score_options(c, {a.softmax_scale, a.softcap, a.causal, a.window_left, a.window_right}, p.attention);
  FLASH4_REQUIRE(
      c, a.num_splits >= 0 && a.num_splits <= kMaxSplits,
      "num_splits = " + to_string(a.num_splits) + " must be in [0, " + to_string(kMaxSplits) + "] (0 = automatic)");
  FLASH4_REQUIRE(c, a.cache_seqlen >= -1,
                 "cache_seqlen = " + to_string(a.cache_seqlen) + " must be >= -1 (-1 = the whole cache)");
  p.num_splits = a.num_splits;
}

// cache_seqlens / cache_seqlen, cache_batch_idx, cache_leftpad and the learnable sink; on the host, every value
// used.
void check_sequences(const Checker& c, const KvCacheArgs& a, KvCacheProblem& p) {
  const Problem& s = p.attention;
  const int64_t room = p.capacity - p.seqlen_new;  // the largest cache length the append leaves room for
  const std::string capacity = p.paged ? "max_pages * page_size = " + to_string(p.capacity)
                                       : "k_cache.shape[1] (seqlen_cache) = " + to_string(p.capacity);
  const auto check_length = [&](int64_t n, const std::string& what) {
    FLASH4_REQUIRE(c, n >= 0, what + " = " + to_string(n) + " must be >= 0");
    FLASH4_REQUIRE(c, n <= room,
                   what + " = " + to_string(n) +
                       (p.seqlen_new > 0 ? " plus seqlen_new = " + to_string(p.seqlen_new) : std::string()) +
                       " exceeds the cache's capacity " + capacity +
                       (p.seqlen_new > 0 ? "; the append would overflow the sequence's cache" : ""));
  };
  if (present(a.cache_seqlens)) {
    check_index_vector(c, a.cache_seqlens, "cache_seqlens", s.batch, a);
    p.cache_seqlens = static_cast<const int*>(a.cache_seqlens.data);
    if (host(a.cache_seqlens))
      for (int64_t b = 0; b < s.batch; ++b) check_length(p.cache_seqlens[b], "cache_seqlens[" + to_string(b) + "]");
  } else {
    p.cache_seqlen = a.cache_seqlen == -1 ? p.capacity : a.cache_seqlen;
    if (s.batch > 0)
      check_length(p.cache_seqlen, a.cache_seqlen == -1 ? "cache_seqlen (-1: the whole cache)" : "cache_seqlen");
  }
  if (present(a.cache_batch_idx)) {
    check_index_vector(c, a.cache_batch_idx, "cache_batch_idx", s.batch, a);
    p.cache_batch_idx = static_cast<const int*>(a.cache_batch_idx.data);
    if (host(a.cache_batch_idx)) {
      for (int64_t b = 0; b < s.batch; ++b) {
        const int64_t i = p.cache_batch_idx[b];
        FLASH4_REQUIRE(c, i >= 0 && i < p.num_slots,
                       "cache_batch_idx[" + to_string(b) + "] = " + to_string(i) + " but must be in [0, " +
                           to_string(p.num_slots) + ") (k_cache.shape[0], batch_cache)");
      }
    }
  }
  if (present(a.cache_leftpad)) {
    check_index_vector(c, a.cache_leftpad, "cache_leftpad", s.batch, a);
    p.cache_leftpad = static_cast<const int*>(a.cache_leftpad.data);
    if (host(a.cache_leftpad)) {
      for (int64_t b = 0; b < s.batch; ++b) {
        const int64_t pad = p.cache_leftpad[b], end = p.cache_end(b);
        FLASH4_REQUIRE(c, pad >= 0 && pad <= end,
                       "cache_leftpad[" + to_string(b) + "] = " + to_string(pad) + " but must be in [0, " +
                           to_string(end) + "] (cache_seqlens[" + to_string(b) + "]: the sequence's keys are rows " +
                           "cache_leftpad .. cache_seqlens - 1)");
      }
    }
  }
  if (p.paged && host(a.block_table)) {
    for (int64_t b = 0; b < s.batch; ++b) {
      // The pages sequence b uses, rounded up without adding page_size - 1 (which can pass int64's limit when
      // max_pages * page_size is close to it).
      const int64_t keys = p.seqlen_k(b), pages = keys / p.page_size + (keys % p.page_size != 0 ? 1 : 0);
      if (pages <= 0) continue;  // no row to read (an empty table may have no data at all)
      const int* row = p.block_table + b * p.block_table_stride;
      for (int64_t j = 0; j < pages; ++j) {
        FLASH4_REQUIRE(c, row[j] >= 0 && row[j] < p.num_slots,
                       "block_table[" + to_string(b) + "][" + to_string(j) + "] = " + to_string(row[j]) +
                           " but must be in [0, " + to_string(p.num_slots) +
                           ") (k_cache.shape[0], num_pages): sequence " + to_string(b) + " uses its first " +
                           to_string(pages) + " pages");
      }
    }
  }
  if (p.rotary_dim > 0 && host(a.q)) {
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t q_last = p.rotary_q_per_row() ? s.seqlen_q - 1 : 0;
      const int64_t offset = std::max<int64_t>(p.seqlen_new - 1, q_last);
      // An empty q (no heads) leaves seqlen_q unbounded by its extent: the position may pass int64's limit.
      int64_t last = 0;
      const bool beyond = __builtin_add_overflow(p.rotary_position(b, p.cache_length(b)), offset, &last);
      FLASH4_REQUIRE(c, !beyond && last < p.seqlen_ro,
                     "rotary_cos.shape[0] (seqlen_ro) = " + to_string(p.seqlen_ro) + " but sequence " + to_string(b) +
                         " needs the rotary angle of position " +
                         (beyond ? to_string(p.rotary_position(b, p.cache_length(b))) + " + " + to_string(offset) +
                                       " (beyond int64)"
                                 : to_string(last)));
    }
  }
  if (present(a.learnable_sink)) {
    check_tensor(c, a.learnable_sink, "learnable_sink", 1, kVectorDims);
    FLASH4_REQUIRE(c, a.learnable_sink.dtype == DType::kFloat32,
                   std::string("learnable_sink.dtype is ") + dtype_name(a.learnable_sink.dtype) + " but must be fp32");
    check_same_device(c, a.learnable_sink, "learnable_sink", a.q, "q");
    check_dim(c, a.learnable_sink, "learnable_sink", 0, kVectorDims, s.heads,
              "one value per head: " + q_dim(a, "heads"));
    p.attention.learnable_sink = static_cast<const float*>(a.learnable_sink.data);
  }
}

void check_outputs(const Checker& c, const KvCacheArgs& a, const KvCacheProblem& p) {
  const bool packed = present(a.cu_seqlens_q);
  const int q_rank = packed ? 3 : 4;
  check_tensor(c, a.out, "out", q_rank, packed ? kPackedQDims : kQDims);
  check_like(c, a.out, "out", a.q, "q");
  for (int i = 0; i < q_rank; ++i)
    check_dim(c, a.out, "out", i, packed ? kPackedQDims : kQDims, a.q.shape[i], "out must have the shape of q");
  const bool has_lse = present(a.lse);
  if (has_lse) {
    const int lse_rank = packed ? 2 : 3;
    const char* const* dims = packed ? kPackedLseDims : kLseDims;
    check_tensor(c, a.lse, "lse", lse_rank, dims);
    FLASH4_REQUIRE(c, a.lse.dtype == DType::kFloat32,
                   std::string("lse.dtype is ") + dtype_name(a.lse.dtype) + " but must be fp32");
    check_same_device(c, a.lse, "lse", a.q, "q");
    const Problem& s = p.attention;
    const int64_t dense[3] = {s.batch, s.heads, s.seqlen_q}, packed_shape[2] = {s.heads, s.total_q};
    for (int i = 0; i < lse_rank; ++i)
      check_dim(c, a.lse, "lse", i, dims, packed ? packed_shape[i] : dense[i],
                packed ? "lse must be (heads, total_q)" : "lse must be (batch, heads, seqlen_q)");
  }
  const std::pair<const TensorView*, const char*> inputs[] = {{&a.q, "q"},
                                                              {&a.k, "k"},
                                                              {&a.v, "v"},
                                                              {&a.rotary_cos, "rotary_cos"},
                                                              {&a.rotary_sin, "rotary_sin"},
                                                              {&a.cache_seqlens, "cache_seqlens"},
                                                              {&a.cache_batch_idx, "cache_batch_idx"},
                                                              {&a.cache_leftpad, "cache_leftpad"},
                                                              {&a.block_table, "block_table"},
                                                              {&a.learnable_sink, "learnable_sink"},
                                                              {&a.cu_seqlens_q, "cu_seqlens_q"}};
  for (const auto& [in, name] : inputs) {
    check_no_overlap(c, a.out, "out", *in, name);
    if (has_lse) check_no_overlap(c, a.lse, "lse", *in, name);
    if (p.seqlen_new > 0) {  // the caches are written: nothing they read from may share their bytes
      check_no_overlap(c, a.k_cache, "k_cache", *in, name);
      check_no_overlap(c, a.v_cache, "v_cache", *in, name);
    }
  }
  for (const auto& [cache, name] : {std::pair{&a.k_cache, "k_cache"}, std::pair{&a.v_cache, "v_cache"}}) {
    check_no_overlap(c, a.out, "out", *cache, name);
    if (has_lse) check_no_overlap(c, a.lse, "lse", *cache, name);
    if (p.seqlen_new > 0) check_distinct_elements(c, *cache, name);
  }
  // The appended keys and values must not land on each other (k_cache and v_cache one tensor, or overlapping
  // views of one buffer).
  if (p.seqlen_new > 0) check_no_shared_elements(c, a.k_cache, "k_cache", a.v_cache, "v_cache");
  check_distinct_elements(c, a.out, "out");
  if (has_lse) {
    check_distinct_elements(c, a.lse, "lse");
    check_no_overlap(c, a.lse, "lse", a.out, "out");
  }
}

}  // namespace

KvCacheProblem validate(const KvCacheArgs& args) {
  const Checker c("flash4::forward_kvcache");
  KvCacheProblem p;
  check_tensors(c, args, p);
  check_rotary(c, args, p);
  check_scalars(c, args, p);
  check_sequences(c, args, p);
  check_outputs(c, args, p);
  return p;
}

}  // namespace flash4::detail
