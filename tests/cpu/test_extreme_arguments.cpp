// Legal arguments at the edges of their ranges, which validation accepts and the CPU path must handle without
// undefined behaviour or work that grows with a bound rather than with the data: the rank of an absent optional
// tensor, a packed batch whose max_seqlen is far above its longest segment, a query without heads whose
// sequences are long, and a KV-cache call that asks for far more splits than its keys have blocks.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/varlen_case.h"
#include "flash4/api.h"
#include "flash4/kvcache.h"

namespace flash4::test {
namespace {

TEST(ExtremeArguments, NumelReadsAtMostFourSizes) {
  TensorView t;
  t.shape[0] = 2, t.shape[1] = 3, t.shape[2] = 4, t.shape[3] = 5;
  t.rank = 5;  // invalid: validation refuses it where the tensor is used, but numel() must not read past shape
  EXPECT_EQ(t.numel(), 120);
  t.rank = -1;
  EXPECT_EQ(t.numel(), 1);
}

// An absent dsink is not validated, so its rank may be anything; the backward with no output elements must
// still only look at its four sizes.
TEST(ExtremeArguments, BackwardIgnoresAnAbsentDsinkOfAnyRank) {
  std::vector<uint16_t> storage(64);
  std::vector<float> sink(2, 0.5f), lse(1);
  const auto empty = [&](int64_t heads) {
    return make_view(storage.data(), DType::kBFloat16, Device::cpu(), 2, 0, heads, 8);
  };
  BackwardArgs a;
  a.q = a.out = a.dout = a.dq = empty(2);
  a.k = a.v = a.dk = a.dv = empty(1);
  a.dq.data = storage.data() + 16;
  a.dk.data = storage.data() + 32;
  a.dv.data = storage.data() + 48;
  a.lse = make_view(lse.data(), DType::kFloat32, Device::cpu(), 2, 2, 0);
  a.learnable_sink = make_view(sink.data(), DType::kFloat32, Device::cpu(), 2);
  for (const int rank : {5, 100, -1}) {
    a.dsink = TensorView{};
    a.dsink.rank = rank;
    EXPECT_NO_THROW(backward(a)) << "dsink.rank = " << rank;
  }
  for (uint16_t x : storage) EXPECT_EQ(x, 0);
}

// Peak resident memory of this process so far, in KiB (ctest runs each test in a process of its own).
int64_t peak_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// The backward of a q without heads (so without elements) whose sequences are long, with seqused_q: dq has no
// rows to zero, so no map of its rows is built (it took seqlen_q bytes: 1 GB at 2^30, bad_alloc at 2^40).
TEST(ExtremeArguments, BackwardOfAnEmptyQueryBuildsNoRowMap) {
  std::vector<uint16_t> empty(8), k(5 * 8, 0x3f80), dkv(2 * 5 * 8, 0xffff);
  std::vector<float> lse(1);
  std::vector<int32_t> seqused = {1};
  const int64_t seqlen_q = int64_t{1} << 27;  // a 128 MiB row map if it were built
  BackwardArgs a;
  a.q = a.out = a.dout = make_view(empty.data(), DType::kBFloat16, Device::cpu(), 1, seqlen_q, 0, 8);
  a.dq = make_view(empty.data() + 4, DType::kBFloat16, Device::cpu(), 1, seqlen_q, 0, 8);
  a.k = a.v = make_view(k.data(), DType::kBFloat16, Device::cpu(), 1, 5, 1, 8);
  a.dk = make_view(dkv.data(), DType::kBFloat16, Device::cpu(), 1, 5, 1, 8);
  a.dv = make_view(dkv.data() + 40, DType::kBFloat16, Device::cpu(), 1, 5, 1, 8);
  a.lse = make_view(lse.data(), DType::kFloat32, Device::cpu(), 1, 0, seqlen_q);
  a.seqused_q = make_view(seqused.data(), DType::kInt32, Device::cpu(), 1);
  const int64_t before = peak_rss_kib();
  backward(a);
  EXPECT_LT(peak_rss_kib() - before, 32 * 1024) << "KiB of peak memory grew";
  for (uint16_t x : dkv) EXPECT_EQ(x, 0) << "no query sees a key: dK = dV = 0";
}

// num_splits far above the key blocks of the longest sequence (128 against 2 blocks of 100 cached keys, 512
// queries): the splits beyond the blocks would be empty, so the call runs with as many as there are blocks,
// gives the bits of num_splits = 2, and allocates no partials for the empty ones (134 MB here before).
TEST(ExtremeArguments, KvCacheSplitsBeyondTheKeyBlocksCostNothing) {
  const int64_t seqlen_q = 512, heads = 8, d = 64, rows = 256;
  std::vector<float> q(static_cast<size_t>(seqlen_q * heads * d)), cache(static_cast<size_t>(2 * rows * heads * d));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 7919) % 17) / 17.0f - 0.5f;
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<float>((i * 104729) % 23) / 23.0f - 0.5f;
  std::vector<float> out_two(q.size()), out_many(q.size());
  KvCacheArgs a;
  a.q = make_view(q.data(), DType::kFloat32, Device::cpu(), 1, seqlen_q, heads, d);
  a.k_cache = make_view(cache.data(), DType::kFloat32, Device::cpu(), 1, rows, heads, d);
  a.v_cache = make_view(cache.data() + rows * heads * d, DType::kFloat32, Device::cpu(), 1, rows, heads, d);
  a.cache_seqlen = 100;
  a.num_splits = 2;
  a.out = make_view(out_two.data(), DType::kFloat32, Device::cpu(), 1, seqlen_q, heads, d);
  forward_kvcache(a);
  a.num_splits = 128;
  a.out = make_view(out_many.data(), DType::kFloat32, Device::cpu(), 1, seqlen_q, heads, d);
  const int64_t before = peak_rss_kib();
  forward_kvcache(a);
  EXPECT_LT(peak_rss_kib() - before, 64 * 1024) << "KiB of peak memory grew";
  EXPECT_EQ(std::memcmp(out_two.data(), out_many.data(), out_two.size() * sizeof(float)), 0);
}

