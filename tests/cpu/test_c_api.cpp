// The C API (flash4/c_api.h) from C++: status codes, messages, defaults and the per-thread last error. The
// same header compiled as C: tests/c/test_c_api.c.
#include "flash4/c_api.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flash4/api.h"
#include "flash4/kvcache.h"

namespace flash4 {
namespace {

// A small fp32 causal problem on the CPU with random inputs, described by the C structs.
struct CProblem {
  static constexpr int64_t kBatch = 1, kSeqQ = 5, kSeqK = 9, kHeads = 2, kHeadsKv = 1, kDim = 16;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;

  CProblem()
      : q(kBatch * kSeqQ * kHeads * kDim), k(kBatch * kSeqK * kHeadsKv * kDim), v(k.size()), out(q.size()),
        lse(kBatch * kHeads * kSeqQ), dout(q.size()), dq(q.size()), dk(k.size()), dv(k.size()) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal;
    for (auto* t : {&q, &k, &v, &dout})
      for (float& x : *t) x = normal(rng);
  }
  static flash4_tensor view(std::vector<float>& x, int64_t seqlen, int64_t heads) {
    const int64_t shape[4] = {kBatch, seqlen, heads, kDim};
    return flash4_tensor_contiguous(x.data(), FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, shape);
  }
  flash4_tensor lse_view() {
    const int64_t shape[3] = {kBatch, kHeads, kSeqQ};
    return flash4_tensor_contiguous(lse.data(), FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 3, shape);
  }
  flash4_forward_args forward_args() {
    flash4_forward_args a;
    flash4_forward_args_init(&a);
    a.q = view(q, kSeqQ, kHeads);
    a.k = view(k, kSeqK, kHeadsKv);
    a.v = view(v, kSeqK, kHeadsKv);
    a.out = view(out, kSeqQ, kHeads);
    a.lse = lse_view();
    a.causal = 1;
    return a;
  }
  flash4_backward_args backward_args() {
    flash4_backward_args a;
    flash4_backward_args_init(&a);
    a.dout = view(dout, kSeqQ, kHeads);
    a.q = view(q, kSeqQ, kHeads);
    a.k = view(k, kSeqK, kHeadsKv);
    a.v = view(v, kSeqK, kHeadsKv);
    a.out = view(out, kSeqQ, kHeads);
    a.lse = lse_view();
    a.dq = view(dq, kSeqQ, kHeads);
    a.dk = view(dk, kSeqK, kHeadsKv);
    a.dv = view(dv, kSeqK, kHeadsKv);
    a.causal = 1;
    return a;
  }
};

TEST(CApi, DefaultsMatchTheCppStructs) {
  flash4_forward_args f;
  flash4_forward_args_init(&f);
  const ForwardArgs cf;
  EXPECT_EQ(f.softmax_scale, cf.softmax_scale);
  EXPECT_EQ(f.causal, 0);
  EXPECT_EQ(f.window_left, cf.window_left);
  EXPECT_EQ(f.window_right, cf.window_right);
  EXPECT_EQ(f.softcap, cf.softcap);
  EXPECT_EQ(f.exp2_mode, static_cast<int>(cf.tuning.exp2));
  EXPECT_EQ(f.conditional_rescale, cf.tuning.conditional_rescale ? 1 : 0);
  EXPECT_EQ(f.lse.data, nullptr);
  flash4_backward_args b;
  flash4_backward_args_init(&b);
  EXPECT_EQ(b.deterministic, 0);
  EXPECT_EQ(b.window_left, -1);
}

TEST(CApi, ContiguousTensorHasRowMajorStrides) {
  const int64_t shape[4] = {2, 3, 4, 8};
  const flash4_tensor t = flash4_tensor_contiguous(nullptr, FLASH4_BFLOAT16, FLASH4_DEVICE_CUDA, 1, 4, shape);
  const TensorView like = make_view(nullptr, DType::kBFloat16, Device::cuda(1), 2, 3, 4, 8);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.shape[i], like.shape[i]);
    EXPECT_EQ(t.stride[i], like.stride[i]);
  }
  EXPECT_EQ(t.device_index, 1);
}

