// A packed (variable-length) case (tests/common/varlen_case.h) on the device: every tensor mirrored to device
// memory (the offsets too: the kernels read them there), the args of those mirrors, and the forward / backward
// runs that judge the GPU's outputs against the fp64 reference.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"
#include "common/varlen_case.h"
#include "device_mirror.h"
#include "flash4/api.h"

namespace flash4::test {

#define FLASH4_REQUIRE_GPU() \
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU"

// Device copies of every tensor of a case, and args pointing at them.
struct DeviceVarlen {
  explicit DeviceVarlen(VarlenTensors& t) {
    for (HostTensor* h : {&t.q, &t.k, &t.v, &t.out, &t.lse, &t.cu_seqlens_q, &t.cu_seqlens_k}) add(*h);
    for (std::optional<HostTensor>* h : {&t.seqused_q, &t.seqused_k, &t.sink, &t.dsink, &t.dout, &t.dq, &t.dk, &t.dv})
      if (h->has_value()) add(**h);
  }
  bool ok() const {
    for (const auto& m : mirrors)
      if (!m.second->ok()) return false;
    return true;
  }
  TensorView view(const HostTensor& h) const {
    for (const auto& m : mirrors)
      if (m.first == &h) return m.second->view();
    return h.view();
  }
  cudaError_t download(const HostTensor& h) {
    for (auto& m : mirrors)
      if (m.first == &h) return m.second->download();
    return cudaErrorInvalidValue;
  }
  template <typename Args>
  void point_sequences(Args& a, const VarlenTensors& t) const {
    a.cu_seqlens_q = view(t.cu_seqlens_q);
    a.cu_seqlens_k = view(t.cu_seqlens_k);
    if (t.seqused_q) a.seqused_q = view(*t.seqused_q);
    if (t.seqused_k) a.seqused_k = view(*t.seqused_k);
    if (t.sink) a.learnable_sink = view(*t.sink);
  }
  ForwardArgs forward_args(const VarlenSpec& s, const VarlenTensors& t) const {
    ForwardArgs a = t.forward_args(s);
    a.q = view(t.q), a.k = view(t.k), a.v = view(t.v), a.out = view(t.out), a.lse = view(t.lse);
    point_sequences(a, t);
    return a;
  }
  BackwardArgs backward_args(const VarlenSpec& s, const VarlenTensors& t) const {
    BackwardArgs a = t.backward_args(s);
    a.q = view(t.q), a.k = view(t.k), a.v = view(t.v), a.out = view(t.out), a.lse = view(t.lse);
    a.dout = view(*t.dout), a.dq = view(*t.dq), a.dk = view(*t.dk), a.dv = view(*t.dv);
    if (t.dsink) a.dsink = view(*t.dsink);
    point_sequences(a, t);
    return a;
  }

 private:
  void add(HostTensor& h) { mirrors.emplace_back(&h, std::make_unique<DeviceMirror>(h)); }
  std::vector<std::pair<const HostTensor*, std::unique_ptr<DeviceMirror>>> mirrors;
};

// The forward of `s` on the device, every row judged. `before`, if given, sees the device args first (to assert
// which path they take) and returns false to skip the case (a kernel a slice build does not compile).
inline void run_forward(const VarlenSpec& s, const std::function<bool(const ForwardArgs&)>& before = {}) {
  SCOPED_TRACE(s.name());
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, false);
  DeviceVarlen dev(t);
  ASSERT_TRUE(dev.ok());
  const ForwardArgs args = dev.forward_args(s, t);
  if (before && !before(args)) return;
  const Support support = can_implement(args);
  ASSERT_TRUE(support.ok) << support.reason;
  forward(args);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dev.download(t.out));
  FLASH4_TEST_CUDA(dev.download(t.lse));
  EXPECT_TRUE(check_varlen_forward(s, t));
}

// out and lse from the fp64 reference (rounded), so the backward is tested on its own.
inline void reference_out_lse(const VarlenSpec& s, VarlenTensors& t) {
  const detail::Problem p = make_problem(t.forward_args(s));
  const ForwardResult ref = reference_forward(p, t.q.to_double(), t.k.to_double(), t.v.to_double());
  t.out.assign(ref.out);
  t.lse.assign(ref.lse);
}

inline void run_backward(const VarlenSpec& s) {
  SCOPED_TRACE(s.name());
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  reference_out_lse(s, t);
  DeviceVarlen dev(t);
  ASSERT_TRUE(dev.ok());
  const BackwardArgs args = dev.backward_args(s, t);
  const Support support = can_implement(args);
  ASSERT_TRUE(support.ok) << support.reason;
  backward(args);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  for (HostTensor* h : {&*t.dq, &*t.dk, &*t.dv}) FLASH4_TEST_CUDA(dev.download(*h));
  if (t.dsink) FLASH4_TEST_CUDA(dev.download(*t.dsink));
  EXPECT_TRUE(check_varlen_backward(s, t));
}

// The `guard` rows a packed call was not shown (past the `total` rows of its views, of the downloaded buffers'
// total + guard): a 16-bit tensor's rows of `row_elements` still hold the poison (0x7fc0), and an LSE (heads,
// total + guard) still NaN. Callers wrap these in ASSERT_NO_FATAL_FAILURE.
inline void expect_guard_rows_untouched(const HostTensor& h, int64_t total, int64_t guard, int64_t row_elements) {
  const std::vector<uint16_t> bits = h.bits16();
  for (int64_t i = total * row_elements; i < (total + guard) * row_elements; ++i)
    ASSERT_EQ(bits[i], 0x7fc0u) << "element " << i << " past the tensor was written";
}
inline void expect_guard_lse_untouched(const HostTensor& lse, int64_t heads, int64_t total, int64_t guard) {
  const float* values = static_cast<const float*>(lse.view().data);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = total; i < total + guard; ++i) ASSERT_TRUE(std::isnan(values[h * (total + guard) + i])) << i;
}

template <class Change>
VarlenSpec varlen(std::vector<int> sq, std::vector<int> sk, int64_t heads, int64_t heads_kv, int64_t d, DType dtype,
                  Change&& change) {
  VarlenSpec s;
  s.seqlens_q = std::move(sq);
  s.seqlens_k = std::move(sk);
  s.heads = heads;
  s.heads_kv = heads_kv;
  s.head_dim = d;
  s.dtype = dtype;
  change(s);
  return s;
}
inline VarlenSpec varlen(std::vector<int> sq, std::vector<int> sk, int64_t heads, int64_t heads_kv, int64_t d,
                         DType dtype) {
  return varlen(std::move(sq), std::move(sk), heads, heads_kv, d, dtype, [](VarlenSpec&) {});
}

}  // namespace flash4::test
