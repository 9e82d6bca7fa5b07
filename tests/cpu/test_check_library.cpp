// The judges' library (src/check) itself: the tolerance rule's edge cases, and that the Problem it builds from
// public arguments is the one validation builds (the CLI's --check relies on it).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "api/backends.h"
#include "check/problem_from_args.h"
#include "check/tolerance.h"

namespace flash4 {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ToleranceRule, LimitIsTwiceTheBaselinePlusAtol) {
  const std::vector<double> ref = {0.5, -2.0}, naive = {0.5, -2.0 + 1e-3}, impl = {0.5, -2.0 + 2e-3};
  const check::Verdict v = check::judge(impl, ref, naive, DType::kBFloat16);
  EXPECT_DOUBLE_EQ(v.atol, 0x1p-8 * 2.0);  // bf16's unit roundoff times max |ref| = 2
  EXPECT_NEAR(v.baseline_error, 1e-3, 1e-12);
  EXPECT_DOUBLE_EQ(v.limit, check::kBaselineFactor * v.baseline_error + v.atol);
  EXPECT_TRUE(v.pass);
  EXPECT_FALSE(check::judge({0.5, -2.0 + 1e-2}, ref, naive, DType::kBFloat16).pass);
}

TEST(ToleranceRule, AtolScaleIsFlooredAtOne) {
  EXPECT_DOUBLE_EQ(check::atol(DType::kFloat16, {0.0, 1e-3}), 0x1p-11);
  EXPECT_DOUBLE_EQ(check::atol(DType::kFloat32, {-4.0, kInf}), 0x1p-16 * 4.0);  // infinities are not a scale
}

TEST(ToleranceRule, NanFailsAndInfinitiesMustMatch) {
  const std::vector<double> ref = {-kInf, 1.0};
  EXPECT_TRUE(check::judge({-kInf, 1.0}, ref, ref, DType::kFloat32).pass);
  EXPECT_FALSE(check::judge({kInf, 1.0}, ref, ref, DType::kFloat32).pass);
  EXPECT_FALSE(check::judge({-kInf, std::nan("")}, ref, ref, DType::kFloat32).pass);
  EXPECT_FALSE(check::judge({-kInf}, ref, ref, DType::kFloat32).pass);  // size mismatch
}

// A baseline that cannot be compared with the reference (another size, a NaN) makes the limit infinite; that
// must fail rather than let anything pass (e.g. a judge sizing out by q's head dim instead of v's).
TEST(ToleranceRule, AnUnboundedBaselineFails) {
  const std::vector<double> ref = {0.0, 1.0, 2.0};
  EXPECT_FALSE(check::judge({0.0, 1.0}, ref, {0.0, 1.0}, DType::kFloat32).pass);
  EXPECT_FALSE(check::judge(ref, ref, {0.0, 1.0}, DType::kFloat32).pass);
  EXPECT_FALSE(check::judge(ref, ref, {0.0, std::nan(""), 2.0}, DType::kFloat32).pass);
}

// Arguments that validate; only the fields make_problem reads matter.
// head_dim_v 0 = head_dim.
ForwardArgs args_of(int64_t head_dim, float scale, bool causal, int left, int right, float softcap,
                    int64_t head_dim_v = 0) {
  static std::vector<float> q(2 * 7 * 4 * 256), k(2 * 9 * 2 * 256), v(k.size()), out(q.size());
  const int64_t dv = head_dim_v > 0 ? head_dim_v : head_dim;
  ForwardArgs a;
  a.q = make_view(q.data(), DType::kFloat32, Device::cpu(), 2, 7, 4, head_dim);
  a.k = make_view(k.data(), DType::kFloat32, Device::cpu(), 2, 9, 2, head_dim);
  a.v = make_view(v.data(), DType::kFloat32, Device::cpu(), 2, 9, 2, dv);
  a.out = make_view(out.data(), DType::kFloat32, Device::cpu(), 2, 7, 4, dv);
  a.softmax_scale = scale;
  a.causal = causal;
  a.window_left = left;
  a.window_right = right;
  a.softcap = softcap;
  return a;
}