// Strides past int64 saturate, as make_view's do, and validation refuses the tensor as too large.
TEST(CApi, ContiguousTensorSaturatesHugeStrides) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  const int64_t shape[4] = {big, big, 3, 8};
  const flash4_tensor t = flash4_tensor_contiguous(nullptr, FLASH4_BFLOAT16, FLASH4_DEVICE_CPU, 0, 4, shape);
  EXPECT_EQ(t.stride[3], 1);
  EXPECT_EQ(t.stride[2], 8);
  EXPECT_EQ(t.stride[1], 24);
  EXPECT_EQ(t.stride[0], big);
  flash4_forward_args f;
  flash4_forward_args_init(&f);
  f.q = f.k = f.v = f.out = t;
  EXPECT_EQ(flash4_can_implement_forward(&f), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flash4_last_error()).find("q is too large"), std::string::npos) << flash4_last_error();
}

TEST(CApi, ReturnsOkOnSuccessAndMatchesTheCppApi) {
  CProblem s;
  const flash4_forward_args f = s.forward_args();
  EXPECT_EQ(flash4_can_implement_forward(&f), FLASH4_STATUS_OK);
  EXPECT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_OK);
  const flash4_backward_args b = s.backward_args();
  EXPECT_EQ(flash4_can_implement_backward(&b), FLASH4_STATUS_OK);
  EXPECT_EQ(flash4_backward(&b, nullptr), FLASH4_STATUS_OK);

  // The same problem through the C++ API gives bit-identical results (the CPU path is deterministic).
  std::vector<float> out(s.out.size()), lse(s.lse.size());
  ForwardArgs cf;
  cf.q = make_view(s.q.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kSeqQ, CProblem::kHeads, CProblem::kDim);
  cf.k = make_view(s.k.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kSeqK, CProblem::kHeadsKv,
                   CProblem::kDim);
  cf.v = make_view(s.v.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kSeqK, CProblem::kHeadsKv,
                   CProblem::kDim);
  cf.out = make_view(out.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kSeqQ, CProblem::kHeads,
                     CProblem::kDim);
  cf.lse = make_view(lse.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kHeads, CProblem::kSeqQ);
  cf.causal = true;
  forward(cf);
  EXPECT_EQ(out, s.out);
  EXPECT_EQ(lse, s.lse);
}

TEST(CApi, ReturnsStatusAndKeepsMessage) {
  CProblem s;
  flash4_forward_args f = s.forward_args();
  f.k.shape[3] = 80;
  f.v.shape[3] = 80;
  EXPECT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flash4_last_error()).find("k.shape[3] (head_dim) = 80"), std::string::npos)
      << flash4_last_error();
  EXPECT_EQ(flash4_can_implement_forward(&f), FLASH4_STATUS_INVALID_ARGUMENT);

  flash4_backward_args b = s.backward_args();
  b.softcap = -1.0f;
  EXPECT_EQ(flash4_backward(&b, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flash4_last_error()).find("softcap"), std::string::npos) << flash4_last_error();

  EXPECT_EQ(flash4_forward(nullptr, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flash4_last_error()).find("args is null"), std::string::npos);
  EXPECT_EQ(flash4_backward(nullptr, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(flash4_can_implement_forward(nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(flash4_can_implement_backward(nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
}

TEST(CApi, RejectsOutOfRangeEnumValues) {
  CProblem s;
  flash4_forward_args f = s.forward_args();
  f.q.dtype = 7;
  EXPECT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flash4_last_error()).find("q.dtype has invalid value 7"), std::string::npos)
      << flash4_last_error();
  f = s.forward_args();
  f.out.device_kind = 5;
  EXPECT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
}

TEST(CApi, ReportsNotSupported) {
  if (cuda_available(0)) GTEST_SKIP() << "a usable CUDA device is present";
  CProblem s;
  flash4_forward_args f = s.forward_args();
  for (flash4_tensor* t : {&f.q, &f.k, &f.v, &f.out, &f.lse}) t->device_kind = FLASH4_DEVICE_CUDA;
  EXPECT_EQ(flash4_can_implement_forward(&f), FLASH4_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(flash4_last_error()).find("flash4_can_implement_forward"), std::string::npos);
  EXPECT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(flash4_last_error()).find("flash4::forward"), std::string::npos);
  EXPECT_EQ(flash4_cuda_available(0), 0);
}

TEST(CApi, LastErrorIsPerThread) {
  CProblem s;
  flash4_forward_args f = s.forward_args();
  f.softcap = -1.0f;
  ASSERT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  std::string other_thread_error = "unset";
  std::thread([&] { other_thread_error = flash4_last_error(); }).join();
  EXPECT_EQ(other_thread_error, "");
  EXPECT_NE(std::string(flash4_last_error()).find("softcap"), std::string::npos);
}

// v and out with a head_dim of their own (8 against q and k's 16) pass through the C structs unchanged: the
// C call writes what the C++ call writes, and an out with q's head_dim is rejected naming v's.
TEST(CApi, SplitHeadDimsMatchTheCppApi) {
  CProblem s;
  constexpr int64_t kDimV = 8;
  std::vector<float> v(CProblem::kSeqK * CProblem::kHeadsKv * kDimV), out(CProblem::kSeqQ * CProblem::kHeads * kDimV);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.1f * static_cast<float>(i));
  const int64_t v_shape[4] = {1, CProblem::kSeqK, CProblem::kHeadsKv, kDimV};
  const int64_t out_shape[4] = {1, CProblem::kSeqQ, CProblem::kHeads, kDimV};
  flash4_forward_args f = s.forward_args();
  f.v = flash4_tensor_contiguous(v.data(), FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, v_shape);
  f.out = flash4_tensor_contiguous(out.data(), FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 4, out_shape);
  ASSERT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_OK) << flash4_last_error();
  std::vector<float> cpp_out(out.size()), cpp_lse(s.lse.size());
  ForwardArgs a;
  a.q = make_view(s.q.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kSeqQ, CProblem::kHeads, CProblem::kDim);
  a.k = make_view(s.k.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kSeqK, CProblem::kHeadsKv, CProblem::kDim);
  a.v = make_view(v.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kSeqK, CProblem::kHeadsKv, kDimV);
  a.out = make_view(cpp_out.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kSeqQ, CProblem::kHeads, kDimV);
  a.lse = make_view(cpp_lse.data(), DType::kFloat32, Device::cpu(), 1, CProblem::kHeads, CProblem::kSeqQ);
  a.causal = true;
  forward(a);
  EXPECT_EQ(out, cpp_out);
  EXPECT_EQ(s.lse, cpp_lse);
  f.out = CProblem::view(s.out, CProblem::kSeqQ, CProblem::kHeads);  // q's head_dim
  EXPECT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flash4_last_error()).find("out.shape[3] (head_dim) = 16 but v.shape[3] = 8"),
            std::string::npos)
      << flash4_last_error();
}

