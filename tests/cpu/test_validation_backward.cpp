// Every bad backward input is rejected before any work, as the forward's are (test_validation.cpp), and the
// head dims of a v / out narrower or wider than q / k are checked in both directions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "api/backends.h"
#include "flash4/api.h"
#include "common/validation_case.h"

namespace flash4 {
namespace {

using namespace validation_test;

// ---- head_dim_v != head_dim ------------------------------------------------------------------------------

TEST(ValidateHeadDimV, SplitHeadDimsAreValid) {
  for (auto [d, dv] : {std::pair{192, 128}, std::pair{128, 64}, std::pair{64, 256}, std::pair{96, 8}}) {
    ForwardCase f(Shape{.head_dim = d, .head_dim_v = dv});
    const detail::Problem p = detail::validate(f.args);
    EXPECT_EQ(p.head_dim, d);
    EXPECT_EQ(p.head_dim_v, dv);
    EXPECT_EQ(p.softmax_scale, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))));  // q.k's width
    BackwardCase b(Shape{.head_dim = d, .head_dim_v = dv});
    EXPECT_EQ(detail::validate(b.args).head_dim_v, dv);
  }
}

TEST(ValidateHeadDimV, RejectsBadValueHeadDims) {
  for (int64_t dv : {4, 12, 100, 264}) {
    ForwardCase c(Shape{.head_dim = 64, .head_dim_v = dv});
    expect_invalid(c, {"v.shape[3] (head_dim) = " + std::to_string(dv), "multiple of 8 in [8, 256]"});
  }
}

TEST(ValidateHeadDimV, ForwardOutTakesVsHeadDim) {
  ForwardCase c(Shape{.head_dim = 192, .head_dim_v = 128});
  c.args.out.shape[3] = 192;  // q's head_dim, not v's
  expect_invalid(c, {"out.shape[3] (head_dim) = 192 but v.shape[3] = 128"});
  ForwardCase c2(Shape{.head_dim = 192, .head_dim_v = 128});
  c2.args.k.shape[3] = 128;  // k must keep q's
  expect_invalid(c2, {"k.shape[3] (head_dim) = 128 but q.shape[3] = 192", "q and k must share head_dim"});
}

TEST(ValidateHeadDimV, BackwardTensorsTakeTheirInputsHeadDims) {
  const Shape split{.head_dim = 192, .head_dim_v = 128};
  BackwardCase c(split);
  c.args.dout.shape[3] = 192;
  expect_invalid(c, {"dout.shape[3] (head_dim) = 192 but v.shape[3] = 128", "dout's head_dim must be v's"});
  BackwardCase c2(split);
  c2.args.out.shape[3] = 192;
  expect_invalid(c2, {"out.shape[3] (head_dim) = 192 but v.shape[3] = 128"});
  BackwardCase c3(split);
  c3.args.dv.shape[3] = 192;
  expect_invalid(c3, {"dv.shape[3] (head_dim) = 192 but v.shape[3] = 128"});
  BackwardCase c4(split);
  c4.args.dk.shape[3] = 128;
  expect_invalid(c4, {"dk.shape[3] (head_dim) = 128 but k.shape[3] = 192"});
  BackwardCase c5(split);
  c5.args.dq.shape[3] = 128;
  expect_invalid(c5, {"dq.shape[3] (head_dim) = 128 but q.shape[3] = 192"});
}

// ---- backward ---------------------------------------------------------------------------------------------------

TEST(ValidateBackward, ValidInputPassesValidation) {
  BackwardCase c;
  EXPECT_NO_THROW((void)detail::validate(c.args));
}

TEST(ValidateBackward, RejectsMismatchedDtypes) {
  BackwardCase c;
  c.args.dout.dtype = DType::kFloat16;
  expect_invalid(c, {"dout.dtype is fp16 but q.dtype is bf16"});
  BackwardCase c2;
  c2.args.dk.dtype = DType::kFloat32;
  expect_invalid(c2, {"dk.dtype"});
  BackwardCase c3;
  c3.args.lse.dtype = DType::kFloat16;
  expect_invalid(c3, {"lse.dtype", "fp32"});
}

TEST(ValidateBackward, RejectsMismatchedShapes) {
  BackwardCase c;
  c.args.dq.shape[2] = 2;
  expect_invalid(c, {"dq.shape[2] (heads)"});
  BackwardCase c2;
  c2.args.dv.shape[1] = 3;
  expect_invalid(c2, {"dv.shape[1] (seqlen)", "v.shape[1] = 7"});
  BackwardCase c3;
  c3.args.out.shape[0] = 1;
  expect_invalid(c3, {"out.shape[0] (batch)"});
  BackwardCase c4;
  c4.args.lse.shape[0] = 1;
  expect_invalid(c4, {"lse.shape[0] (batch)"});
}

