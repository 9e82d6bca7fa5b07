// KV-cache attention on the GPU: the shared policy headers (paged keys with clamping, split ranges, LSE combine,
// rotary) give on the device what they give on the host; the decode kernels (src/kernels/sm90/decode) against the
// fp64 model of tests/common/kvcache_case.h (decode, speculative and chunked queries, GQA / MQA, odd and mixed
// cache lengths, append with rotary, masks, sink), paged vs contiguous bit for bit, append-then-attend vs attend,
// split counts 1..64, clamped device-resident indices, CUDA-graph capture, and the dense forward's decode route.
#include <cstdio>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/kvcache_case.h"
#include "common/kvcache_problem.h"
#include "common/lse_combine.h"
#include "common/rotary.h"
#include "common/split_kv.h"
#include "flash4/kvcache.h"
#include "kvcache_device.h"

namespace flash4::test {
namespace {

constexpr int kValues = 12;

// Every policy answer the kernels will need, for sequence b: written to out[0 .. kValues).
__host__ __device__ void policy_values(const detail::KvCacheProblem& p, int64_t b, const float* lse, float* out) {
  const detail::PagedKeys keys = p.keys(b);
  const detail::CacheRow first = keys.at(0), last = keys.at(p.capacity - 1);
  int64_t lo = 0, hi = -1;
  detail::split_keys(3, p.seqlen_k(b) - 1, 64, 5, 2, lo, hi);
  const float m = detail::combined_lse(lse, 3, 1, true, 0.25f);
  float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const float c[2] = {0.5f, -0.25f}, s[2] = {0.75f, 0.125f};
  detail::apply_rotary(x, c, s, 4, b % 2 == 0);
  const float values[kValues] = {float(p.cache_length(b)),
                                 float(first.slot),
                                 float(first.row),
                                 float(last.slot),
                                 float(last.row),
                                 float(lo),
                                 float(hi),
                                 m,
                                 detail::combine_weight(lse[1], m),
                                 x[0],
                                 x[3],
                                 float(p.rotary_row(p.seqlen_k(b)))};
  for (int i = 0; i < kValues; ++i) out[i] = values[i];
}

__global__ void policy_kernel(detail::KvCacheProblem p, const float* lse, float* out) {
  policy_values(p, blockIdx.x, lse, out + blockIdx.x * kValues);
}

// Device-resident index values out of range (negative lengths, lengths past the cache, pages past the pool) are
// clamped on the device exactly as on the host.
TEST(KvCacheGpu, PolicyOnDeviceMatchesHost) {
  FLASH4_REQUIRE_GPU();
  const int batch = 3;
  std::vector<int> seqlens = {-5, 40, 1000}, table = {2, 7, 1, 3, 0, -4, 9, 100, 6};
  const std::vector<float> lse = {1.5f, -INFINITY, 0.5f};
  detail::KvCacheProblem p;
  p.attention.batch = batch;
  p.paged = true;
  p.num_slots = 8;
  p.page_size = 16;
  p.max_pages = 3;
  p.capacity = 48;
  p.seqlen_new = 2;
  p.block_table_stride = 3;
  p.seqlen_ro = 30;
  int *d_seqlens = nullptr, *d_table = nullptr;
  float *d_lse = nullptr, *d_out = nullptr;
  FLASH4_TEST_CUDA(cudaMalloc(&d_seqlens, seqlens.size() * sizeof(int)));
  FLASH4_TEST_CUDA(cudaMalloc(&d_table, table.size() * sizeof(int)));
  FLASH4_TEST_CUDA(cudaMalloc(&d_lse, lse.size() * sizeof(float)));
  FLASH4_TEST_CUDA(cudaMalloc(&d_out, batch * kValues * sizeof(float)));
  FLASH4_TEST_CUDA(cudaMemcpy(d_seqlens, seqlens.data(), seqlens.size() * sizeof(int), cudaMemcpyHostToDevice));
  FLASH4_TEST_CUDA(cudaMemcpy(d_table, table.data(), table.size() * sizeof(int), cudaMemcpyHostToDevice));
  FLASH4_TEST_CUDA(cudaMemcpy(d_lse, lse.data(), lse.size() * sizeof(float), cudaMemcpyHostToDevice));
  detail::KvCacheProblem on_device = p;
  on_device.cache_seqlens = d_seqlens;
  on_device.block_table = d_table;
  policy_kernel<<<batch, 1>>>(on_device, d_lse, d_out);
  FLASH4_TEST_CUDA(cudaGetLastError());
  std::vector<float> device(batch * kValues);
  FLASH4_TEST_CUDA(cudaMemcpy(device.data(), d_out, device.size() * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(d_seqlens);
  cudaFree(d_table);
  cudaFree(d_lse);
  cudaFree(d_out);

  detail::KvCacheProblem on_host = p;
  on_host.cache_seqlens = seqlens.data();
  on_host.block_table = table.data();
  for (int b = 0; b < batch; ++b) {
    float host[kValues];
    policy_values(on_host, b, lse.data(), host);
    for (int i = 0; i < kValues; ++i)
      EXPECT_NEAR(device[b * kValues + i], host[i], 1e-6f * (1.0f + std::abs(host[i])))
          << "sequence " << b << " value " << i;
    EXPECT_GE(host[0], 0.0f);  // cache length clamped to [0, capacity - seqlen_new]
    EXPECT_LE(host[0], 46.0f);
    EXPECT_TRUE(host[1] >= 0 && host[1] < 8);  // pages clamped into the pool
    EXPECT_TRUE(host[3] >= 0 && host[3] < 8);
  }
}

// Runs `spec` on the GPU and checks the caches and out / lse against the fp64 model. Head dims or dtypes this
// build did not compile are skipped with the reason.
void run_case(const KvCaseSpec& spec) {
  SCOPED_TRACE(spec.name());
  std::printf("[ case     ] %s\n", spec.name().c_str());  // names the case a hang or crash stopped in
  std::fflush(stdout);
  FLASH4_TEST_RNG(rng);
  KvCacheCase c(spec, rng);
  DeviceKvCall call(c);
  ASSERT_TRUE(call.ok());
  const Support s = can_implement(call.args);
  if (!s.ok && s.reason.find("not compiled") != std::string::npos) return;
  ASSERT_TRUE(s.ok) << s.reason;
  FLASH4_TEST_CUDA(call.run());
  EXPECT_TRUE(check_kvcache(c));
}

// One query token: GQA 8:1, 4:1 and MQA, every head dim, both dtypes, odd and mixed lengths in one batch
// (0: no key, out 0 and lse -inf).
TEST(KvCacheGpu, Decode) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256})
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      run_case(gpu_kv_spec(4, 1, 8, 1, {0, 1, 17, 1000}, d, dtype));  // GQA 8:1
      run_case(gpu_kv_spec(2, 1, 8, 2, {4097, 333}, d, dtype));
      run_case(gpu_kv_spec(1, 1, 6, 1, {2500}, d, dtype));            // MQA
    }
  run_case(gpu_kv_spec(1, 1, 8, 8, {100003}));                        // a long cache, automatic splits
  run_case(with(gpu_kv_spec(3, 1, 32, 8, {1000, 17, 4097}), [](KvCaseSpec& s) { s.page_size = 16; }));
}

