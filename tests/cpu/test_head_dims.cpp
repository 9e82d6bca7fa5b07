// Head dims beyond the Hopper kernels' 64 / 128 / 256 on the CPU, and v / out with a head dim of their own
// (head_dim_v != head_dim: DeepSeek's (192, 128), and (128, 64)), through the public API against the fp64
// reference with the tolerance rule: forward (out, lse) and backward (dq, dk, dv, dsink), dense and packed,
// with causal, window, softcap, GQA, the learnable sink and the deterministic flag. Also: a split head dim gives
// what the equal-dims path gives on v zero-padded to head_dim (the split changes only the widths, not the math),
// and the Hopper dispatch's refusal text for head dims it does not take.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/attention_case.h"
#include "common/problem_builder.h"
#include "common/varlen_case.h"
#include "kernels/sm90/head_dims.h"

namespace flash4::test {
namespace {

constexpr DType kF32 = DType::kFloat32, kF16 = DType::kFloat16, kBF16 = DType::kBFloat16;

// (head_dim, head_dim_v) pairs: the new equal dims and the splits.
struct Dims {
  int64_t qk, v;
};
constexpr Dims kDims[] = {{96, 96}, {192, 192}, {192, 128}, {128, 64}};

CaseSpec dense(int64_t sq, int64_t sk, int64_t heads, int64_t heads_kv, Dims d, DType t) {
  CaseSpec s = make_spec(1, sq, sk, heads, heads_kv, d.qk, t);
  s.head_dim_v = d.v;
  return s;
}

std::vector<CaseSpec> dense_cases() {
  std::vector<CaseSpec> c;
  for (const Dims d : kDims) {
    c.push_back(dense(70, 90, 4, 2, d, kBF16));                                                      // GQA 2:1
    c.push_back(with(dense(130, 100, 4, 1, d, kF16), [](CaseSpec& s) { s.causal = true; }));        // MQA, masked rows
    c.push_back(with(dense(120, 120, 2, 2, d, kF32), [](CaseSpec& s) { s.window_left = 20, s.window_right = 3; }));
    c.push_back(with(dense(80, 100, 2, 1, d, kBF16), [](CaseSpec& s) {
      s.softcap = 5.0f, s.input_stddev = 3.0, s.causal = true;
    }));
    c.push_back(with(dense(60, 50, 4, 2, d, kBF16), [](CaseSpec& s) { s.sink = true, s.causal = true; }));
  }
  c.push_back(with(dense(77, 91, 4, 2, {192, 128}, kBF16), [](CaseSpec& s) {
    s.layout = Layout::kStrided, s.batch = 2;
  }));
  c.push_back(with(dense(65, 65, 2, 1, {128, 64}, kF32), [](CaseSpec& s) { s.tuning.exp2 = Exp2Mode::kPolynomial; }));
  c.push_back(dense(1, 1, 1, 1, {192, 128}, kBF16));  // one query, one key
  return c;
}

class CpuHeadDims : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuHeadDims, ForwardMatchesReference) {
  const CaseSpec& s = GetParam();
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(s, rng, false);
  forward(t.forward_args(s));
  EXPECT_TRUE(check_forward(s, t, rng));
}

TEST_P(CpuHeadDims, BackwardMatchesReference) {
  CaseSpec s = GetParam();
  s.tuning = {};  // the backward's rule has no allowance for a polynomial-exp2 forward's LSE
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(s, rng, true);
  forward(t.forward_args(s));
  BackwardArgs bwd = t.backward_args(s);
  bwd.deterministic = s.causal;  // the flag changes nothing on the CPU; run both settings
  backward(bwd);
  EXPECT_TRUE(check_backward(s, t));
}

INSTANTIATE_TEST_SUITE_P(Dense, CpuHeadDims, ::testing::ValuesIn(dense_cases()),
                         [](const auto& info) { return info.param.name(); });

std::vector<VarlenSpec> packed_cases() {
  std::vector<VarlenSpec> c;
  for (const Dims d : kDims) {
    VarlenSpec s;
    s.seqlens_q = {40, 0, 1, 70};
    s.seqlens_k = {50, 9, 1, 65};
    s.heads = 4;
    s.heads_kv = 2;
    s.head_dim = d.qk;
    s.head_dim_v = d.v;
    s.causal = true;
    c.push_back(s);
    s.causal = false;
    s.sink = true;
    s.window_left = 12, s.window_right = 4;
    s.softcap = 10.0f;
    s.seqused_k = {45, 9, 1, 30};
    s.pad_q = 3, s.pad_k = 2;  // rows in no segment: out 0, lse -inf, zero gradients
    s.deterministic = true;
    c.push_back(s);
  }
  return c;
}

class CpuHeadDimsPacked : public ::testing::TestWithParam<VarlenSpec> {};

TEST_P(CpuHeadDimsPacked, ForwardMatchesReference) {
  const VarlenSpec& s = GetParam();
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, false);
  forward(t.forward_args(s));
  EXPECT_TRUE(check_varlen_forward(s, t));
}

