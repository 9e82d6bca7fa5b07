// KV-cache attention on the CPU (flash4/kvcache.h) against the fp64 model of tests/common/kvcache_case.h: contiguous
// and paged caches, append, cache_batch_idx, rotary, masks, GQA, sink, split counts, packed queries.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/kvcache_case.h"
#include "common/kvcache_packed.h"

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

// The query heads of a KV head share a tile, row by row (GroupRows in src/cpu/kvcache_forward.cpp): groups of 3
// and 5 whose rows straddle the 64-row tiles (query 21's three rows are 63, 64, 65), with masks per query, the
// sink per head, rotary per query position and splits.
TEST(KvCache, GroupRowsAcrossTiles) {
  run_case(with(spec(2, 30, 6, 2, {70, 45}), [](KvCaseSpec& s) {
    s.causal = true;
    s.window_left = 9;
    s.sink = true;
    s.num_splits = 2;
  }));
  run_case(with(spec(1, 17, 10, 2, {300}), [](KvCaseSpec& s) {
    s.seqlen_new = 17;
    s.causal = true;
    s.rotary = Rotary::kNeox;
    s.page_size = 16;
  }));
}

TEST(KvCache, AppendContiguous) {
  run_case(with(spec(3, 1, 4, 2, {17, 0, 64}), [](KvCaseSpec& s) { s.seqlen_new = 1; }));
  run_case(with(spec(2, 7, 4, 2, {31, 5}), [](KvCaseSpec& s) {
    s.seqlen_new = 7;
    s.causal = true;
  }));
}

// The append ends exactly at the cache's last row (contiguous, no spare row) or page's last row (paged), with a
// GQA group of 7 and an empty cache beside it.
TEST(KvCache, AppendFillsTheCapacity) {
  for (int64_t page : {0, 16}) {
    run_case(with(spec(2, 3, 7, 1, {29, 0}, DType::kFloat16), [&](KvCaseSpec& s) {
      s.page_size = page;
      s.spare = 0;
      s.seqlen_new = 3;
      s.causal = true;
    }));
  }
}

TEST(KvCache, Paged) {
  for (int64_t page : {1, 16, 256}) {
    run_case(with(spec(3, 1, 4, 2, {17, 0, 300}), [&](KvCaseSpec& s) { s.page_size = page; }));
    run_case(with(spec(2, 9, 4, 4, {33, 1}), [&](KvCaseSpec& s) {
      s.page_size = page;
      s.causal = true;
    }));
  }
  run_case(with(spec(1, 1, 8, 1, {4097}), [](KvCaseSpec& s) { s.page_size = 16; }));  // MQA, 257 pages
  run_case(with(spec(1, 2, 2, 1, {100003}), [](KvCaseSpec& s) {                       // a long cache, automatic splits
    s.page_size = 256;
    s.num_splits = 0;
    s.seqlen_new = 2;
    s.causal = true;
  }));
}

TEST(KvCache, AppendPaged) {
  for (int64_t page : {1, 16, 256}) {
    run_case(with(spec(3, 1, 4, 2, {15, 0, 31}), [&](KvCaseSpec& s) {
      s.page_size = page;
      s.seqlen_new = 1;
    }));
    run_case(with(spec(2, 5, 4, 2, {14, 250}), [&](KvCaseSpec& s) {  // the append crosses page boundaries
      s.page_size = page;
      s.seqlen_new = 5;
      s.causal = true;
    }));
  }
}

TEST(KvCache, CacheBatchIdxAndScalarLength) {
  run_case(with(spec(3, 2, 4, 2, {20, 5, 0}), [](KvCaseSpec& s) {
    s.cache_batch_idx = true;
    s.seqlen_new = 2;
    s.causal = true;
  }));
  run_case(with(spec(2, 1, 2, 1, {12, 12}), [](KvCaseSpec& s) {
    s.scalar_length = true;
    s.seqlen_new = 1;
  }));
}

// flash-attn's cache_leftpad: sequence b's keys are rows leftpad[b] .. cache_seqlens[b] - 1 (the rows before
// hold NaN: reading one poisons the output), the append writes at cache_seqlens[b], rotary angles at the rows.
TEST(KvCache, LeftPad) {
  run_case(with(spec(3, 2, 4, 2, {40, 7, 300}), [](KvCaseSpec& s) {
    s.leftpad = {5, 0, 299};
    s.cache_batch_idx = true;
    s.causal = true;
  }));
  run_case(with(spec(3, 1, 8, 2, {40, 7, 300}), [](KvCaseSpec& s) {
    s.leftpad = {39, 7, 100};  // one key, only the appended ones, 200
    s.seqlen_new = 3;
    s.rotary = Rotary::kNeox;
    s.sink = true;
    s.num_splits = 3;
  }));
}

TEST(KvCache, Rotary) {
  for (Rotary r : {Rotary::kInterleaved, Rotary::kNeox}) {
    for (DType t : {DType::kFloat32, DType::kBFloat16}) {
      // Causal: q rotated at its own positions; not causal: all of q at the cache length.
      run_case(with(spec(2, 3, 4, 2, {10, 0}, t), [&](KvCaseSpec& s) {
        s.rotary = r;
        s.seqlen_new = 3;
        s.causal = true;
      }));
      run_case(with(spec(2, 3, 4, 2, {10, 41}, t), [&](KvCaseSpec& s) {
        s.rotary = r;
        s.rotary_dim = 32;  // part of the head rotated
        s.seqlen_new = 2;
        s.page_size = 16;
      }));
    }
  }
}

