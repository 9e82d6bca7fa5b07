// The API layer: dispatch to the CPU backend, can_implement on devices this build cannot use and the small
// helpers of the public types. The C API: test_c_api.cpp and tests/c/test_c_api.c.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/problem.h"
#include "flash4/api.h"
#include "reference/reference.h"

namespace flash4 {
namespace {

// A small fp32 problem on the CPU with random inputs.
struct SmallProblem {
  static constexpr int64_t kBatch = 1, kSeqQ = 5, kSeqK = 9, kHeads = 2, kHeadsKv = 1, kDim = 16;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;

  SmallProblem()
      : q(kBatch * kSeqQ * kHeads * kDim), k(kBatch * kSeqK * kHeadsKv * kDim), v(k.size()), out(q.size()),
        lse(kBatch * kHeads * kSeqQ), dout(q.size()), dq(q.size()), dk(k.size()), dv(k.size()) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal;
    for (auto* t : {&q, &k, &v, &dout})
      for (float& x : *t) x = normal(rng);
  }
  TensorView view_q(float* p) { return make_view(p, DType::kFloat32, Device::cpu(), kBatch, kSeqQ, kHeads, kDim); }
  TensorView view_k(float* p) { return make_view(p, DType::kFloat32, Device::cpu(), kBatch, kSeqK, kHeadsKv, kDim); }
  ForwardArgs forward_args() {
    ForwardArgs a;
    a.q = view_q(q.data());
    a.k = view_k(k.data());
    a.v = view_k(v.data());
    a.out = view_q(out.data());
    a.lse = make_view(lse.data(), DType::kFloat32, Device::cpu(), kBatch, kHeads, kSeqQ);
    a.causal = true;
    return a;
  }
  BackwardArgs backward_args() {
    const ForwardArgs f = forward_args();
    BackwardArgs a;
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.out = f.out;
    a.lse = f.lse;
    a.causal = f.causal;
    a.dout = view_q(dout.data());
    a.dq = view_q(dq.data());
    a.dk = view_k(dk.data());
    a.dv = view_k(dv.data());
    return a;
  }
  detail::Problem problem() const {
    detail::Problem p;
    p.batch = kBatch;
    p.seqlen_q = kSeqQ;
    p.seqlen_k = kSeqK;
    p.heads = kHeads;
    p.heads_kv = kHeadsKv;
    p.head_dim = kDim;
    p.head_dim_v = kDim;
    p.softmax_scale = 1.0f / 4.0f;
    p.causal = true;
    p.window_right = 0;
    return p;
  }
};

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(Api, ForwardRunsOnTheCpu) {
  SmallProblem s;
  forward(s.forward_args());
  std::vector<double> out(s.out.size()), lse(s.lse.size());
  reference::forward(s.problem(), to_double(s.q).data(), to_double(s.k).data(), to_double(s.v).data(), out.data(),
                     lse.data());
  EXPECT_LT(max_abs_diff(s.out, out), 1e-3);  // loose: the API test checks dispatch, not numerics
  EXPECT_LT(max_abs_diff(s.lse, lse), 1e-3);
}

TEST(Api, BackwardRunsOnTheCpu) {
  SmallProblem s;
  forward(s.forward_args());
  backward(s.backward_args());
  std::vector<double> dq(s.dq.size()), dk(s.dk.size()), dv(s.dv.size());
  reference::backward(s.problem(), to_double(s.q).data(), to_double(s.k).data(), to_double(s.v).data(),
                      to_double(s.dout).data(), dq.data(), dk.data(), dv.data());
  EXPECT_LT(max_abs_diff(s.dq, dq), 1e-2);
  EXPECT_LT(max_abs_diff(s.dk, dk), 1e-2);
  EXPECT_LT(max_abs_diff(s.dv, dv), 1e-2);
}

TEST(Api, CanImplementOnCpuIsOk) {
  SmallProblem s;
  const Support support = can_implement(s.forward_args());
  EXPECT_TRUE(support.ok);
  EXPECT_TRUE(static_cast<bool>(support));
  EXPECT_TRUE(can_implement(s.backward_args()).ok);
}

TEST(Api, CudaTensorsWithoutUsableDeviceReportTheReason) {
  if (cuda_available(0)) GTEST_SKIP() << "a usable CUDA device is present";
  SmallProblem s;
  ForwardArgs f = s.forward_args();
  for (TensorView* t : {&f.q, &f.k, &f.v, &f.out, &f.lse}) t->device = Device::cuda(0);
  const Support support = can_implement(f);
  EXPECT_FALSE(support.ok);
  EXPECT_FALSE(support.reason.empty());
  const std::vector<float> before = s.out;
  try {
    forward(f);
    ADD_FAILURE() << "forward on CUDA tensors succeeded without a usable device";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
    EXPECT_NE(std::string(e.what()).find(support.reason), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.out, before);

  BackwardArgs b = s.backward_args();
  for (TensorView* t : {&b.dout, &b.q, &b.k, &b.v, &b.out, &b.lse, &b.dq, &b.dk, &b.dv}) t->device = Device::cuda(0);
  EXPECT_FALSE(can_implement(b).ok);
  EXPECT_THROW(backward(b), Error);
}

TEST(Api, CanImplementThrowsOnInvalidInput) {
  SmallProblem s;
  ForwardArgs f = s.forward_args();
  f.k.shape[3] = 24;
  EXPECT_THROW((void)can_implement(f), Error);
}

TEST(Api, NegativeDeviceIndexIsNotAvailable) { EXPECT_FALSE(cuda_available(-1)); }

// ---- helpers of the public types ----------------------------------------------------------------------------------

TEST(Types, Names) {
  EXPECT_STREQ(dtype_name(DType::kFloat32), "fp32");
  EXPECT_STREQ(dtype_name(DType::kFloat16), "fp16");
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bf16");
  EXPECT_EQ(device_name(Device::cpu()), "cpu");
  EXPECT_EQ(device_name(Device::cuda(3)), "cuda:3");
  EXPECT_STREQ(status_name(Status::kOk), "ok");
  EXPECT_STREQ(status_name(Status::kInvalidArgument), "invalid argument");
  EXPECT_STREQ(status_name(Status::kNotSupported), "not supported");
  EXPECT_STRNE(version(), "");
}

TEST(Types, MakeViewIsContiguous) {
  const TensorView t = make_view(nullptr, DType::kFloat16, Device::cuda(1), 2, 3, 4, 8);
  EXPECT_EQ(t.rank, 4);
  EXPECT_EQ(t.stride[0], 96);
  EXPECT_EQ(t.stride[1], 32);
  EXPECT_EQ(t.stride[2], 8);
  EXPECT_EQ(t.stride[3], 1);
  EXPECT_EQ(t.numel(), 192);
  EXPECT_EQ(t.device, Device::cuda(1));
  const TensorView l = make_view(nullptr, DType::kFloat32, Device::cpu(), 2, 3, 5);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.stride[0], 15);
  EXPECT_EQ(l.stride[1], 5);
  EXPECT_EQ(l.stride[2], 1);
  EXPECT_EQ(l.numel(), 30);
}

}  // namespace
}  // namespace flash4