// flash-attn's cache_leftpad (tests/cpu/test_kvcache.cpp): the padding rows hold NaN, the append writes at
// cache_seqlens, rotary angles at the rows; split and unsplit, 16- and 64-row tiles.
TEST(KvCacheGpu, LeftPad) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128}) {
    run_case(with(gpu_kv_spec(3, 1, 32, 8, {4000, 7, 300}, d), [](KvCaseSpec& s) {
      s.leftpad = {1500, 0, 299};
      s.cache_batch_idx = true;
      s.causal = true;
      s.num_splits = 0;
    }));
    run_case(with(gpu_kv_spec(3, 4, 16, 1, {40, 7, 3000}, d), [](KvCaseSpec& s) {
      s.leftpad = {39, 7, 100};
      s.seqlen_new = 3;
      s.rotary = Rotary::kNeox;
      s.sink = true;
      s.causal = true;
    }));
  }
}

TEST(KvCacheGpu, DecodeGrid) {
  FLASH4_REQUIRE_GPU();
  for (const KvCaseSpec& s : decode_grid()) run_case(s);
}

// Speculative decoding (2..16 queries, causal bottom-right) and a chunk of 512 queries against a 32k cache.
TEST(KvCacheGpu, SpeculativeAndChunked) {
  FLASH4_REQUIRE_GPU();
  for (int64_t sq : {2, 3, 5, 8, 16})
    run_case(with(gpu_kv_spec(2, sq, 8, 2, {sq == 2 ? 0 : 300, 1000}), [](KvCaseSpec& s) { s.causal = true; }));
  run_case(with(gpu_kv_spec(2, 4, 4, 4, {700, 9}), [](KvCaseSpec& s) { s.page_size = 64; }));  // not causal
  run_case(with(gpu_kv_spec(1, 512, 2, 1, {32768}, 64), [](KvCaseSpec& s) {
    s.causal = true;
    s.page_size = 256;
  }));
}

