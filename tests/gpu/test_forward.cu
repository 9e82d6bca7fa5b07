// Hopper forward kernel vs the fp64 reference, with the tolerance rule of tests/common/tolerance.h. Inputs are
// fresh random values every run (seed printed on failure); out and LSE are NaN-poisoned before each launch.
#include <gtest/gtest.h>

#include <vector>

#include "common/attention_case.h"
#include "device_mirror.h"
#include "flash4/api.h"

namespace flash4::test {
namespace {

// Runs the forward of `spec` on the GPU and checks it; returns false (with gtest failures) on any problem.
void run_and_check_forward(const CaseSpec& spec) {
  SCOPED_TRACE(spec.name());
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(spec, rng, /*backward=*/false);
  DeviceMirror q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse);
  ASSERT_TRUE(q.ok() && k.ok() && v.ok() && out.ok() && lse.ok());
  ForwardArgs args = t.forward_args(spec);
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.out = out.view();
  args.lse = lse.view();
  const Support support = can_implement(args);
  ASSERT_TRUE(support.ok) << support.reason;
  forward(args);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(out.download());
  FLASH4_TEST_CUDA(lse.download());
  EXPECT_TRUE(check_forward(spec, t, rng));
}

CaseSpec make_case(int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hkv, int64_t d, DType dtype, bool causal) {
  CaseSpec s = make_spec(b, sq, sk, h, hkv, d, dtype, causal);
  s.checked_rows = sq > 512 ? 96 : 0;  // the fp64 reference is the slow part: sample rows of long sequences
  // The GPU's default (kAuto) computes part of the exps with the FMA polynomial; saying so lets check_forward
  // allow the polynomial's 1e-4 relative error in the LSE.
  s.tuning.exp2 = Exp2Mode::kPolynomial;
  return s;
}

struct Shape {
  int64_t b, sq, sk, h, hkv;
};

// The issue's odd-shape list: lengths around tile edges, ragged q/k both ways, GQA 8:1, and b*h not a
// multiple of the SM count.
const Shape kOddShapes[] = {
    {1, 1, 1, 1, 1},      {1, 17, 17, 2, 2},     {2, 127, 127, 3, 3},  {1, 128, 128, 2, 2},  {1, 129, 129, 2, 1},
    {1, 1000, 1000, 1, 1}, {1, 1013, 1024, 2, 2}, {1, 4097, 4097, 1, 1}, {2, 100, 300, 4, 4}, {2, 300, 100, 4, 4},
    {3, 257, 257, 8, 1},
};

class ForwardShapes : public ::testing::TestWithParam<std::tuple<int, bool, DType>> {};

TEST_P(ForwardShapes, MatchesReference) {
  const auto [d, causal, dtype] = GetParam();
  for (const Shape& sh : kOddShapes) run_and_check_forward(make_case(sh.b, sh.sq, sh.sk, sh.h, sh.hkv, d, dtype, causal));
}

INSTANTIATE_TEST_SUITE_P(Gpu, ForwardShapes,
                         ::testing::Combine(::testing::Values(64, 128, 256), ::testing::Bool(),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         [](const auto& info) {
                           return "d" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_causal" : "") +
                                  (std::get<2>(info.param) == DType::kBFloat16 ? "_bf16" : "_fp16");
                         });

TEST(ForwardFeatures, WindowSoftcapStridesAndAblationSwitches) {
  for (int d : {64, 128, 256}) {
    CaseSpec win = make_case(2, 700, 900, 4, 2, d, DType::kBFloat16, false);
    win.window_left = 100;
    win.window_right = 30;
    run_and_check_forward(win);
    CaseSpec cap = make_case(1, 333, 517, 2, 2, d, DType::kFloat16, true);
    cap.softcap = 30.0f;
    run_and_check_forward(cap);
    CaseSpec strided = make_case(2, 200, 260, 4, 4, d, DType::kBFloat16, false);
    strided.layout = Layout::kStrided;
    run_and_check_forward(strided);
    CaseSpec exact = make_case(1, 512, 512, 2, 2, d, DType::kBFloat16, true);
    exact.tuning.exp2 = Exp2Mode::kExact;
    run_and_check_forward(exact);
    CaseSpec always = make_case(1, 512, 512, 2, 2, d, DType::kFloat16, false);
    always.tuning.conditional_rescale = false;
    run_and_check_forward(always);
  }
}

// Fully masked rows (a window that ends before the first key for the top rows) give out = 0, LSE = -inf.
TEST(ForwardFeatures, FullyMaskedRows) {
  for (int d : {64, 128}) {
    CaseSpec s = make_case(1, 300, 100, 2, 2, d, DType::kBFloat16, true);  // rows < 200 see no key
    run_and_check_forward(s);
  }
}

// More tiles than SMs: each persistent CTA walks several tiles (Q and K/V barriers change phase across tiles).
TEST(ForwardFeatures, PersistentManyTiles) {
  for (int d : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      CaseSpec s = make_case(3, 1000, 1100, 8, 2, d, d == 128 ? DType::kFloat16 : DType::kBFloat16, causal);
      s.checked_rows = 40;
      run_and_check_forward(s);
    }
    CaseSpec win = make_case(2, 2000, 2000, 8, 8, d, DType::kBFloat16, false);
    win.window_left = 256;  // many fully masked K tiles skipped per Q tile
    win.window_right = 0;
    win.checked_rows = 40;
    run_and_check_forward(win);
  }
}

// No keys at all: every row is fully masked.
TEST(ForwardFeatures, NoKeys) { run_and_check_forward(make_case(2, 50, 0, 2, 2, 128, DType::kBFloat16, false)); }

// Large score ranges: the conditional rescale must not overflow P (inputs scaled up so scores span ~1e3).
TEST(ForwardFeatures, LargeScoreRange) {
  for (int d : {64, 128, 256}) {
    CaseSpec s = make_case(1, 600, 700, 2, 2, d, DType::kBFloat16, false);
    s.input_stddev = 6.0;
    run_and_check_forward(s);
  }
}

}  // namespace
}  // namespace flash4::test
