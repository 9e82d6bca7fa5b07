// Packed queries on the GPU (KvCacheArgs::cu_seqlens_q, device-resident): one batch mixing query counts from 0 to
// seqlen_q on the decode kernel, through its three ways out (direct stores with one split, the 16-row tile's
// last-CTA merge, the 64-row tile's combine kernel), contiguous and paged caches, masks per sequence, GQA, the
// sink; rows after the last segment cleared. Checked against the dense call's reference for the same (last) query
// positions (tests/common/kvcache_packed.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "common/kvcache_packed.h"
#include "kvcache_device.h"

namespace flash4::test {
namespace {

void run_packed(const KvCaseSpec& sp, int64_t extra_rows) {
  SCOPED_TRACE(sp.name());
  std::printf("[ case     ] %s\n", sp.name().c_str());
  std::fflush(stdout);
  FLASH4_TEST_RNG(rng);
  KvCacheCase c(sp, rng);
  DeviceKvCall dense(c);  // caches, index tensors and the dense call's outputs on the device
  ASSERT_TRUE(dense.ok());
  FLASH4_TEST_CUDA(dense.run());
  PackedQueries packed(c, mixed_counts(sp.batch, sp.seqlen_q), extra_rows);
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
  }
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

}  // namespace
}  // namespace flash4::test