// max_seqlen_q / k only have to bound the segments: at 2^31 - 1 for segments of a few tokens the CPU path gives
// the same bits as with the tight bound, in the time of the segments (sized by max_seqlen, the tasks of one head
// numbered 2^25, and the call took minutes).
TEST(ExtremeArguments, LooseMaxSeqlenCostsNoMoreThanTheSegments) {
  FLASH4_TEST_RNG(rng);
  VarlenSpec s;
  s.seqlens_q = {3, 0, 70};
  s.seqlens_k = {5, 2, 66};
  s.heads = 2;
  s.heads_kv = 1;
  s.head_dim = 16;
  s.causal = true;
  s.sink = true;
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  const std::vector<HostTensor*> written = {&t.out, &t.lse, &*t.dq, &*t.dk, &*t.dv, &*t.dsink};
  const auto outputs = [&] {
    std::vector<std::vector<double>> all;
    for (const HostTensor* h : written) all.push_back(h->to_double());
    return all;
  };
  forward(t.forward_args(s));
  backward(t.backward_args(s));
  const std::vector<std::vector<double>> tight = outputs();
  for (HostTensor* h : written) h->poison();

  const auto start = std::chrono::steady_clock::now();
  ForwardArgs f = t.forward_args(s);
  BackwardArgs b = t.backward_args(s);
  f.max_seqlen_q = f.max_seqlen_k = b.max_seqlen_q = b.max_seqlen_k = std::numeric_limits<int32_t>::max();
  forward(f);
  backward(b);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<std::vector<double>> loose = outputs();
  ASSERT_EQ(loose.size(), tight.size());
  for (size_t i = 0; i < tight.size(); ++i) {
    ASSERT_EQ(loose[i].size(), tight[i].size());
    for (size_t j = 0; j < tight[i].size(); ++j)
      ASSERT_EQ(std::memcmp(&loose[i][j], &tight[i][j], sizeof(double)), 0) << "output " << i << ", element " << j;
  }
  EXPECT_LT(seconds, 10.0);  // milliseconds in practice, sanitizers included
}

}  // namespace
}  // namespace flash4::test