TEST(ProblemFromArgs, MatchesValidation) {
  for (const ForwardArgs& a : {args_of(128, 0.0f, false, -1, -1, 0.0f), args_of(96, 0.0f, true, -1, -1, 0.0f),
                               args_of(64, 0.3f, true, 5, 3, 20.0f), args_of(8, 0.0f, false, 2, 0, 0.0f),
                               args_of(256, 0.0f, true, -1, 4, 0.0f), args_of(192, 0.0f, true, -1, -1, 0.0f, 128),
                               args_of(128, 0.0f, false, 3, 3, 0.0f, 64), args_of(64, 0.0f, false, -1, -1, 0.0f, 256)}) {
    const detail::Problem want = detail::validate(a), got = check::make_problem(a);
    EXPECT_EQ(got.batch, want.batch);
    EXPECT_EQ(got.seqlen_q, want.seqlen_q);
    EXPECT_EQ(got.seqlen_k, want.seqlen_k);
    EXPECT_EQ(got.heads, want.heads);
    EXPECT_EQ(got.heads_kv, want.heads_kv);
    EXPECT_EQ(got.head_dim, want.head_dim);
    EXPECT_EQ(got.head_dim_v, want.head_dim_v);
    EXPECT_EQ(got.softmax_scale, want.softmax_scale);  // bit-identical, the default included
    EXPECT_EQ(got.softcap, want.softcap);
    EXPECT_EQ(got.causal, want.causal);
    EXPECT_EQ(got.window_left, want.window_left);
    EXPECT_EQ(got.window_right, want.window_right);
    EXPECT_EQ(got.total_q, want.total_q);
    EXPECT_EQ(got.total_k, want.total_k);
  }
}

TEST(ProblemFromArgs, MatchesValidationForPackedBatchesWithSink) {
  static std::vector<float> q(9 * 4 * 64), k(12 * 2 * 64), v(12 * 2 * 32), out(9 * 4 * 32), sink(4);
  static std::vector<int> cu_q = {0, 4, 4, 9}, cu_k = {0, 5, 11, 12}, used_k = {5, 3, 1};
  ForwardArgs a;
  a.q = make_view(q.data(), DType::kFloat32, Device::cpu(), 9, 4, 64);
  a.k = make_view(k.data(), DType::kFloat32, Device::cpu(), 12, 2, 64);
  a.v = make_view(v.data(), DType::kFloat32, Device::cpu(), 12, 2, 32);
  a.out = make_view(out.data(), DType::kFloat32, Device::cpu(), 9, 4, 32);
  a.cu_seqlens_q = make_view(cu_q.data(), DType::kInt32, Device::cpu(), 4);
  a.cu_seqlens_k = make_view(cu_k.data(), DType::kInt32, Device::cpu(), 4);
  a.seqused_k = make_view(used_k.data(), DType::kInt32, Device::cpu(), 3);
  a.max_seqlen_q = 5;
  a.max_seqlen_k = 6;
  a.learnable_sink = make_view(sink.data(), DType::kFloat32, Device::cpu(), 4);
  a.causal = true;
  const detail::Problem want = detail::validate(a), got = check::make_problem(a);
  EXPECT_EQ(got.batch, want.batch);
  EXPECT_EQ(got.seqlen_q, want.seqlen_q);
  EXPECT_EQ(got.seqlen_k, want.seqlen_k);
  EXPECT_EQ(got.total_q, want.total_q);
  EXPECT_EQ(got.total_k, want.total_k);
  EXPECT_EQ(got.heads, want.heads);
  EXPECT_EQ(got.heads_kv, want.heads_kv);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.head_dim_v, want.head_dim_v);
  EXPECT_EQ(want.head_dim_v, 32);
  EXPECT_EQ(got.cu_seqlens_q, want.cu_seqlens_q);
  EXPECT_EQ(got.cu_seqlens_k, want.cu_seqlens_k);
  EXPECT_EQ(got.seqused_q, want.seqused_q);
  EXPECT_EQ(got.seqused_k, want.seqused_k);
  EXPECT_EQ(got.learnable_sink, want.learnable_sink);
  EXPECT_EQ(got.window_right, want.window_right);
}

}  // namespace
}  // namespace flash4
