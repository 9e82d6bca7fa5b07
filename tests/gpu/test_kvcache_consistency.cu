// The GPU KV-cache path against itself: a paged cache (shuffled pages) and a contiguous one holding the same keys
// give the same bits; appending then attending gives the bits of attending over the concatenated cache; split
// counts 1..64 agree within the rounding of P per split; out-of-range device-resident indices are clamped (no
// fault); a decode step replays from a CUDA graph with the bits of a direct call, replay after replay.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/kvcache_case.h"
#include "flash4/kvcache.h"
#include "kvcache_device.h"

namespace flash4::test {
namespace {

KvCaseSpec base_spec() {
  KvCaseSpec s;
  s.batch = 3;
  s.seqlen_q = 2;
  s.heads = 8;
  s.heads_kv = 2;
  s.head_dim = 128;
  s.cache_lengths = {1000, 17, 4097};
  s.causal = true;
  s.num_splits = 3;
  return s;
}

// Equal bit for bit (as doubles; NaN equals NaN).
::testing::AssertionResult same_bits(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))))
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

// A contiguous cache holding the keys of the paged case `p` (NaN elsewhere): (batch, max length + 3, hkv, d).
void copy_keys_contiguous(const KvCacheCase& p, KvCacheCase& c) {
  const KvCaseSpec& s = p.spec;
  const int64_t rows = c.k_cache.view().shape[1], hkv = s.heads_kv, d = s.head_dim;
  const std::vector<double> pk = p.k_cache.to_double(), pv = p.v_cache.to_double();
  std::vector<double> ck(static_cast<size_t>(c.k_cache.numel()), NAN), cv(ck.size(), NAN);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.cache_lengths[b]; ++j) {
      const int64_t page = p.block_table[b * p.max_pages + j / s.page_size], row = j % s.page_size;
      for (int64_t x = 0; x < hkv * d; ++x) {
        ck[(b * rows + j) * hkv * d + x] = pk[(page * s.page_size + row) * hkv * d + x];
        cv[(b * rows + j) * hkv * d + x] = pv[(page * s.page_size + row) * hkv * d + x];
      }
    }
  c.k_cache.assign(ck);
  c.v_cache.assign(cv);
  c.q.assign(p.q.to_double());
}

// Variants of base_spec for the paged-vs-contiguous comparison: as is (about 21 blocks per split); one split
// (65 blocks of 64 keys: the page lookahead's window moves on twice, decode_pages.cuh); a window whose first key
// is not a multiple of 16, so the warps' key slices straddle pages of 16.
KvCaseSpec consistency_spec(int variant) {
  KvCaseSpec s = base_spec();
  if (variant == 1) s.num_splits = 1;
  if (variant == 2) {
    s.seqlen_q = 1;
    s.window_left = 1001;
    s.num_splits = 2;
  }
  return s;
}

TEST(KvCacheGpuConsistency, PagedBitIdenticalToContiguous) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  for (int variant : {0, 1, 2})
    for (int64_t page : {16, 64, 256}) {
      KvCaseSpec ps = consistency_spec(variant);
      ps.page_size = page;
      KvCacheCase paged(ps, rng), contiguous(consistency_spec(variant), rng);
      copy_keys_contiguous(paged, contiguous);
      DeviceKvCall a(paged), b(contiguous);
      ASSERT_TRUE(a.ok() && b.ok());
      FLASH4_TEST_CUDA(a.run());
      FLASH4_TEST_CUDA(b.run());
      EXPECT_TRUE(same_bits(paged.out.to_double(), contiguous.out.to_double(), "out"))
          << "variant " << variant << ", page " << page;
      EXPECT_TRUE(same_bits(paged.lse.to_double(), contiguous.lse.to_double(), "lse"))
          << "variant " << variant << ", page " << page;
      EXPECT_TRUE(check_kvcache(paged));
    }
}

TEST(KvCacheGpuConsistency, AppendThenAttendEqualsAttendOverConcatenation) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  for (int64_t page : {0, 16}) {
    KvCaseSpec s = base_spec();
    s.page_size = page;
    s.seqlen_new = 5;
    s.seqlen_q = 5;
    KvCacheCase c(s, rng);
    DeviceKvCall append(c);
    ASSERT_TRUE(append.ok());
    FLASH4_TEST_CUDA(append.run());
    EXPECT_TRUE(check_kvcache(c));
    const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
    // The same call over the caches the append left, without new keys: every sequence 5 keys longer.
    for (int32_t& n : c.cache_seqlens) n += 5;
    c.out.poison();
    DeviceKvCall attend(c);
    ASSERT_TRUE(attend.ok());
    attend.args.k = attend.args.v = TensorView{};
    FLASH4_TEST_CUDA(attend.run());
    EXPECT_TRUE(same_bits(out, c.out.to_double(), "out")) << "page " << page;
    EXPECT_TRUE(same_bits(lse, c.lse.to_double(), "lse")) << "page " << page;
  }
}