TEST_P(CpuHeadDimsPacked, BackwardMatchesReference) {
  const VarlenSpec& s = GetParam();
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  forward(t.forward_args(s));
  backward(t.backward_args(s));
  EXPECT_TRUE(check_varlen_backward(s, t));
}

INSTANTIATE_TEST_SUITE_P(Packed, CpuHeadDimsPacked, ::testing::ValuesIn(packed_cases()),
                         [](const auto& info) { return info.param.name(); });

// v zero-padded from 64 to 128 columns gives, in its first 64 columns, out and dv of the (128, 64) split, and the
// same dq and dk (the padding adds zeros to every dot product with dout); fp32, so only summation order differs.
TEST(CpuHeadDimsSplit, EqualsZeroPaddedValues) {
  FLASH4_TEST_RNG(rng);
  CaseSpec split = with(dense(70, 80, 2, 1, {128, 64}, kF32), [](CaseSpec& s) { s.causal = true; });
  CaseSpec padded = split;
  padded.head_dim_v = 0;
  AttentionTensors a = make_tensors(split, rng, true), b = make_tensors(padded, rng, true);
  std::vector<double> q = a.q.to_double(), k = a.k.to_double(), v = a.v.to_double(), dout = a.dout->to_double();
  auto widen = [](const std::vector<double>& x, int64_t from, int64_t to) {
    std::vector<double> w(x.size() / from * to, 0.0);
    for (size_t r = 0; r < x.size() / from; ++r) std::copy_n(x.begin() + r * from, from, w.begin() + r * to);
    return w;
  };
  b.q.assign(q);
  b.k.assign(k);
  b.v.assign(widen(v, 64, 128));
  b.dout->assign(widen(dout, 64, 128));
  for (AttentionTensors* t : {&a, &b}) {
    const CaseSpec& s = t == &a ? split : padded;
    forward(t->forward_args(s));
    backward(t->backward_args(s));
  }
  auto near = [](const std::vector<double>& x, const std::vector<double>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::abs(x[i] - y[i]) > 1e-5 * (1.0 + std::abs(y[i]))) return false;
    return true;
  };
  auto narrow = [](const std::vector<double>& x, int64_t from, int64_t to) {
    std::vector<double> n;
    for (size_t r = 0; r < x.size() / from; ++r) n.insert(n.end(), x.begin() + r * from, x.begin() + r * from + to);
    return n;
  };
  EXPECT_TRUE(near(a.out.to_double(), narrow(b.out.to_double(), 128, 64)));
  EXPECT_TRUE(near(a.lse.to_double(), b.lse.to_double()));
  EXPECT_TRUE(near(a.dq->to_double(), b.dq->to_double()));
  EXPECT_TRUE(near(a.dk->to_double(), b.dk->to_double()));
  EXPECT_TRUE(near(a.dv->to_double(), narrow(b.dv->to_double(), 128, 64)));
  const std::vector<double> padded_out = b.out.to_double();  // zero value columns give zero output columns
  for (size_t i = 0; i < padded_out.size(); ++i)
    if (i % 128 >= 64) ASSERT_EQ(padded_out[i], 0.0) << i;
}