// The decode kernel above the route's bound (17-64 queries a sequence, up to 256 rows per KV head): a cache_leftpad
// of zeros keeps a call off the dense kernel, which is how a rule that knows the batch would send one long
// cache's speculative or chunked steps there (two to four 64-row tiles per KV head, the causal edge inside them).
TEST(KvCacheGpu, DecodeKernelAboveTheRouteBound) {
  FLASH4_REQUIRE_GPU();
  for (int64_t sq : {17, 24, 64})
    run_case(with(gpu_kv_spec(2, sq, 16, 4, {3000, sq == 64 ? 70 : 900}), [sq](KvCaseSpec& s) {
      s.leftpad = {0, 0};
      s.causal = true;
      s.num_splits = sq == 24 ? 3 : 0;
    }));
}

// Many query rows per KV head (chunked prefill: more than 16 queries or 128 rows per KV head) run the dense
// forward kernel over the cache (fwd_kvcache.h): contiguous (cache_batch_idx, a scalar length) and paged caches
// whose pages hold whole K/V tiles, pages of 16 / 64 (the decode kernel's), appends with rotary, masks, softcap
// and the sink, cache lengths 0 and 1, every head dim and both dtypes. The caches hold NaN past each sequence's
// keys, so a read of an unwritten row (or a P V over one) poisons the output.
TEST(KvCacheGpu, PrefillRunsTheDenseKernel) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256})
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      run_case(with(gpu_kv_spec(3, 77, 8, 2, {0, 1, 1000}, d, dtype), [](KvCaseSpec& s) { s.causal = true; }));
      run_case(with(gpu_kv_spec(2, 33, 4, 4, {4097, 129}, d, dtype), [](KvCaseSpec& s) { s.page_size = 256; }));
    }
  run_case(with(gpu_kv_spec(3, 200, 8, 1, {333, 0, 2048}), [](KvCaseSpec& s) {  // GQA 8:1, shuffled cache rows
    s.cache_batch_idx = true;
    s.seqlen_new = 45;
    s.rotary = Rotary::kNeox;
    s.causal = true;
  }));
  for (int64_t page : {16, 64, 128, 512})
    run_case(with(gpu_kv_spec(2, 130, 4, 2, {700, 9}), [&](KvCaseSpec& s) {
      s.page_size = page;
      s.seqlen_new = 17;
      s.rotary = Rotary::kInterleaved;
      s.window_left = 100;
      s.window_right = 0;
    }));
  run_case(with(gpu_kv_spec(2, 64, 8, 2, {300, 300}, 128, DType::kFloat16), [](KvCaseSpec& s) {
    s.scalar_length = true;
    s.softcap = 30.0f;
    s.sink = true;
    s.page_size = 128;
  }));
  run_case(with(gpu_kv_spec(2, 24, 4, 2, {0, 5}), [](KvCaseSpec& s) { s.sink = true; }));  // no key: lse = sink
}

// Head dims between the decode kernel's widths (64, 128, 256) on the next wider one, zero-padded: decode, splits
// forced, GQA, a paged cache with appends and rotary, the 64-row shape, the sink.
TEST(KvCacheGpu, PaddedHeadDims) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {8, 40, 96, 160, 192, 248}) {
    const DType dtype = d % 16 == 0 ? DType::kFloat16 : DType::kBFloat16;
    run_case(gpu_kv_spec(4, 1, 8, 2, {0, 1, 17, 1000}, d, dtype));
    run_case(with(gpu_kv_spec(2, 1, 8, 1, {4097, 333}, d, dtype), [](KvCaseSpec& s) { s.num_splits = 5; }));
    run_case(with(gpu_kv_spec(2, 4, 8, 2, {31, 1000}, d, dtype), [](KvCaseSpec& s) {
      s.page_size = 16;
      s.seqlen_new = 4;
      s.causal = true;
      s.rotary = Rotary::kNeox;
      s.sink = true;
    }));
    run_case(with(gpu_kv_spec(2, 8, 16, 2, {700, 9}, d, dtype), [](KvCaseSpec& s) { s.page_size = 64; }));  // 64 rows
  }
}

