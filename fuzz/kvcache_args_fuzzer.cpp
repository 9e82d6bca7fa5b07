// libFuzzer target for flash4::forward_kvcache's arguments (fuzz/README.md). Each input describes a KvCacheArgs:
// q, a contiguous or paged cache, optional new keys and values (the in-place append), rotary tables, host index
// tensors (cache_seqlens, cache_batch_idx, cache_leftpad, block_table) holding valid or corrupt values, packed
// queries (cu_seqlens_q with valid or corrupt offsets, max_seqlen_q), masks, softcap, the sink and num_splits, with
// every view open to the corruptions of fuzz_args.h. Properties:
//   - can_implement and forward_kvcache either accept or throw flash4::Error whose message starts with
//     "flash4::forward_kvcache: "; any other exception, a crash or a sanitizer report is a finding;
//   - a call that throws leaves the arena untouched (neither the outputs nor the caches are written);
//   - a call that runs writes nothing outside out, lse and (when appending) the caches.
#include "flash4/kvcache.h"
#include "fuzz_args.h"

namespace {

using namespace flash4::fuzz;

// With FLASH4_FUZZ_STATS set: how many calls ran to completion, paged, appending and packed among them.
struct RunStats {
  long runs = 0, paged = 0, appends = 0, packed = 0;
  ~RunStats() {
    if (std::getenv("FLASH4_FUZZ_STATS") != nullptr)
      std::fprintf(stderr, "calls run: %ld, paged %ld, appending %ld, packed queries %ld\n", runs, paged, appends,
                   packed);
  }
} g_stats;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  reset_arena();

  const int64_t batch = in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t seqlen_q = in.ConsumeIntegralInRange<int64_t>(0, 4);
  const int64_t heads_kv = in.ConsumeIntegralInRange<int64_t>(0, 2);
  const int64_t heads = heads_kv * in.ConsumeIntegralInRange<int64_t>(0, 3) + (in.ConsumeBool() ? 0 : 1);
  const int64_t head_dim = 8 * in.ConsumeIntegralInRange<int64_t>(0, 4);
  const int64_t seqlen_new = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int64_t>(0, 3);
  const bool paged = in.ConsumeBool();
  // Contiguous: (batch_cache, seqlen_cache, heads_kv, d). Paged: (num_pages, page_size, heads_kv, d) with a
  // (batch, max_pages) table.
  const int64_t slots = paged ? in.ConsumeIntegralInRange<int64_t>(0, 6) : in.ConsumeIntegralInRange<int64_t>(0, 4);
  const int64_t rows = paged ? int64_t{1} << in.ConsumeIntegralInRange<int>(0, 3) : in.ConsumeIntegralInRange<int64_t>(0, 12);
  const int64_t max_pages = in.ConsumeIntegralInRange<int64_t>(0, 4);
  // Packed queries: q and out (total_q, heads, d), lse (heads, total_q), and cu_seqlens_q below.
  const bool packed = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  const int64_t total_q = packed ? in.ConsumeIntegralInRange<int64_t>(0, 9) : 0;