// The Hopper dispatch refuses what its kernels do not take, naming what they do (checked here without a GPU:
// fwd_api.cu and bwd_api.cu return exactly this text from can_implement).
TEST(Sm90HeadDims, RefusesOtherHeadDimsAndSplitsWithTheSupportedList) {
  detail::Problem p;
  for (int64_t d : {64, 96, 128, 192, 256}) {
    p.head_dim = p.head_dim_v = d;
    EXPECT_EQ(sm90::head_dim_refusal(p, "forward"), "") << d;
    EXPECT_EQ(sm90::head_dim_refusal(p, "backward"), "") << d;
  }
  for (int64_t d : {4, 12, 264}) {  // validation refuses these first; the GPU's own check says the same
    p.head_dim = p.head_dim_v = d;
    const std::string why = sm90::head_dim_refusal(p, "backward");
    EXPECT_NE(why.find("head_dim " + std::to_string(d) + " is not supported by the GPU backward"), std::string::npos)
        << why;
    EXPECT_NE(why.find("multiples of 8 from 8 to 256"), std::string::npos) << why;
  }
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{192, 128}, {128, 64}}) {
    p.head_dim = d, p.head_dim_v = dv;
    EXPECT_EQ(sm90::head_dim_refusal(p, "forward"), "") << d << "/" << dv;
    EXPECT_EQ(sm90::head_dim_refusal(p, "backward"), "") << d << "/" << dv;
  }
  p.head_dim = 192, p.head_dim_v = 64;
  const std::string why = sm90::head_dim_refusal(p, "forward");
  EXPECT_NE(why.find("v's head_dim (64) differs from q and k's (192)"), std::string::npos) << why;
  EXPECT_NE(why.find("(192, 128) or (128, 64)"), std::string::npos) << why;
  EXPECT_NE(why.find("GPU forward"), std::string::npos) << why;
}

// The GPU takes every multiple of 8 up to 256 (zero-padded on the next wider kernel).
TEST(Sm90HeadDims, TheGpuTakesEveryMultipleOf8UpTo256) {
  detail::Problem p;
  for (int64_t d : {8, 32, 40, 80, 104, 160, 200, 248}) {
    p.head_dim = p.head_dim_v = d;
    EXPECT_EQ(sm90::head_dim_refusal(p, "forward"), "") << d;
    EXPECT_EQ(sm90::head_dim_refusal(p, "backward"), "") << d;
    EXPECT_NE(sm90::kernel_head_dim(d, d), 0) << d;
    EXPECT_NE(sm90::fwd_kernel_head_dim(d, d), 0) << d;
    EXPECT_NE(sm90::bwd_kernel_head_dim(d, d), 0) << d;
  }
  p.head_dim = p.head_dim_v = 264;
  EXPECT_NE(sm90::head_dim_refusal(p, "forward"), "");
  p.head_dim = 80, p.head_dim_v = 64;  // splits other than the listed ones stay refused
  EXPECT_NE(sm90::head_dim_refusal(p, "forward"), "");
}

// The compiled width that runs each head-dim pair, and which pairs run zero-padded (head_dims.h).
TEST(Sm90HeadDims, PaddedPairsRunOnTheNextWiderKernel) {
  EXPECT_EQ(sm90::kernel_head_dim(64, 64), 64);
  EXPECT_EQ(sm90::kernel_head_dim(96, 96), 128);
  EXPECT_EQ(sm90::kernel_head_dim(128, 64), 128);
  EXPECT_EQ(sm90::kernel_head_dim(192, 128), 256);
  EXPECT_EQ(sm90::kernel_head_dim(192, 192), 256);
  EXPECT_EQ(sm90::kernel_head_dim(264, 264), 0);
  EXPECT_FALSE(sm90::padded_head_dims(128, 128));
  EXPECT_FALSE(sm90::padded_head_dims(256, 256));
  EXPECT_TRUE(sm90::padded_head_dims(96, 96));  // no mma.sync 96 either
  EXPECT_TRUE(sm90::padded_head_dims(128, 64));
  EXPECT_TRUE(sm90::padded_head_dims(192, 128));
  EXPECT_TRUE(sm90::padded_head_dims(192, 192));  // no mma.sync 192: the backward needs its TMA kernel
  // The forward and the backward's wgmma kernel have their own 96 and 192 kernels; decode runs only 64, 128
  // and 256.
  for (auto width : {sm90::fwd_kernel_head_dim, sm90::bwd_kernel_head_dim}) {
    EXPECT_EQ(width(72, 72), 96);
    EXPECT_EQ(width(96, 96), 96);
    EXPECT_EQ(width(104, 104), 128);
    EXPECT_EQ(width(128, 64), 128);
    EXPECT_EQ(width(136, 136), 192);
    EXPECT_EQ(width(192, 192), 192);
    EXPECT_EQ(width(192, 128), 192);
    EXPECT_EQ(width(200, 200), 256);
    EXPECT_EQ(width(264, 264), 0);
  }
}

}  // namespace
}  // namespace flash4::test