TEST(ValidateBackward, RequiresLse) {
  BackwardCase c;
  c.args.lse = TensorView{};
  expect_invalid(c, {"lse must have rank 3"});
  BackwardCase c2;
  c2.args.lse.data = nullptr;
  expect_invalid(c2, {"lse.data is null"});
}

TEST(ValidateBackward, RejectsMixedDevices) {
  BackwardCase c;
  c.args.dv.device = Device::cuda(0);
  expect_invalid(c, {"dv is on cuda:0"});
}

TEST(ValidateBackward, RejectsBadScalars) {
  BackwardCase c;
  c.args.softcap = -2.0f;
  expect_invalid(c, {"softcap"});
  BackwardCase c2;
  c2.args.softmax_scale = kNaN;
  expect_invalid(c2, {"softmax_scale"});
  BackwardCase c3;
  c3.args.window_left = -5;
  expect_invalid(c3, {"window_left"});
  BackwardCase c4;
  c4.args.softcap = 3e38f;
  expect_invalid(c4, {"softcap = 3e+38", "log2(e)"});
}

TEST(ValidateBackward, RejectsGradientsAliasingEachOther) {
  BackwardCase c;
  c.args.dk.data = c.args.dq.data;
  expect_invalid(c, {"dq overlaps dk"});
  BackwardCase c2;
  c2.args.dv.data = c2.args.dk.data;
  expect_invalid(c2, {"dk overlaps dv"});
}

TEST(ValidateBackward, RejectsBroadcastGradients) {
  BackwardCase c;
  c.args.dk.stride[1] = 0;
  expect_invalid(c, {"dk.stride[1] = 0 with dk.shape[1] = 7", "must not share memory"});
  BackwardCase c2;
  c2.args.dq.stride[2] = 0;
  expect_invalid(c2, {"dq.stride[2] = 0 with dq.shape[2] = 4"});
}

TEST(ValidateBackward, RejectsGradientsAliasingInputs) {
  const std::pair<const char*, TensorView BackwardArgs::*> inputs[] = {
      {"dout", &BackwardArgs::dout}, {"q", &BackwardArgs::q},     {"k", &BackwardArgs::k},
      {"v", &BackwardArgs::v},       {"out", &BackwardArgs::out}, {"lse", &BackwardArgs::lse}};
  // Byte range of a (contiguous) view.
  auto range_of = [](const TensorView& t) {
    const auto* begin = static_cast<const char*>(t.data);
    return std::pair{begin, begin + t.numel() * dtype_size(t.dtype)};
  };
  for (const auto& [name, member] : inputs) {
    BackwardCase c;
    c.args.dv.data = (c.args.*member).data;
    // dv (the size of v) placed on a smaller input may also reach into whichever buffer the allocator put next:
    // the error must name dv and an input it really overlaps (the aliased one among them).
    const auto [dv_begin, dv_end] = range_of(c.args.dv);
    std::string overlapped;
    for (const auto& [other, other_member] : inputs) {
      const auto [begin, end] = range_of(c.args.*other_member);
      if (begin < dv_end && dv_begin < end) overlapped += std::string(" ") + other;
    }
    ASSERT_NE(overlapped.find(std::string(" ") + name), std::string::npos);
    try {
      backward(c.args);
      ADD_FAILURE() << "no error for dv aliasing " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      const std::string message = e.what();
      const size_t at = message.find("dv overlaps ");
      ASSERT_NE(at, std::string::npos) << message;
      const std::string reported = message.substr(at + 12, message.find(' ', at + 12) - (at + 12));
      EXPECT_NE((overlapped + " ").find(" " + reported + " "), std::string::npos)
          << message << " (dv overlaps:" << overlapped << ")";
    }
    EXPECT_TRUE(c.outputs_untouched());
    EXPECT_THROW((void)can_implement(c.args), Error);
  }
}

TEST(ValidateBackward, EmptyTensorsAreValid) {
  BackwardCase c(Shape{.batch = 0});
  EXPECT_NO_THROW(backward(c.args));
  EXPECT_TRUE(c.outputs_untouched());
}

TEST(ValidateBackward, NoQueriesMeansZeroKeyGradients) {
  BackwardCase c(Shape{.seqlen_q = 0});
  backward(c.args);
  for (const Buffer* b : {&c.dk, &c.dv})
    for (size_t i = 0; i + 1 < b->bytes.size(); ++i) ASSERT_EQ(b->bytes[i], 0) << i;
  BackwardCase c2(Shape{.seqlen_k = 0});
  backward(c2.args);
  for (size_t i = 0; i + 1 < c2.dq.bytes.size(); ++i) ASSERT_EQ(c2.dq.bytes[i], 0) << i;
}

}  // namespace
}  // namespace flash4