  flash4::KvCacheArgs a;
  const std::array<int64_t, 4> q_shape = packed ? std::array<int64_t, 4>{total_q, heads, head_dim, 0}
                                                : std::array<int64_t, 4>{batch, seqlen_q, heads, head_dim};
  a.q = pick_view(in, packed ? 3 : 4, q_shape);
  a.k_cache = pick_view(in, 4, {slots, rows, heads_kv, head_dim});
  a.v_cache = pick_view(in, 4, {slots, rows, heads_kv, head_dim});
  a.out = pick_view(in, packed ? 3 : 4, q_shape);
  std::vector<const flash4::TensorView*> all = {&a.q, &a.k_cache, &a.v_cache, &a.out};
  std::vector<const flash4::TensorView*> outputs = {&a.out};
  if (in.ConsumeBool()) {
    a.lse = packed ? pick_view(in, 2, {heads, total_q, 0, 0}) : pick_view(in, 3, {batch, heads, seqlen_q, 0});
    all.push_back(&a.lse);
    outputs.push_back(&a.lse);
  }
  if (seqlen_new > 0) {
    a.k = pick_view(in, 4, {batch, seqlen_new, heads_kv, head_dim});
    a.v = pick_view(in, 4, {batch, seqlen_new, heads_kv, head_dim});
    all.push_back(&a.k);
    all.push_back(&a.v);
    outputs.push_back(&a.k_cache);  // the append writes the caches
    outputs.push_back(&a.v_cache);
    if (in.ConsumeIntegralInRange<int>(0, 2) == 0) {
      const int64_t seqlen_ro = in.ConsumeIntegralInRange<int64_t>(0, 16);
      const int64_t half = in.ConsumeIntegralInRange<int64_t>(0, head_dim / 2 + 1);
      a.rotary_cos = pick_view(in, 2, {seqlen_ro, half, 0, 0});
      a.rotary_sin = pick_view(in, 2, {seqlen_ro, half, 0, 0});
      a.rotary_interleaved = in.ConsumeBool();
      all.push_back(&a.rotary_cos);
      all.push_back(&a.rotary_sin);
    }
  }
  const int64_t capacity = paged ? max_pages * rows : rows;
  if (in.ConsumeBool()) {
    a.cache_seqlens = pick_vector(in, batch, flash4::DType::kInt32);
    fill_values(in, a.cache_seqlens, 0, static_cast<int32_t>(capacity));
    all.push_back(&a.cache_seqlens);
  } else {
    a.cache_seqlen = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? pick_size(in)
                                                               : in.ConsumeIntegralInRange<int64_t>(-1, capacity);
  }
  if (paged) {
    a.block_table = pick_view(in, 2, {batch, max_pages, 0, 0});
    if (in.ConsumeIntegralInRange<int>(0, 15) != 0) a.block_table.dtype = flash4::DType::kInt32;
    fill_values(in, a.block_table, 0, static_cast<int32_t>(slots) - 1);
    all.push_back(&a.block_table);
  } else if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    a.cache_batch_idx = pick_vector(in, batch, flash4::DType::kInt32);
    fill_values(in, a.cache_batch_idx, 0, static_cast<int32_t>(slots) - 1);
    all.push_back(&a.cache_batch_idx);
  }
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {  // with a paged cache: refused by name
    a.cache_leftpad = pick_vector(in, batch, flash4::DType::kInt32);
    fill_values(in, a.cache_leftpad, 0, static_cast<int32_t>(capacity));
    all.push_back(&a.cache_leftpad);
  }
  if (in.ConsumeIntegralInRange<int>(0, 2) == 0) {
    a.learnable_sink = pick_vector(in, heads, flash4::DType::kFloat32);
    all.push_back(&a.learnable_sink);
  }
  if (packed) {
    a.cu_seqlens_q = pick_vector(in, batch + 1, flash4::DType::kInt32);
    const int64_t longest = fill_index(in, a.cu_seqlens_q, true, 4);
    a.max_seqlen_q = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? pick_size(in) : longest;
    all.push_back(&a.cu_seqlens_q);
  }
  a.softmax_scale = pick_scalar(in);
  a.softcap = pick_scalar(in);
  a.causal = in.ConsumeBool();
  a.window_left = pick_window(in);
  a.window_right = pick_window(in);
  a.num_splits = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? pick_window(in) : in.ConsumeIntegralInRange<int>(0, 5);

  // Validation reads the host index tensors (that is how it names a bad page or length without a device). A view
  // whose declared extent leaves the arena describes memory the caller does not own: reading it would be the
  // caller's fault, so such inputs stop here. (Negative sizes, wild odd pointers and the like are still refused.)
  for (const flash4::TensorView* t : {&a.cache_seqlens, &a.cache_batch_idx, &a.block_table, &a.cu_seqlens_q}) {
    size_t b = 0, e = 0;
    bool sane = t->data != nullptr && t->device.kind == flash4::DeviceKind::kCpu && t->rank >= 1 && t->rank <= 4 &&
                reinterpret_cast<uintptr_t>(t->data) % 4 == 0;
    for (int i = 0; i < t->rank && sane; ++i) sane = t->shape[i] >= 0 && t->stride[i] >= 0;
    if (sane && !arena_range(*t, b, e)) return 0;
  }

  const char* entry = "flash4::forward_kvcache: ";
  try {
    (void)flash4::can_implement(a);
  } catch (const flash4::Error& e) {
    check_error(e, entry);
  }
  // Multiply-adds: every query row against every cache row and new key (bounded by the views' own shapes).
  double work = 1.0;
  for (int i = 0; i < a.q.rank && i < 4; ++i) work *= static_cast<double>(a.q.shape[i]);
  const double keys = static_cast<double>(a.k_cache.shape[0]) * static_cast<double>(a.k_cache.shape[1]) +
                      static_cast<double>(seqlen_new);
  work *= keys;
  if (work < 0) work = std::numeric_limits<double>::infinity();
  run_checked(all, outputs, work, entry, [&] {
    flash4::forward_kvcache(a);
    ++g_stats.runs;
    if (paged) ++g_stats.paged;
    if (seqlen_new > 0) ++g_stats.appends;
    if (packed) ++g_stats.packed;
  });
  return 0;
}
