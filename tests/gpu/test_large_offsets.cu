// Element offsets past 2^31 on the Hopper GPU: tensors, the backward's fp32 dQ accumulator and the split-KV
// decode partials whose last rows lie beyond what a 32-bit element offset addresses. Every offset the kernels
// form is 64-bit (a base per tile or row, 32-bit offsets inside it); these cases keep it so. Inputs are filled on
// the device from a hash of the element index, and only the last batch entry (the one whose rows start past 2^31
// elements) is judged, against the fp64 reference of that entry alone with the tolerance rule, so that each case
// takes seconds and at most about 18 GiB of device memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"
#include "device_mirror.h"
#include "flash4/api.h"
#include "flash4/kvcache.h"
#include "reference/reference.h"

namespace flash4::test {
namespace {

#ifndef FLASH4_REQUIRE_GPU
#define FLASH4_REQUIRE_GPU() \
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU"
#endif

constexpr int64_t kInt32Elements = int64_t{1} << 31;
constexpr DType kBF16 = DType::kBFloat16, kF32 = DType::kFloat32;

// data[i] = a value in [-1, 1) hashed from (i, seed), so that tensors of any size fill on the device in
// milliseconds and no two rows are alike.
__global__ void fill_hashed_bf16(__nv_bfloat16* data, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + seed;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    data[i] = __float2bfloat16_rn(static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// A contiguous device tensor of `shape` (rank 1 to 4) and `dtype`, freed at scope end; ok() is false when the
// allocation failed.
class DeviceTensor {
 public:
  DeviceTensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    count_ = 1;
    for (int64_t s : shape_) count_ *= s;
    if (cudaMalloc(&data_, static_cast<size_t>(count_) * dtype_size(dtype_)) != cudaSuccess) {
      data_ = nullptr;
      (void)cudaGetLastError();
    }
  }
  ~DeviceTensor() { cudaFree(data_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  bool ok() const { return data_ != nullptr; }
  TensorView view() const {
    const Device gpu = Device::cuda(0);
    switch (shape_.size()) {
      case 1: return make_view(data_, dtype_, gpu, shape_[0]);
      case 2: return make_view(data_, dtype_, gpu, shape_[0], shape_[1]);
      case 3: return make_view(data_, dtype_, gpu, shape_[0], shape_[1], shape_[2]);
      default: return make_view(data_, dtype_, gpu, shape_[0], shape_[1], shape_[2], shape_[3]);
    }
  }
  void fill_hashed(uint64_t seed) {
    fill_hashed_bf16<<<4096, 256>>>(static_cast<__nv_bfloat16*>(data_), count_, seed);
  }
  // Elements [first, first + slice.numel()) as fp64, read through the contiguous host view `slice` of that size.
  std::vector<double> slice_to_double(int64_t first, TensorView slice) const {
    std::vector<char> host(static_cast<size_t>(slice.numel() * dtype_size(dtype_)));
    const size_t at = static_cast<size_t>(first) * dtype_size(dtype_);
    if (cudaMemcpy(host.data(), static_cast<char*>(data_) + at, host.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
      return {};
    slice.data = host.data();
    slice.dtype = dtype_;
    slice.device = Device::cpu();
    return reference::to_double(slice);
  }
  // Writes `values` (rounded to the dtype) at elements [first, first + slice.numel()).
  cudaError_t write_slice(int64_t first, TensorView slice, const std::vector<double>& values) {
    std::vector<char> host(static_cast<size_t>(slice.numel() * dtype_size(dtype_)));
    slice.data = host.data();
    slice.dtype = dtype_;
    slice.device = Device::cpu();
    reference::from_double(values, slice);
    const size_t at = static_cast<size_t>(first) * dtype_size(dtype_);
    return cudaMemcpy(static_cast<char*>(data_) + at, host.data(), host.size(), cudaMemcpyHostToDevice);
  }

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
  int64_t count_ = 0;
  void* data_ = nullptr;
};

// Host view shapes (no data) of one batch entry, for slices and for the entry's problem.
TensorView rows_shape(int64_t seqlen, int64_t heads, int64_t head_dim, DType dtype = kBF16) {
  return make_view(nullptr, dtype, Device::cpu(), 1, seqlen, heads, head_dim);
}
TensorView lse_shape(int64_t heads, int64_t seqlen) {
  return make_view(nullptr, kF32, Device::cpu(), 1, heads, seqlen);
}

// A dense bf16 problem: (batch, seqlen_q, heads, d) queries, (batch, seqlen_k, heads_kv, d) keys and values.
struct Shape {
  int64_t batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim;
  int64_t q_entry() const { return seqlen_q * heads * head_dim; }     // elements of one entry of q, out, dq
  int64_t k_entry() const { return seqlen_k * heads_kv * head_dim; }  // of k, v, dk, dv
  int64_t lse_entry() const { return heads * seqlen_q; }
};

// The forward's tensors on the device, inputs filled, and the args at them.
struct DenseTensors {
  explicit DenseTensors(const Shape& s)
      : s(s),
        q(kBF16, {s.batch, s.seqlen_q, s.heads, s.head_dim}),
        k(kBF16, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}),
        v(kBF16, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}),
        out(kBF16, {s.batch, s.seqlen_q, s.heads, s.head_dim}),
        lse(kF32, {s.batch, s.heads, s.seqlen_q}) {
    if (!ok()) return;
    q.fill_hashed(1);
    k.fill_hashed(2);
    v.fill_hashed(3);
  }
  bool ok() const { return q.ok() && k.ok() && v.ok() && out.ok() && lse.ok(); }
  ForwardArgs args(bool causal) const {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.causal = causal;
    return a;
  }
  // The problem of one entry alone (the reference's), and that entry's inputs.
  detail::Problem entry_problem(bool causal) const {
    ForwardArgs a;
    a.q = a.out = q_rows();
    a.k = a.v = k_rows();
    a.lse = lse_shape(s.heads, s.seqlen_q);
    a.causal = causal;
    return make_problem(a);
  }
  TensorView q_rows() const { return rows_shape(s.seqlen_q, s.heads, s.head_dim); }  // q, out, dout, dq
  TensorView k_rows() const { return rows_shape(s.seqlen_k, s.heads_kv, s.head_dim); }  // k, v, dk, dv
  std::vector<double> entry_q(int64_t b) const { return q.slice_to_double(b * s.q_entry(), q_rows()); }
  std::vector<double> entry_k(int64_t b) const { return k.slice_to_double(b * s.k_entry(), k_rows()); }
  std::vector<double> entry_v(int64_t b) const { return v.slice_to_double(b * s.k_entry(), k_rows()); }

  Shape s;
  DeviceTensor q, k, v, out, lse;
};

// A bf16 forward's out and LSE of problem `p` against its fp64 reference on inputs q, k, v.
::testing::AssertionResult forward_matches_reference(const detail::Problem& p, const std::vector<double>& q,
                                                     const std::vector<double>& k, const std::vector<double>& v,
                                                     const std::vector<double>& out, const std::vector<double>& lse) {
  const ForwardResult ref = reference_forward(p, q, k, v);
  const ForwardResult naive = naive_forward(p, kBF16, q, k, v);
  auto res = within_tolerance("out", out, ref.out, naive.out, kBF16);
  if (!res) return res;
  return within_tolerance("lse", lse, ref.lse, naive.lse, kF32);
}

// out and LSE of the last entry against the fp64 reference of that entry.
::testing::AssertionResult check_last_entry_forward(const DenseTensors& t, bool causal) {
  const Shape& s = t.s;
  const int64_t b = s.batch - 1;
  return forward_matches_reference(t.entry_problem(causal), t.entry_q(b), t.entry_k(b), t.entry_v(b),
                                   t.out.slice_to_double(b * s.q_entry(), t.q_rows()),
                                   t.lse.slice_to_double(b * s.lse_entry(), lse_shape(s.heads, s.seqlen_q)));
}

// Forward, then the backward of the whole batch on the last entry's fp64 reference out and LSE (the other
// entries keep the GPU forward's), and the last entry's dq, dk, dv judged against the reference.
void run_backward_last_entry(const Shape& s) {
  DenseTensors t(s);
  const std::vector<int64_t> q_shape = {s.batch, s.seqlen_q, s.heads, s.head_dim};
  const std::vector<int64_t> k_shape = {s.batch, s.seqlen_k, s.heads_kv, s.head_dim};
  DeviceTensor dout(kBF16, q_shape), dq(kBF16, q_shape), dk(kBF16, k_shape), dv(kBF16, k_shape);
  ASSERT_TRUE(t.ok() && dout.ok() && dq.ok() && dk.ok() && dv.ok()) << "device memory";
  dout.fill_hashed(4);
  const ForwardArgs fa = t.args(/*causal=*/false);
  const Support fwd_support = can_implement(fa);
  ASSERT_TRUE(fwd_support.ok) << fwd_support.reason;
  forward(fa);

  const int64_t b = s.batch - 1;
  const detail::Problem p = t.entry_problem(/*causal=*/false);
  const std::vector<double> q = t.entry_q(b), k = t.entry_k(b), v = t.entry_v(b);
  const ForwardResult ref = reference_forward(p, q, k, v);
  FLASH4_TEST_CUDA(t.out.write_slice(b * s.q_entry(), t.q_rows(), ref.out));
  FLASH4_TEST_CUDA(t.lse.write_slice(b * s.lse_entry(), lse_shape(s.heads, s.seqlen_q), ref.lse));

  BackwardArgs a;
  a.q = t.q.view();
  a.k = t.k.view();
  a.v = t.v.view();
  a.out = t.out.view();
  a.lse = t.lse.view();
  a.dout = dout.view();
  a.dq = dq.view();
  a.dk = dk.view();
  a.dv = dv.view();
  const Support support = can_implement(a);
  ASSERT_TRUE(support.ok) << support.reason;
  backward(a);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());

  const int64_t q_at = b * s.q_entry(), k_at = b * s.k_entry();
  EXPECT_TRUE(check_gradients(p, kBF16, q, k, v, t.out.slice_to_double(q_at, t.q_rows()),
                              dout.slice_to_double(q_at, t.q_rows()), dq.slice_to_double(q_at, t.q_rows()),
                              dk.slice_to_double(k_at, t.k_rows()), dv.slice_to_double(k_at, t.k_rows()), nullptr,
                              "last batch entry"));
}

// q and out of 2049 x 256 x 32 x 128 = 2^31 + 2^20 elements (4 GiB each; GQA 8:1 keeps k and v at 0.5 GiB): the
// last entry's Q loads, out stores and LSE lie past 2^31 elements from the tensors' starts.
TEST(LargeOffsetsGpu, ForwardOutputPastInt32Offsets) {
  FLASH4_REQUIRE_GPU();
  const Shape s{2049, 256, 256, 32, 4, 128};
  ASSERT_GT(s.batch * s.q_entry(), kInt32Elements);
  DenseTensors t(s);
  ASSERT_TRUE(t.ok()) << "device memory";
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "unmasked");
    const ForwardArgs a = t.args(causal);
    const Support support = can_implement(a);
    ASSERT_TRUE(support.ok) << support.reason;
    forward(a);
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(check_last_entry_forward(t, causal));
  }
}

// Head dim 8 runs on the 64-wide kernel, whose dQ accumulator rows are 32 floats: (2049 x 256 heads x 128 rows) x
// 32 = 2^31 + 2^20 floats (8 GiB) behind 1 GiB tensors. The last entry's accumulator rows (preprocess zeroing, TMA
// reduce-adds, postprocess) lie past 2^31 elements.
TEST(LargeOffsetsGpu, BackwardDqAccumulatorPastInt32Offsets) {
  FLASH4_REQUIRE_GPU();
  const Shape s{2049, 128, 128, 256, 1, 8};
  ASSERT_GT(s.batch * s.heads * s.seqlen_q * 32, kInt32Elements);
  run_backward_last_entry(s);
}

// k, v, dk, dv of 1025 x 2048 x 8 x 128 = 2^31 + 2^21 elements (4 GiB each): the last entry's K / V loads and its
// dK / dV stores lie past 2^31 elements.
TEST(LargeOffsetsGpu, BackwardKeyGradientsPastInt32Offsets) {
  FLASH4_REQUIRE_GPU();
  const Shape s{1025, 128, 2048, 8, 8, 128};
  ASSERT_GT(s.batch * s.k_entry(), kInt32Elements);
  run_backward_last_entry(s);
}

// Split-KV decode with 128 splits: the fp32 partial outputs (splits, batch, heads, seqlen_q, 128) hold 2^31 + 2^21
// floats (8 GiB), and the last sequence's later splits lie past 2^31 elements. Every sequence reads the same 32
// pages of 256 keys (8192 keys, 64 per split), so the cache stays small. seqlen_q 1: 16-row tiles merged by the
// last split CTA; seqlen_q 4: 64-row tiles merged by the combine kernel.
class LargeOffsetsDecodeGpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(LargeOffsetsDecodeGpu, SplitPartialsPastInt32Offsets) {
  FLASH4_REQUIRE_GPU();
  const auto [batch, seqlen_q] = GetParam();
  constexpr int64_t kHeads = 128, kHeadsKv = 8, kD = 128, kPages = 32, kPageSize = 256, kSplits = 128;
  ASSERT_GT(kSplits * batch * kHeads * seqlen_q * kD, kInt32Elements);
  DeviceTensor q(kBF16, {batch, seqlen_q, kHeads, kD}), out(kBF16, {batch, seqlen_q, kHeads, kD}),
      lse(kF32, {batch, kHeads, seqlen_q}), k_cache(kBF16, {kPages, kPageSize, kHeadsKv, kD}),
      v_cache(kBF16, {kPages, kPageSize, kHeadsKv, kD}), table(DType::kInt32, {batch, kPages});
  ASSERT_TRUE(q.ok() && out.ok() && lse.ok() && k_cache.ok() && v_cache.ok() && table.ok()) << "device memory";
  q.fill_hashed(5);
  k_cache.fill_hashed(6);
  v_cache.fill_hashed(7);
  std::vector<int> pages(static_cast<size_t>(batch * kPages));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int>(i % kPages);  // every row: pages 0 .. 31
  FLASH4_TEST_CUDA(cudaMemcpy(table.view().data, pages.data(), pages.size() * sizeof(int), cudaMemcpyHostToDevice));

