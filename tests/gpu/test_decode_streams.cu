// Split-KV decode calls queued on several streams at once: each launch's last-CTA merge counts its splits on
// counters from a pool that launches leave at zero (src/kernels/sm90/zero_counters.h), one slice per
// stream. A slow stream (long caches) beside fast ones keeps many launches of different streams in flight
// together; every output must equal the same call run alone, bit for bit. The forward's tile counter comes from the
// same pool (the stream's slice), so forward calls interleaved with the decode calls must do the same.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/host_tensor.h"
#include "common/test_rng.h"
#include "device_mirror.h"
#include "flash4/api.h"
#include "flash4/kvcache.h"
#include "kvcache_device.h"

namespace flash4::test {
namespace {

constexpr int64_t kHeads = 32, kHeadsKv = 8, kDim = 128;

// Device copies of random q (1, seqlen_q, heads, d), k and v (1, keys, heads_kv, d), and `calls` poisoned output
// buffers of q's shape.
struct CallBuffers {
  HostTensor q, k, v;
  std::vector<HostTensor> outs;
  std::optional<DeviceMirror> dq, dk, dv;
  std::vector<std::unique_ptr<DeviceMirror>> douts;

  CallBuffers(int64_t seqlen_q, int64_t heads, int64_t keys, int64_t heads_kv, int calls, Rng& rng)
      : q(DType::kBFloat16, 1, seqlen_q, heads, kDim), k(DType::kBFloat16, 1, keys, heads_kv, kDim),
        v(DType::kBFloat16, 1, keys, heads_kv, kDim) {
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    dq.emplace(q);
    dk.emplace(k);
    dv.emplace(v);
    for (int i = 0; i < calls; ++i) {
      outs.emplace_back(DType::kBFloat16, 1, seqlen_q, heads, kDim);
      outs.back().poison();
    }
    for (HostTensor& o : outs) douts.push_back(std::make_unique<DeviceMirror>(o));
  }
};

// One stream's decode problem: a decode step of one sequence against `keys` cached keys, forced into `splits`
// splits.
struct StreamCase : CallBuffers {
  int splits;

  StreamCase(int64_t keys, int splits_, int calls, Rng& rng)
      : CallBuffers(1, kHeads, keys, kHeadsKv, calls, rng), splits(splits_) {}
  KvCacheArgs args(int call) const {
    KvCacheArgs a;
    a.q = dq->view(), a.k_cache = dk->view(), a.v_cache = dv->view(), a.out = douts[call]->view();
    a.num_splits = splits;
    return a;
  }
};

// One stream's forward problem: (1, seqlen, 16 heads, 4 kv heads, d).
struct ForwardCase : CallBuffers {
  bool causal;

  ForwardCase(int64_t seqlen, bool causal_, int calls, Rng& rng)
      : CallBuffers(seqlen, 16, seqlen, 4, calls, rng), causal(causal_) {}
  ForwardArgs args(int call) const {
    ForwardArgs a;
    a.q = dq->view(), a.k = dk->view(), a.v = dv->view(), a.out = douts[call]->view();
    a.causal = causal;
    return a;
  }
};

TEST(DecodeStreams, ConcurrentSplitCallsMergeTheirOwnSplits) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  constexpr int kCalls = 300;
  std::vector<std::unique_ptr<StreamCase>> cases;
  cases.push_back(std::make_unique<StreamCase>(65536, 33, kCalls, rng));  // slow: ~100 us a call
  for (int s = 0; s < 3; ++s) cases.push_back(std::make_unique<StreamCase>(2048 + 512 * s, 8 + s, kCalls, rng));
  std::vector<cudaStream_t> streams(cases.size());
  for (cudaStream_t& st : streams) FLASH4_TEST_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // Each case alone first: the reference bits.
  std::vector<std::vector<uint16_t>> expected;
  for (const auto& c : cases) {
    forward_kvcache(c->args(0), streams[0]);
    FLASH4_TEST_CUDA(cudaStreamSynchronize(streams[0]));
    FLASH4_TEST_CUDA(c->douts[0]->download());
    expected.push_back(c->outs[0].bits16());
  }
  // Then every call of every case, interleaved across the streams without waiting.
  for (int call = 1; call < kCalls; ++call)
    for (size_t s = 0; s < cases.size(); ++s) forward_kvcache(cases[s]->args(call), streams[s]);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  for (size_t s = 0; s < cases.size(); ++s) {
    for (int call = 1; call < kCalls; ++call) {
      FLASH4_TEST_CUDA(cases[s]->douts[call]->download());
      ASSERT_EQ(cases[s]->outs[call].bits16(), expected[s]) << "stream " << s << " call " << call;
    }
  }
  for (cudaStream_t st : streams) cudaStreamDestroy(st);
}

TEST(DecodeStreams, ForwardCallsBetweenSplitCallsKeepTheCountersZero) {
  FLASH4_REQUIRE_GPU();
  FLASH4_TEST_RNG(rng);
  constexpr int kCalls = 40;
  std::vector<std::unique_ptr<StreamCase>> decodes;
  std::vector<std::unique_ptr<ForwardCase>> forwards;
  const int64_t seqlens[3] = {1000, 4096, 333};  // causal on persistent CTAs, full, a short causal one
  for (int s = 0; s < 3; ++s) {
    decodes.push_back(std::make_unique<StreamCase>(4096 + 1024 * s, 6 + s, kCalls, rng));
    forwards.push_back(std::make_unique<ForwardCase>(seqlens[s], s != 1, kCalls, rng));
  }
  std::vector<cudaStream_t> streams(decodes.size());
  for (cudaStream_t& st : streams) FLASH4_TEST_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<std::vector<uint16_t>> expected_decode, expected_forward;
  for (size_t s = 0; s < decodes.size(); ++s) {
    forward_kvcache(decodes[s]->args(0), streams[0]);
    forward(forwards[s]->args(0), streams[0]);
    FLASH4_TEST_CUDA(cudaStreamSynchronize(streams[0]));
    FLASH4_TEST_CUDA(decodes[s]->douts[0]->download());
    FLASH4_TEST_CUDA(forwards[s]->douts[0]->download());
    expected_decode.push_back(decodes[s]->outs[0].bits16());
    expected_forward.push_back(forwards[s]->outs[0].bits16());
  }
  for (int call = 1; call < kCalls; ++call) {
    for (size_t s = 0; s < decodes.size(); ++s) {
      forward(forwards[s]->args(call), streams[s]);
      forward_kvcache(decodes[s]->args(call), streams[s]);
    }
  }
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  for (size_t s = 0; s < decodes.size(); ++s) {
    for (int call = 1; call < kCalls; ++call) {
      FLASH4_TEST_CUDA(decodes[s]->douts[call]->download());
      FLASH4_TEST_CUDA(forwards[s]->douts[call]->download());
      ASSERT_EQ(decodes[s]->outs[call].bits16(), expected_decode[s]) << "decode, stream " << s << " call " << call;
      ASSERT_EQ(forwards[s]->outs[call].bits16(), expected_forward[s]) << "forward, stream " << s << " call " << call;
    }
  }
  for (cudaStream_t st : streams) cudaStreamDestroy(st);
}

}  // namespace
}  // namespace flash4::test
