// flash4._C.forward_kvcache / can_implement_kvcache: the KV-cache entry points (flash4/kvcache.h) for the
// Python package (python/flash4/_kvcache.py). The caches are writable arrays: new keys and values are appended
// to them in place.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "flash4/kvcache.h"
#include "tensor_view.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace flash4::python {
namespace {

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;
using Opt = std::optional<InArray>;

struct KvCacheInputs {
  InArray q;
  OutArray k_cache, v_cache;
  Opt k, v, rotary_cos, rotary_sin, cache_seqlens;
  int64_t cache_seqlen;
  Opt cache_batch_idx, block_table, cache_leftpad;
  OutArray out;
  std::optional<OutArray> lse;
  Opt learnable_sink;
  Opt cu_seqlens_q;  // packed queries: q, out (total_q, heads, head_dim), lse (heads, total_q)
  int64_t max_seqlen_q;
};

KvCacheArgs make_args(const KvCacheInputs& in, float softmax_scale, bool causal, int window_left, int window_right,
                      float softcap, bool rotary_interleaved, int num_splits) {
  KvCacheArgs a;
  const bool packed = in.cu_seqlens_q.has_value();
  const int q_rank = packed ? kPackedAttentionRank : kAttentionRank;
  a.q = to_view(in.q, "q", q_rank);
  a.k_cache = to_view(in.k_cache, "k_cache", kAttentionRank);
  a.v_cache = to_view(in.v_cache, "v_cache", kAttentionRank);
  const std::pair<const Opt*, std::pair<TensorView*, std::pair<const char*, int>>> optional[] = {
      {&in.k, {&a.k, {"k", kAttentionRank}}},
      {&in.v, {&a.v, {"v", kAttentionRank}}},
      {&in.cache_seqlens, {&a.cache_seqlens, {"cache_seqlens", kVectorRank}}},
      {&in.cache_batch_idx, {&a.cache_batch_idx, {"cache_batch_idx", kVectorRank}}},
      {&in.cache_leftpad, {&a.cache_leftpad, {"cache_leftpad", kVectorRank}}},
      {&in.learnable_sink, {&a.learnable_sink, {"learnable_sink", kVectorRank}}}};
  for (const auto& [array, field] : optional)
    if (array->has_value()) *field.first = to_view(**array, field.second.first, field.second.second);
  constexpr const char* kRotaryLayout = "(seqlen_ro, rotary_dim / 2)";
  if (in.rotary_cos.has_value()) a.rotary_cos = to_matrix_view(*in.rotary_cos, "rotary_cos", kRotaryLayout);
  if (in.rotary_sin.has_value()) a.rotary_sin = to_matrix_view(*in.rotary_sin, "rotary_sin", kRotaryLayout);
  if (in.block_table.has_value())
    a.block_table = to_matrix_view(*in.block_table, "block_table", "(batch, max_pages)", /*index=*/true);
  a.cache_seqlen = in.cache_seqlen;
  a.out = to_view(in.out, "out", q_rank);
  if (in.lse.has_value()) a.lse = to_view(*in.lse, "lse", packed ? kPackedLseRank : kLseRank);
  if (packed) {
    if (in.cu_seqlens_q->size() == 0)  // an empty view would read as absent: a packed call turned dense
      throw nb::value_error("cu_seqlens_q has no elements; it must hold batch + 1 offsets starting with 0");
    a.cu_seqlens_q = to_view(*in.cu_seqlens_q, "cu_seqlens_q", kVectorRank);
  }
  a.max_seqlen_q = in.max_seqlen_q;
  a.softmax_scale = softmax_scale;
  a.causal = causal;
  a.window_left = window_left;
  a.window_right = window_right;
  a.softcap = softcap;
  a.rotary_interleaved = rotary_interleaved;
  a.num_splits = num_splits;
  return a;
}

}  // namespace