// Splits merged by the last CTA of each 16-row tile (decode_split_merge.cuh): split counts up to the limit (128)
// and without a power of two, rows per tile from 1 to 16 (GQA 1:1, 3:1, 16:1, two queries of 8:1), every head
// dim, the sink and the LSE, empty sequences; a single MQA sequence with the automatic count; and more tiles than
// the counter pool's slice. The 64-row tile keeps the combine kernel (SpeculativeAndChunked, PaddedHeadDims).
TEST(KvCacheGpu, LastSplitMerges) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256})
    for (int splits : {2, 7, 33, 128}) {
      run_case(with(gpu_kv_spec(3, 1, 8, 8, {5000, 0, 1777}, d), [&](KvCaseSpec& s) {  // 1 row per tile
        s.num_splits = splits;
        s.sink = true;
      }));
      run_case(with(gpu_kv_spec(2, 1, 6, 2, {4100, 300}, d, DType::kFloat16), [&](KvCaseSpec& s) {  // 3 rows
        s.num_splits = splits;
      }));
      run_case(with(gpu_kv_spec(1, 1, 16, 1, {9000}, d), [&](KvCaseSpec& s) {  // 16 rows
        s.num_splits = splits;
        s.sink = splits % 2 == 1;
      }));
      run_case(with(gpu_kv_spec(2, 2, 16, 2, {3000, 65}, d), [&](KvCaseSpec& s) {  // 2 queries x 8 heads, causal
        s.num_splits = splits;
        s.causal = true;
        s.page_size = 64;
      }));
    }
  run_case(gpu_kv_spec(1, 1, 4, 1, {100003}));  // automatic split count, one tile
  // More tiles than a pooled slice of counters (zero_counters.h): counters zeroed in the workspace.
  std::vector<int64_t> lengths(300);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = static_cast<int64_t>((i * 37) % 400);
  run_case(with(gpu_kv_spec(300, 1, 8, 4, lengths), [](KvCaseSpec& s) { s.num_splits = 3; }));
}

// Window, softcap and the learnable sink, contiguous (with cache_batch_idx and a scalar length) and paged.
TEST(KvCacheGpu, MasksSoftcapSink) {
  FLASH4_REQUIRE_GPU();
  run_case(with(gpu_kv_spec(2, 3, 8, 2, {600, 40}), [](KvCaseSpec& s) {
    s.window_left = 100;
    s.window_right = 0;
    s.page_size = 32;
  }));
  run_case(with(gpu_kv_spec(2, 1, 4, 1, {257, 1}), [](KvCaseSpec& s) {
    s.softcap = 20.0f;
    s.sink = true;
    s.cache_batch_idx = true;
  }));
  run_case(with(gpu_kv_spec(3, 2, 4, 2, {77, 77, 77}, 64, DType::kFloat16), [](KvCaseSpec& s) {
    s.scalar_length = true;
    s.sink = true;
    s.causal = true;
    s.num_splits = 4;
  }));
  run_case(with(gpu_kv_spec(2, 1, 4, 2, {0, 5}), [](KvCaseSpec& s) { s.sink = true; }));  // no key: lse = sink
}

// In-place append (contiguous and paged, page sizes 16 and 256) with rotary on the new keys and on q.
TEST(KvCacheGpu, AppendWithRotary) {
  FLASH4_REQUIRE_GPU();
  for (int64_t page : {0, 16, 256}) {
    run_case(with(gpu_kv_spec(3, 1, 8, 2, {15, 0, 300}), [&](KvCaseSpec& s) {
      s.page_size = page;
      s.seqlen_new = 1;
      s.rotary = Rotary::kInterleaved;
    }));
    run_case(with(gpu_kv_spec(2, 4, 4, 1, {31, 1000}), [&](KvCaseSpec& s) {
      s.page_size = page;
      s.seqlen_new = 4;
      s.causal = true;
      s.rotary = Rotary::kNeox;
      s.rotary_dim = 64;
    }));
  }
  run_case(with(gpu_kv_spec(2, 1, 4, 4, {20, 3}, 64), [](KvCaseSpec& s) {
    s.seqlen_new = 3;
    s.cache_batch_idx = true;
    s.rotary = Rotary::kInterleaved;
    s.rotary_dim = 32;
  }));
}
}  // namespace
}  // namespace flash4::test