TEST(KvCacheGpuConsistency, SplitCountsAgree) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  KvCaseSpec s = base_spec();
  s.page_size = 16;
  s.sink = true;
  KvCacheCase c(s, rng);
  DeviceKvCall call(c);
  ASSERT_TRUE(call.ok());
  call.args.num_splits = 1;
  FLASH4_TEST_CUDA(call.run());
  EXPECT_TRUE(check_kvcache(c));
  const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
  // Each split rounds its P = exp(s - m_split) to bf16 against its own running max, so two split counts differ by
  // up to two P roundings (2^-8 relative each p) of sum(p |v|) / l <= max |v|, plus one rounding of the bf16 out.
  double max_v = 0.0;
  for (double x : c.v_cache.to_double()) max_v = std::max(max_v, std::abs(x));
  for (int splits = 2; splits <= 64; ++splits) {
    call.args.num_splits = splits;
    FLASH4_TEST_CUDA(call.run());
    ASSERT_TRUE(check_kvcache(c)) << "splits " << splits;  // the fp64 reference judges every split count
    const std::vector<double> o = c.out.to_double(), l = c.lse.to_double();
    for (size_t i = 0; i < o.size(); ++i)
      ASSERT_LE(std::abs(o[i] - out[i]), 0x1p-7 * std::abs(out[i]) + 0x1p-8 * max_v)
          << "splits " << splits << " out " << i;
    for (size_t i = 0; i < l.size(); ++i)
      ASSERT_LE(std::abs(l[i] - lse[i]), 1e-5 * (1.0 + std::abs(lse[i]))) << "splits " << splits << " lse " << i;
  }
}

// Device-resident lengths, cache rows and pages out of range: clamped, so the call neither faults nor writes
// outside the caches (compute-sanitizer's memcheck runs this test in the device check's sanitize stage).
TEST(KvCacheGpuConsistency, OutOfRangeDeviceIndicesClamped) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  for (int64_t page : {0, 16}) {
    KvCaseSpec s = base_spec();
    s.page_size = page;
    s.seqlen_new = 2;
    s.rotary = Rotary::kInterleaved;
    s.cache_batch_idx = page == 0;
    KvCacheCase c(s, rng);
    DeviceKvCall call(c);
    ASSERT_TRUE(call.ok());
    FLASH4_TEST_CUDA(call.set_index(call.args.cache_seqlens, {-7, 1 << 30, 5}));
    if (page == 0) {
      FLASH4_TEST_CUDA(call.set_index(call.args.cache_batch_idx, {-3, 99, 1}));
    } else {
      std::vector<int32_t> table(c.block_table.size());
      for (size_t i = 0; i < table.size(); ++i) table[i] = i % 3 == 0 ? -1 : i % 3 == 1 ? (1 << 30) : int32_t(i);
      FLASH4_TEST_CUDA(call.set_index(call.args.block_table, table));
    }
    forward_kvcache(call.args);
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    FLASH4_TEST_CUDA(cudaGetLastError());
  }
}

// A decode step (append with rotary, several splits and their merge) captured in a CUDA graph: no host
// synchronisation inside, and every replay writes what a direct call writes.
TEST(KvCacheGpuConsistency, CudaGraphCapture) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  KvCaseSpec s = base_spec();
  s.page_size = 16;
  s.seqlen_new = 1;
  s.seqlen_q = 1;
  s.rotary = Rotary::kInterleaved;
  s.num_splits = 0;
  KvCacheCase c(s, rng);
  DeviceKvCall call(c);
  ASSERT_TRUE(call.ok());
  FLASH4_TEST_CUDA(call.run());
  const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
  cudaStream_t stream;
  FLASH4_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  FLASH4_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  forward_kvcache(call.args, stream);  // the same append again: same positions, same values
  FLASH4_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  FLASH4_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {  // the split merge's counters are left zero for the next replay
    FLASH4_TEST_CUDA(cudaMemset(const_cast<void*>(call.args.out.data), 0xff, c.out.storage_bytes()));
    FLASH4_TEST_CUDA(cudaGraphLaunch(exec, stream));
    FLASH4_TEST_CUDA(cudaStreamSynchronize(stream));
    FLASH4_TEST_CUDA(call.download());
    EXPECT_TRUE(same_bits(out, c.out.to_double(), "out")) << "replay " << replay;
    EXPECT_TRUE(same_bits(lse, c.lse.to_double(), "lse")) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace flash4::test