void bind_kvcache(nb::module_& m) {
  m.def(
      "forward_kvcache",
      [](const InArray& q, const OutArray& k_cache, const OutArray& v_cache, Opt k, Opt v, Opt rotary_cos,
         Opt rotary_sin, Opt cache_seqlens, int64_t cache_seqlen, Opt cache_batch_idx, Opt block_table,
         Opt cache_leftpad,
         const OutArray& out, std::optional<OutArray> lse, Opt learnable_sink, float softmax_scale, bool causal,
         int window_left, int window_right, float softcap, bool rotary_interleaved, int num_splits, uintptr_t stream,
         Opt cu_seqlens_q, int64_t max_seqlen_q) {
        const KvCacheInputs in{q,
                               k_cache,
                               v_cache,
                               std::move(k),
                               std::move(v),
                               std::move(rotary_cos),
                               std::move(rotary_sin),
                               std::move(cache_seqlens),
                               cache_seqlen,
                               std::move(cache_batch_idx),
                               std::move(block_table),
                               std::move(cache_leftpad),
                               out,
                               std::move(lse),
                               std::move(learnable_sink),
                               std::move(cu_seqlens_q),
                               max_seqlen_q};
        const KvCacheArgs a =
            make_args(in, softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved, num_splits);
        nb::gil_scoped_release no_gil;
        flash4::forward_kvcache(a, reinterpret_cast<Stream>(stream));
      },
      "q"_a, "k_cache"_a, "v_cache"_a, "k"_a.none(), "v"_a.none(), "rotary_cos"_a.none(), "rotary_sin"_a.none(),
      "cache_seqlens"_a.none(), "cache_seqlen"_a, "cache_batch_idx"_a.none(), "block_table"_a.none(),
      "cache_leftpad"_a.none(), "out"_a,
      "lse"_a.none(), "learnable_sink"_a.none(), "softmax_scale"_a, "causal"_a, "window_left"_a, "window_right"_a,
      "softcap"_a, "rotary_interleaved"_a, "num_splits"_a, "stream"_a = 0, "cu_seqlens_q"_a.none() = nb::none(),
      "max_seqlen_q"_a = 0,
      "KV-cache attention into preallocated out (and lse, or None); appends k, v to the caches in place.");
  m.def(
      "can_implement_kvcache",
      [](const InArray& q, const OutArray& k_cache, const OutArray& v_cache, Opt k, Opt v, Opt rotary_cos,
         Opt rotary_sin, Opt cache_seqlens, int64_t cache_seqlen, Opt cache_batch_idx, Opt block_table,
         Opt cache_leftpad,
         const OutArray& out, std::optional<OutArray> lse, Opt learnable_sink, float softmax_scale, bool causal,
         int window_left, int window_right, float softcap, bool rotary_interleaved, int num_splits,
         Opt cu_seqlens_q, int64_t max_seqlen_q) {
        const KvCacheInputs in{q,
                               k_cache,
                               v_cache,
                               std::move(k),
                               std::move(v),
                               std::move(rotary_cos),
                               std::move(rotary_sin),
                               std::move(cache_seqlens),
                               cache_seqlen,
                               std::move(cache_batch_idx),
                               std::move(block_table),
                               std::move(cache_leftpad),
                               out,
                               std::move(lse),
                               std::move(learnable_sink),
                               std::move(cu_seqlens_q),
                               max_seqlen_q};
        const Support s = flash4::can_implement(
            make_args(in, softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved, num_splits));
        return std::pair<bool, std::string>{s.ok, s.reason};
      },
      "q"_a, "k_cache"_a, "v_cache"_a, "k"_a.none(), "v"_a.none(), "rotary_cos"_a.none(), "rotary_sin"_a.none(),
      "cache_seqlens"_a.none(), "cache_seqlen"_a, "cache_batch_idx"_a.none(), "block_table"_a.none(),
      "cache_leftpad"_a.none(), "out"_a,
      "lse"_a.none(), "learnable_sink"_a.none(), "softmax_scale"_a, "causal"_a, "window_left"_a, "window_right"_a,
      "softcap"_a, "rotary_interleaved"_a, "num_splits"_a, "cu_seqlens_q"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
      "(ok, reason): whether the tensors' device can run this KV-cache call; raises on invalid arguments.");
}

}  // namespace flash4::python
