// KV-cache attention on the GPU: the shared policy headers (paged keys with clamping, split ranges, LSE combine,
// rotary) give on the device what they give on the host, and the GPU path refuses KV-cache calls clearly (no
// kernel yet) without writing anything.
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
#include "device_mirror.h"
#include "flash4/kvcache.h"

namespace flash4::test {
namespace {

#define FLASH4_REQUIRE_GPU() \
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU"

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

// The one GPU gate: CUDA tensors are refused with the reason, and neither the outputs nor the caches change.
TEST(KvCacheGpu, RefusedClearlyAndNothingWritten) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  KvCaseSpec spec;
  spec.batch = 2;
  spec.heads = 4;
  spec.heads_kv = 2;
  spec.cache_lengths = {20, 3};
  spec.seqlen_new = 1;
  spec.page_size = 16;
  KvCacheCase c(spec, rng);
  DeviceMirror q(c.q), k_cache(c.k_cache), v_cache(c.v_cache), k(c.k), v(c.v), out(c.out), lse(c.lse);
  HostTensor seqlens = HostTensor::vector(DType::kInt32, 2), table = HostTensor::vector(DType::kInt32, 2 * c.max_pages);
  std::memcpy(seqlens.data(), c.cache_seqlens.data(), 2 * sizeof(int));
  std::memcpy(table.data(), c.block_table.data(), c.block_table.size() * sizeof(int));
  DeviceMirror d_seqlens(seqlens), d_table(table);
  ASSERT_TRUE(q.ok() && k_cache.ok() && v_cache.ok() && out.ok() && lse.ok() && d_seqlens.ok() && d_table.ok());
  KvCacheArgs a = c.args();
  a.q = q.view();
  a.k_cache = k_cache.view();
  a.v_cache = v_cache.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.cache_seqlens = d_seqlens.view();
  a.block_table = d_table.view();
  a.block_table.rank = 2;
  a.block_table.shape[0] = 2;
  a.block_table.shape[1] = c.max_pages;
  a.block_table.stride[0] = c.max_pages;
  a.block_table.stride[1] = 1;
  const Support s = can_implement(a);
  EXPECT_FALSE(s.ok);
  EXPECT_EQ(s.reason, "KV-cache attention is not yet implemented on the GPU path");
  try {
    forward_kvcache(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported) << e.what();
  }
  FLASH4_TEST_CUDA(out.download());
  FLASH4_TEST_CUDA(k_cache.download());
  for (double x : c.out.to_double()) EXPECT_TRUE(std::isnan(x));
  const std::vector<double> after = c.k_cache.to_double();
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_TRUE(after[i] == c.initial_k_cache[i] || (std::isnan(after[i]) && std::isnan(c.initial_k_cache[i])));
}

}  // namespace
}  // namespace flash4::test