// FP8 through the C structs: the dtype value and the descale fields reach the C++ call unchanged.
TEST(CApi, Fp8ForwardMatchesTheCppApi) {
  constexpr int64_t kSeq = 9, kHeads = 2, kDim = 16;
  std::vector<uint8_t> qkv(kSeq * kHeads * kDim);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<uint8_t>((i * 37) % 120);  // finite E4M3 codes
  std::vector<float> descale = {0.5f, 0.25f}, lse(kHeads * kSeq), cpp_lse(lse.size());
  std::vector<uint16_t> out(qkv.size()), cpp_out(qkv.size());
  const int64_t shape[4] = {1, kSeq, kHeads, kDim}, descale_shape[2] = {1, kHeads}, lse_shape[3] = {1, kHeads, kSeq};
  flash4_forward_args f;
  flash4_forward_args_init(&f);
  f.q = f.k = f.v = flash4_tensor_contiguous(qkv.data(), FLASH4_FLOAT8_E4M3, FLASH4_DEVICE_CPU, 0, 4, shape);
  f.out = flash4_tensor_contiguous(out.data(), FLASH4_BFLOAT16, FLASH4_DEVICE_CPU, 0, 4, shape);
  f.lse = flash4_tensor_contiguous(lse.data(), FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 3, lse_shape);
  f.v_descale = flash4_tensor_contiguous(descale.data(), FLASH4_FLOAT32, FLASH4_DEVICE_CPU, 0, 2, descale_shape);
  ASSERT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_OK) << flash4_last_error();
  ForwardArgs a;
  a.q = a.k = a.v = make_view(qkv.data(), DType::kFloat8E4M3, Device::cpu(), 1, kSeq, kHeads, kDim);
  a.out = make_view(cpp_out.data(), DType::kBFloat16, Device::cpu(), 1, kSeq, kHeads, kDim);
  a.lse = make_view(cpp_lse.data(), DType::kFloat32, Device::cpu(), 1, kHeads, kSeq);
  a.v_descale = make_view(descale.data(), DType::kFloat32, Device::cpu(), 1, kHeads);
  forward(a);
  EXPECT_EQ(out, cpp_out);
  EXPECT_EQ(lse, cpp_lse);
  f.k_descale = f.v_descale;
  f.k_descale.shape[1] = 3;
  EXPECT_EQ(flash4_forward(&f, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flash4_last_error()).find("k_descale.shape[1] (heads_kv) = 3"), std::string::npos);
}

