// Packed queries on the GPU (KvCacheArgs::cu_seqlens_q, device-resident): one batch mixing query counts from 0 to
// seqlen_q (up to 70: several row tiles) on the decode kernel, through its three ways out (direct stores with one
// split, the 16-row tile's last-CTA merge, the 64-row tile's combine kernel), contiguous and paged caches, masks
// per sequence, GQA, the sink; rows after the last segment cleared, and a batch of no sequence. Longer segments
// beside short ones: the dense kernel's share of the batch. Checked against the
// dense call's reference for the same (last) query positions (tests/common/kvcache_packed.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/kvcache_packed.h"
#include "kvcache_device.h"

namespace flash4::test {
namespace {

void run_packed(const KvCaseSpec& sp, int64_t extra_rows, std::vector<int64_t> counts = {}) {
  SCOPED_TRACE(sp.name());
  std::printf("[ case     ] %s\n", sp.name().c_str());
  std::fflush(stdout);
  FLASH4_TEST_RNG(rng);
  KvCacheCase c(sp, rng);
  DeviceKvCall dense(c);  // caches, index tensors and the dense call's outputs on the device
  ASSERT_TRUE(dense.ok());
  FLASH4_TEST_CUDA(dense.run());
  PackedQueries packed(c, counts.empty() ? mixed_counts(sp.batch, sp.seqlen_q) : counts, extra_rows);
  DeviceMirror q(packed.q), out(packed.out), lse(packed.lse), offsets(packed.cu_seqlens_q);
  ASSERT_TRUE(q.ok() && out.ok() && lse.ok() && offsets.ok());
  KvCacheArgs a = dense.args;
  packed.apply(a);
  a.q = q.view();
  a.out = out.view();
  a.lse = lse.view();
  a.cu_seqlens_q = offsets.view();
  const Support s = can_implement(a);
  ASSERT_TRUE(s.ok) << s.reason;
  forward_kvcache(a);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(out.download());
  FLASH4_TEST_CUDA(lse.download());
  EXPECT_TRUE(packed.scatter_into(c));
  EXPECT_TRUE(check_kvcache(c));
}

TEST(KvCacheGpuPacked, MixedQueryCounts) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256}) {
    // 16-row tiles (4 queries x 4 heads), paged, causal, the automatic split count (the last-CTA merge).
    run_packed(with(gpu_kv_spec(6, 4, 8, 2, {17, 300, 1, 64, 0, 5000}, d), [](KvCaseSpec& s) {
                 s.page_size = 16;
                 s.causal = true;
               }),
               3);
    // 64-row tiles (3 queries x 8 heads): the combine kernel; window and sink, fp16.
    run_packed(with(gpu_kv_spec(5, 3, 8, 1, {40, 1000, 9, 3, 4097}, d, DType::kFloat16), [](KvCaseSpec& s) {
                 s.causal = true;
                 s.window_left = 20;
                 s.sink = true;
                 s.num_splits = 3;
               }),
               2);
    // One split (direct stores), pages of 64, softcap, up to 16 queries without a mask.
    run_packed(with(gpu_kv_spec(4, 16, 4, 4, {50, 16, 300, 1}, d), [](KvCaseSpec& s) {
                 s.page_size = 64;
                 s.softcap = 20.0f;
                 s.num_splits = 1;
               }),
               0);
    // Shuffled cache rows (cache_batch_idx), GQA 3:1, seven splits merged by the last CTA.
    run_packed(with(gpu_kv_spec(3, 5, 6, 2, {33, 7, 900}, d), [](KvCaseSpec& s) {
                 s.cache_batch_idx = true;
                 s.causal = true;
                 s.num_splits = 7;
               }),
               1);
    // Chunks longer than a 64-row tile (70 queries x 2 heads: three row tiles) beside short ones, all on the
    // decode kernel: pages of 16 hold no dense K/V tile.
    run_packed(with(gpu_kv_spec(3, 70, 4, 2, {100, 5, 2000}, d), [](KvCaseSpec& s) {
                 s.causal = true;
                 s.page_size = 16;
               }),
               2, {70, 5, 33});
  }
}

