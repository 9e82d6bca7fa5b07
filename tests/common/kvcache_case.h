// One KV-cache attention test case (flash4/kvcache.h): the spec, random host inputs (a cache whose rows past each
// sequence are NaN, so a read outside the sequence shows), the KvCacheArgs, and an fp64 model of the whole call,
// written independently of the library: the cache after the append (with rotary in fp64, numpy style) and, per
// sequence, the reference and the naive baseline on the dense K/V gathered from that cache.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "common/test_rng.h"
#include "flash4/kvcache.h"

namespace flash4::test {

enum class Rotary { kNone, kInterleaved, kNeox };

struct KvCaseSpec {
  int64_t batch = 1, seqlen_q = 1, heads = 1, heads_kv = 1, head_dim = 64;
  DType dtype = DType::kBFloat16;
  std::vector<int64_t> cache_lengths{16};  // keys in each sequence's cache before the append (one per sequence)
  int64_t seqlen_new = 0;                  // appended keys per sequence
  int64_t page_size = 0;                   // 0 = contiguous cache
  int64_t spare = 3;                       // cache rows (contiguous) or pages (paged) beyond what is needed
  bool cache_batch_idx = false;            // contiguous: sequences use shuffled cache rows
  bool scalar_length = false;              // pass cache_lengths[0] as cache_seqlen instead of cache_seqlens
  std::vector<int64_t> leftpad;            // contiguous: cache_leftpad per sequence (rows before its first key)
  Rotary rotary = Rotary::kNone;
  int64_t rotary_dim = 0;  // 0 = head_dim
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool sink = false;
  int num_splits = 1;
  std::string name() const;
};

// `s` after `change(s)`: with(spec, [](KvCaseSpec& s) { s.causal = true; }).
template <class Change>
KvCaseSpec with(KvCaseSpec s, Change&& change) {
  change(s);
  return s;
}

struct KvCacheCase {
  KvCaseSpec spec;
  HostTensor q, k_cache, v_cache, k, v, cos, sin, out, lse;
  HostTensor sink;
  std::vector<int32_t> cache_seqlens, cache_batch_idx, block_table, cache_leftpad;
  int64_t max_pages = 0, seqlen_ro = 0;
  std::vector<double> initial_k_cache, initial_v_cache;

  KvCacheCase(const KvCaseSpec& s, Rng& rng);
  KvCacheArgs args() const;
};

// The decode grid shapes users run, for the CPU and the GPU tests alike: GQA groups that do not divide a 16-row
// tile (3, 5, 7, 12) and many query heads on one KV head (32, 64: several tiles, or rows enough for the dense
// kernel), 1, 3 and 7 queries, contiguous caches and pages of 16 to 256 keys, lengths around the tile and split
// sizes, head dims 64 / 128 / 256 in turn, causal in every other case, the automatic split count.
std::vector<KvCaseSpec> decode_grid();

// Checks the caches after the call (appended rows as the fp64 model within the rotary's rounding, all other rows
// unchanged bit for bit) and out / lse against the reference under the tolerance rule.
::testing::AssertionResult check_kvcache(const KvCacheCase& c);

}  // namespace flash4::test