// Every field of the KV-cache struct reaches the C++ call: a decode call that uses all of them (append, rotary,
// cache rows, window, softcap, sink, scale, split count), then packed queries, each bit-identical to the C++ API.
TEST(CApi, KvCacheMatchesTheCppApi) {
  flash4_kvcache_args defaults;
  flash4_kvcache_args_init(&defaults);
  const KvCacheArgs cpp_defaults;
  EXPECT_EQ(defaults.cache_seqlen, cpp_defaults.cache_seqlen);
  EXPECT_EQ(defaults.num_splits, cpp_defaults.num_splits);
  EXPECT_EQ(defaults.rotary_interleaved, 1);
  EXPECT_EQ(defaults.window_left, -1);
  EXPECT_EQ(defaults.lse.data, nullptr);

  constexpr int64_t kBatch = 2, kSeqQ = 3, kNew = 2, kHeads = 4, kHeadsKv = 2, kDim = 16, kRows = 16, kRo = 32;
  std::mt19937 rng(99);
  std::normal_distribution<float> normal;
  auto random = [&](int64_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng);
    return x;
  };
  std::vector<float> q = random(kBatch * kSeqQ * kHeads * kDim), k_new = random(kBatch * kNew * kHeadsKv * kDim);
  std::vector<float> v_new = random(k_new.size()), sink = random(kHeads), cos = random(kRo * 4), sin = random(kRo * 4);
  const std::vector<float> cache0 = random(3 * kRows * kHeadsKv * kDim), vcache0 = random(cache0.size());
  std::vector<int> seqlens = {7, 4}, rows = {2, 0};
  auto c_view = [](void* data, int dtype, std::initializer_list<int64_t> shape) {
    return flash4_tensor_contiguous(data, dtype, FLASH4_DEVICE_CPU, 0, static_cast<int32_t>(shape.size()),
                                    shape.begin());
  };
  std::vector<float> k_cache = cache0, v_cache = vcache0, out(q.size()), lse(kBatch * kHeads * kSeqQ);
  flash4_kvcache_args c = defaults;
  c.q = c_view(q.data(), FLASH4_FLOAT32, {kBatch, kSeqQ, kHeads, kDim});
  c.k_cache = c_view(k_cache.data(), FLASH4_FLOAT32, {3, kRows, kHeadsKv, kDim});
  c.v_cache = c_view(v_cache.data(), FLASH4_FLOAT32, {3, kRows, kHeadsKv, kDim});
  c.k = c_view(k_new.data(), FLASH4_FLOAT32, {kBatch, kNew, kHeadsKv, kDim});
  c.v = c_view(v_new.data(), FLASH4_FLOAT32, {kBatch, kNew, kHeadsKv, kDim});
  c.rotary_cos = c_view(cos.data(), FLASH4_FLOAT32, {kRo, 4});
  c.rotary_sin = c_view(sin.data(), FLASH4_FLOAT32, {kRo, 4});
  c.cache_seqlens = c_view(seqlens.data(), FLASH4_INT32, {kBatch});
  c.cache_batch_idx = c_view(rows.data(), FLASH4_INT32, {kBatch});
  c.out = c_view(out.data(), FLASH4_FLOAT32, {kBatch, kSeqQ, kHeads, kDim});
  c.lse = c_view(lse.data(), FLASH4_FLOAT32, {kBatch, kHeads, kSeqQ});
  c.learnable_sink = c_view(sink.data(), FLASH4_FLOAT32, {kHeads});
  c.softmax_scale = 0.3f;
  c.causal = 1;
  c.window_left = 5;
  c.window_right = 0;
  c.softcap = 10.0f;
  c.rotary_interleaved = 0;
  c.num_splits = 3;
  ASSERT_EQ(flash4_forward_kvcache(&c, nullptr), FLASH4_STATUS_OK) << flash4_last_error();

  std::vector<float> cpp_k = cache0, cpp_v = vcache0, cpp_out(out.size()), cpp_lse(lse.size());
  KvCacheArgs a;
  a.q = make_view(q.data(), DType::kFloat32, Device::cpu(), kBatch, kSeqQ, kHeads, kDim);
  a.k_cache = make_view(cpp_k.data(), DType::kFloat32, Device::cpu(), 3, kRows, kHeadsKv, kDim);
  a.v_cache = make_view(cpp_v.data(), DType::kFloat32, Device::cpu(), 3, kRows, kHeadsKv, kDim);
  a.k = make_view(k_new.data(), DType::kFloat32, Device::cpu(), kBatch, kNew, kHeadsKv, kDim);
  a.v = make_view(v_new.data(), DType::kFloat32, Device::cpu(), kBatch, kNew, kHeadsKv, kDim);
  a.rotary_cos = make_view(cos.data(), DType::kFloat32, Device::cpu(), kRo, 4);
  a.rotary_sin = make_view(sin.data(), DType::kFloat32, Device::cpu(), kRo, 4);
  a.cache_seqlens = make_view(seqlens.data(), DType::kInt32, Device::cpu(), kBatch);
  a.cache_batch_idx = make_view(rows.data(), DType::kInt32, Device::cpu(), kBatch);
  a.out = make_view(cpp_out.data(), DType::kFloat32, Device::cpu(), kBatch, kSeqQ, kHeads, kDim);
  a.lse = make_view(cpp_lse.data(), DType::kFloat32, Device::cpu(), kBatch, kHeads, kSeqQ);
  a.learnable_sink = make_view(sink.data(), DType::kFloat32, Device::cpu(), kHeads);
  a.softmax_scale = 0.3f;
  a.causal = true;
  a.window_left = 5;
  a.window_right = 0;
  a.softcap = 10.0f;
  a.rotary_interleaved = false;
  a.num_splits = 3;
  forward_kvcache(a);
  EXPECT_EQ(out, cpp_out);
  EXPECT_EQ(lse, cpp_lse);
  EXPECT_EQ(k_cache, cpp_k);
  EXPECT_EQ(v_cache, cpp_v);
  EXPECT_NE(k_cache, cache0);  // the append happened

  // Packed queries: counts 2 and 1 in rows 0..2 of q seen as (total_q, heads, d), no append.
  std::vector<int> cu = {0, 2, 3};
  flash4_kvcache_args p = defaults;
  p.q = c_view(q.data(), FLASH4_FLOAT32, {3, kHeads, kDim});
  p.k_cache = c.k_cache;
  p.v_cache = c.v_cache;
  p.cache_seqlens = c.cache_seqlens;
  p.cache_batch_idx = c.cache_batch_idx;
  p.out = c_view(out.data(), FLASH4_FLOAT32, {3, kHeads, kDim});
  p.lse = c_view(lse.data(), FLASH4_FLOAT32, {kHeads, 3});
  p.cu_seqlens_q = c_view(cu.data(), FLASH4_INT32, {3});
  p.max_seqlen_q = 2;
  p.causal = 1;
  ASSERT_EQ(flash4_forward_kvcache(&p, nullptr), FLASH4_STATUS_OK) << flash4_last_error();
  KvCacheArgs b;
  b.q = make_view(q.data(), DType::kFloat32, Device::cpu(), 3, kHeads, kDim);
  b.k_cache = a.k_cache;
  b.v_cache = a.v_cache;
  b.cache_seqlens = a.cache_seqlens;
  b.cache_batch_idx = a.cache_batch_idx;
  b.out = make_view(cpp_out.data(), DType::kFloat32, Device::cpu(), 3, kHeads, kDim);
  b.lse = make_view(cpp_lse.data(), DType::kFloat32, Device::cpu(), kHeads, 3);
  b.cu_seqlens_q = make_view(cu.data(), DType::kInt32, Device::cpu(), 3);
  b.max_seqlen_q = 2;
  b.causal = true;
  forward_kvcache(b);
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 3 * kHeads * kDim),
            std::vector<float>(cpp_out.begin(), cpp_out.begin() + 3 * kHeads * kDim));
  EXPECT_EQ(std::vector<float>(lse.begin(), lse.begin() + kHeads * 3),
            std::vector<float>(cpp_lse.begin(), cpp_lse.begin() + kHeads * 3));
  p.max_seqlen_q = 1;  // below the first segment's count
  EXPECT_EQ(flash4_forward_kvcache(&p, nullptr), FLASH4_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flash4_last_error()).find("max_seqlen_q"), std::string::npos) << flash4_last_error();
}

TEST(CApi, NamesAndVersion) {
  EXPECT_STREQ(flash4_status_string(FLASH4_STATUS_INVALID_ARGUMENT), "invalid argument");
  EXPECT_STREQ(flash4_version(), version());
  EXPECT_EQ(flash4_cuda_available(-1), 0);
}

}  // namespace
}  // namespace flash4