TEST(KvCache, MasksSoftcapSink) {
  run_case(with(spec(2, 4, 4, 2, {100, 7}), [](KvCaseSpec& s) {
    s.window_left = 20;
    s.window_right = 0;
  }));
  run_case(with(spec(2, 4, 4, 2, {100, 7}), [](KvCaseSpec& s) {
    s.causal = true;
    s.window_left = 3;
    s.seqlen_new = 2;
    s.page_size = 16;
  }));
  run_case(with(spec(2, 3, 4, 1, {50, 0}), [](KvCaseSpec& s) {
    s.softcap = 5.0f;
    s.sink = true;  // the empty sequence gets lse = sink
  }));
  run_case(with(spec(1, 64 + 5, 2, 2, {200}), [](KvCaseSpec& s) {
    s.causal = true;
    s.sink = true;
    s.num_splits = 3;
  }));
}

TEST(KvCache, SplitCounts) {
  for (int splits : {1, 3, 0, 7, 64, 128}) {
    run_case(with(spec(2, 1, 4, 2, {1000, 17}), [&](KvCaseSpec& s) {
      s.num_splits = splits;
      s.page_size = 16;
      s.sink = splits == 7;
    }));
    run_case(with(spec(1, 20, 2, 1, {700}), [&](KvCaseSpec& s) {
      s.num_splits = splits;
      s.causal = true;
      s.seqlen_new = 3;
    }));
  }
}

TEST(KvCache, DecodeGrid) {
  for (const KvCaseSpec& s : decode_grid()) {
    SCOPED_TRACE(s.name());
    run_case(s);
  }
}

// Every split count gives the result of one split within fp32 rounding (fp32 tensors, so the output keeps it).
TEST(KvCache, SplitsMatchOneSplit) {
  FLASH4_TEST_RNG(rng);
  const KvCaseSpec base = with(spec(2, 3, 4, 2, {1500, 129}, DType::kFloat32), [](KvCaseSpec& s) {
    s.page_size = 16;
    s.causal = true;
  });
  KvCacheCase one(base, rng);
  forward_kvcache(one.args());
  const std::vector<double> out1 = one.out.to_double(), lse1 = one.lse.to_double();
  for (int splits : {0, 2, 3, 5, 17, 64, 128}) {
    one.out.poison();  // same inputs (nothing is appended), fresh outputs
    one.lse.poison();
    KvCacheArgs a = one.args();
    a.num_splits = splits;
    forward_kvcache(a);
    const std::vector<double> out = one.out.to_double(), lse = one.lse.to_double();
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], out1[i], 1e-5 * (1.0 + std::abs(out1[i]))) << splits;
    for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], lse1[i], 1e-5 * (1.0 + std::abs(lse1[i]))) << splits;
  }
}

// Packed queries (cu_seqlens_q): counts from 0 to seqlen_q in one batch, two rows after the last segment, masks
// aligned to each sequence's own count, against the dense call's reference for the same (last) query positions.
TEST(KvCache, PackedQueries) {
  const KvCaseSpec specs[] = {
      with(spec(6, 4, 8, 2, {17, 300, 1, 64, 0, 129}), [](KvCaseSpec& s) { s.causal = true; }),
      with(spec(5, 3, 8, 1, {40, 1000, 9, 3, 70}, DType::kFloat16), [](KvCaseSpec& s) {
        s.page_size = 16;
        s.causal = true;
        s.window_left = 20;
        s.sink = true;
        s.num_splits = 3;
      }),
      with(spec(4, 16, 4, 4, {50, 16, 300, 1}), [](KvCaseSpec& s) {
        s.page_size = 64;
        s.softcap = 20.0f;
      }),
      with(spec(3, 5, 6, 2, {33, 7, 90}, DType::kFloat32), [](KvCaseSpec& s) {
        s.cache_batch_idx = true;
        s.causal = true;
      }),
  };
  for (const KvCaseSpec& sp : specs) {
    SCOPED_TRACE(sp.name());
    FLASH4_TEST_RNG(rng);
    KvCacheCase c(sp, rng);
    forward_kvcache(c.args());
    PackedQueries packed(c, mixed_counts(sp.batch, sp.seqlen_q), 2);
    KvCacheArgs a = c.args();
    packed.apply(a);
    ASSERT_TRUE(can_implement(a).ok);
    forward_kvcache(a);
    EXPECT_TRUE(packed.scatter_into(c));
    EXPECT_TRUE(check_kvcache(c));
  }
}

// Packed queries over no head (q, out (total_q, 0, d), which may have no data): nothing to compute, no pointer
// formed from a null base (the fuzzer's finding, replayed under the sanitizer preset).
TEST(KvCache, PackedQueriesWithoutHeads) {
  std::vector<float> cache(3 * 2 * 1 * 16, 1.0f);
  std::vector<int> cu = {0, 5, 8}, lengths = {2, 1};
  KvCacheArgs a;
  a.q = make_view(nullptr, DType::kFloat32, Device::cpu(), 8, 0, 16);
  a.out = make_view(nullptr, DType::kFloat32, Device::cpu(), 8, 0, 16);
  a.k_cache = a.v_cache = make_view(cache.data(), DType::kFloat32, Device::cpu(), 3, 2, 1, 16);
  a.cache_seqlens = make_view(lengths.data(), DType::kInt32, Device::cpu(), 2);
  a.cu_seqlens_q = make_view(cu.data(), DType::kInt32, Device::cpu(), 3);
  a.max_seqlen_q = 5;
  ASSERT_TRUE(can_implement(a).ok) << can_implement(a).reason;
  forward_kvcache(a);
}

}  // namespace
}  // namespace flash4::test