// Prefill chunks beside decode steps: segments longer than the decode kernel's (16 queries, 128 rows per KV head)
// run on the dense kernel in a second launch over the same device offsets, each kernel leaving the other's
// sequences alone; one query past the bound (17), empty segments, rows after the last segment.
TEST(KvCacheGpuPacked, PrefillChunksBesideDecodeSteps) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256}) {
    // GQA 4:1 (16 queries a decode segment), pages of 256, causal.
    run_packed(with(gpu_kv_spec(6, 300, 8, 2, {17, 3000, 1, 640, 0, 5000}, d), [](KvCaseSpec& s) {
                 s.page_size = 256;
                 s.causal = true;
               }),
               3, {300, 1, 4, 129, 0, 17});
    // MHA, contiguous, window, softcap and sink, fp16: 16 queries decoded, 17 dense.
    run_packed(with(gpu_kv_spec(4, 200, 4, 4, {700, 16, 2048, 90}, d, DType::kFloat16), [](KvCaseSpec& s) {
                 s.causal = true;
                 s.window_left = 50;
                 s.softcap = 15.0f;
                 s.sink = true;
               }),
               1, {16, 17, 200, 3});
    // 32 query heads on one KV head: 4 queries a decode segment (128 rows), 5 dense; shuffled cache rows.
    run_packed(with(gpu_kv_spec(4, 40, 32, 1, {500, 64, 1500, 33}, d), [](KvCaseSpec& s) {
                 s.cache_batch_idx = true;
                 s.causal = true;
               }),
               0, {4, 5, 40, 1});
  }
  // 256 query heads on one KV head: not even one query's rows fit a decode tile, so every segment is dense and
  // the rows in no segment are cleared by the clearing kernel.
  run_packed(with(gpu_kv_spec(2, 20, 256, 1, {300, 40}, 64), [](KvCaseSpec& s) { s.causal = true; }), 2, {2, 20});
}

// A long batch of decode and verify steps (1-4 queries): 300 sequences, many CTAs past their rows.
TEST(KvCacheGpuPacked, ManySequences) {
  FLASH4_REQUIRE_GPU();
  std::vector<int64_t> lengths(300);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = 1 + (i * 37) % 700;
  run_packed(with(gpu_kv_spec(300, 4, 8, 2, lengths, 128), [](KvCaseSpec& s) {
               s.page_size = 16;
               s.causal = true;
             }),
             5);
}

// No sequence at all (cu_seqlens_q = [0]) but rows in q: no attention launch, every row 0 / -inf.
TEST(KvCacheGpuPacked, NoSequences) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  HostTensor q(DType::kBFloat16, 1, 3, 4, 64), out(DType::kBFloat16, 1, 3, 4, 64), lse = HostTensor::lse(1, 4, 3);
  for (HostTensor* t : {&q, &out, &lse}) t->drop_leading_dim();
  HostTensor cache(DType::kBFloat16, 2, 16, 2, 64), offsets = HostTensor::vector(DType::kInt32, 1);
  q.fill_normal(rng);
  cache.fill_normal(rng);
  static_cast<int32_t*>(offsets.data())[0] = 0;
  out.poison();
  lse.poison();
  DeviceMirror dq(q), dout(out), dlse(lse), dk(cache), dv(cache), dcu(offsets);
  ASSERT_TRUE(dq.ok() && dout.ok() && dlse.ok() && dk.ok() && dv.ok() && dcu.ok());
  KvCacheArgs a;
  a.q = dq.view();
  a.k_cache = dk.view();
  a.v_cache = dv.view();
  a.out = dout.view();
  a.lse = dlse.view();
  a.cu_seqlens_q = dcu.view();
  a.max_seqlen_q = 1;
  forward_kvcache(a);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dout.download());
  FLASH4_TEST_CUDA(dlse.download());
  for (double x : out.to_double()) EXPECT_EQ(x, 0.0);
  for (double x : lse.to_double()) EXPECT_TRUE(std::isinf(x) && x < 0);
}

}  // namespace
}  // namespace flash4::test
