// KV-cache attention on the CPU (flash4/kvcache.h) against the fp64 model of tests/common/kvcache_case.h: contiguous
// and paged caches, append, cache_batch_idx, rotary, masks, GQA, sink, split counts.
#include <gtest/gtest.h>

#include "common/kvcache_case.h"

namespace flash4::test {
namespace {

void run_case(const KvCaseSpec& spec) {
  FLASH4_TEST_RNG(rng);
  KvCacheCase c(spec, rng);
  ASSERT_TRUE(can_implement(c.args()).ok);
  forward_kvcache(c.args());
  EXPECT_TRUE(check_kvcache(c));
}

KvCaseSpec spec(int64_t batch, int64_t seqlen_q, int64_t heads, int64_t heads_kv, std::vector<int64_t> lengths,
                DType dtype = DType::kBFloat16) {
  KvCaseSpec s;
  s.batch = batch;
  s.seqlen_q = seqlen_q;
  s.heads = heads;
  s.heads_kv = heads_kv;
  s.cache_lengths = std::move(lengths);
  s.dtype = dtype;
  return s;
}

template <class Change>
KvCaseSpec with(KvCaseSpec s, Change&& change) {
  change(s);
  return s;
}

TEST(KvCache, ContiguousDecode) {
  run_case(spec(3, 1, 4, 2, {17, 0, 130}));
  run_case(spec(2, 1, 8, 1, {1, 1000}, DType::kFloat16));
  run_case(spec(1, 1, 2, 2, {333}, DType::kFloat32));
}

TEST(KvCache, ContiguousMultiQuery) {
  run_case(spec(2, 5, 4, 4, {40, 3}));
  run_case(with(spec(2, 70, 4, 2, {100, 257}), [](KvCaseSpec& s) { s.causal = true; }));
  run_case(with(spec(2, 16, 4, 1, {0, 9}), [](KvCaseSpec& s) { s.causal = true; }));  // rows with no key
}

TEST(KvCache, AppendContiguous) {
  run_case(with(spec(3, 1, 4, 2, {17, 0, 64}), [](KvCaseSpec& s) { s.seqlen_new = 1; }));
  run_case(with(spec(2, 7, 4, 2, {31, 5}), [](KvCaseSpec& s) {
    s.seqlen_new = 7;
    s.causal = true;
  }));
}

}  // namespace
}  // namespace flash4::test