  KvCacheArgs a;
  a.q = q.view();
  a.k_cache = k_cache.view();
  a.v_cache = v_cache.view();
  a.block_table = table.view();
  a.out = out.view();
  a.lse = lse.view();
  a.num_splits = static_cast<int>(kSplits);
  const Support support = can_implement(a);
  ASSERT_TRUE(support.ok) << support.reason;
  forward_kvcache(a);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());

  // The last sequence as a dense problem over the cache's pages in order: keys (1, 8192, heads_kv, d).
  const int64_t b = batch - 1, keys = kPages * kPageSize;
  ForwardArgs shape;
  shape.q = shape.out = rows_shape(seqlen_q, kHeads, kD);
  shape.k = shape.v = rows_shape(keys, kHeadsKv, kD);
  shape.lse = lse_shape(kHeads, seqlen_q);
  const detail::Problem p = make_problem(shape);
  const std::vector<double> qd = q.slice_to_double(b * seqlen_q * kHeads * kD, shape.q);
  const std::vector<double> kd = k_cache.slice_to_double(0, shape.k), vd = v_cache.slice_to_double(0, shape.v);
  EXPECT_TRUE(forward_matches_reference(p, qd, kd, vd, out.slice_to_double(b * seqlen_q * kHeads * kD, shape.out),
                                        lse.slice_to_double(b * kHeads * seqlen_q, shape.lse)));
}

INSTANTIATE_TEST_SUITE_P(Gpu, LargeOffsetsDecodeGpu,
                         ::testing::Values(std::tuple<int64_t, int64_t>{1025, 1}, std::tuple<int64_t, int64_t>{257, 4}),
                         [](const ::testing::TestParamInfo<std::tuple<int64_t, int64_t>>& info) {
                           return "seqlen_q" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace flash4::test
