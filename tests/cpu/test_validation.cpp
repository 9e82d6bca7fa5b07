// Every bad forward input is rejected before any work: flash4::Error(kInvalidArgument) with a message naming the
// argument, and outputs left untouched (they hold a sentinel pattern before the call and after it). The
// backward's and head_dim_v's: test_validation_backward.cpp; packed batches, alignment, FP8, KV cache: the other
// test_validation_*.cpp files.
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

// ---- forward: dtypes ---------------------------------------------------------------------------------------

// An Exp2Mode outside the named ones (a cast, or the C API's int) is refused, naming the field.
TEST(ValidateForward, RejectsAnUnknownExp2Mode) {
  for (int mode : {-1, 3, 1000}) {
    ForwardCase c;
    c.args.tuning.exp2 = static_cast<Exp2Mode>(mode);
    expect_invalid(c, {"tuning.exp2 = " + std::to_string(mode), "must be 0 (auto), 1 (exact) or 2 (polynomial)"});
  }
}

TEST(ValidateForward, ValidInputPassesValidation) {
  ForwardCase c;
  EXPECT_NO_THROW((void)detail::validate(c.args));
}

TEST(ValidateForward, RejectsMismatchedDtypes) {
  ForwardCase c;
  c.args.k.dtype = DType::kFloat16;
  expect_invalid(c, {"k.dtype is fp16 but q.dtype is bf16"});
  ForwardCase c2;
  c2.args.v.dtype = DType::kFloat32;
  expect_invalid(c2, {"v.dtype"});
  ForwardCase c3;
  c3.args.out.dtype = DType::kFloat16;
  expect_invalid(c3, {"out.dtype"});
}

TEST(ValidateForward, RejectsNonFp32Lse) {
  ForwardCase c;
  c.args.lse.dtype = DType::kBFloat16;
  expect_invalid(c, {"lse.dtype", "fp32"});
}

TEST(ValidateForward, RejectsInvalidEnumValues) {
  ForwardCase c;
  c.args.q.dtype = static_cast<DType>(7);
  expect_invalid(c, {"q.dtype", "invalid"});
  ForwardCase c2;
  c2.args.k.device.kind = static_cast<DeviceKind>(5);
  expect_invalid(c2, {"k.device.kind"});
  ForwardCase c3;
  c3.args.q.device = Device::cuda(-1);
  expect_invalid(c3, {"q.device.index"});
}

// ---- forward: shapes ---------------------------------------------------------------------------------------

TEST(ValidateForward, RejectsHeadDimMismatch) {
  ForwardCase c(Shape{.head_dim = 64});
  c.args.k.shape[3] = 80;
  expect_invalid(c, {"k.shape[3] (head_dim) = 80 but q.shape[3] = 64", "head_dim"});
}

TEST(ValidateForward, RejectsBatchMismatch) {
  ForwardCase c;
  c.args.k.shape[0] = 3;
  expect_invalid(c, {"k.shape[0] (batch)"});
}

TEST(ValidateForward, RejectsKvShapeMismatch) {
  ForwardCase c;
  c.args.v.shape[1] = 6;
  expect_invalid(c, {"v.shape[1] (seqlen) = 6", "k.shape[1] = 7"});
  ForwardCase c2;
  c2.args.v.shape[2] = 1;
  expect_invalid(c2, {"v.shape[2] (heads)"});
  ForwardCase c3;  // v may have its own head_dim, but out must then have it too
  c3.args.v.shape[3] = 8;
  expect_invalid(c3, {"out.shape[3] (head_dim) = 16 but v.shape[3] = 8", "out's head_dim must be v's"});
}

TEST(ValidateForward, RejectsOutShapeMismatch) {
  ForwardCase c;
  c.args.out.shape[1] = 4;
  expect_invalid(c, {"out.shape[1] (seqlen) = 4", "q.shape[1] = 5"});
}

TEST(ValidateForward, RejectsLseShapeMismatch) {
  ForwardCase c;
  c.args.lse.shape[2] = 6;
  expect_invalid(c, {"lse.shape[2] (seqlen_q) = 6", "expected 5"});
  ForwardCase c2;
  c2.args.lse.shape[1] = 2;
  expect_invalid(c2, {"lse.shape[1] (heads)"});
}

TEST(ValidateForward, RejectsHeadsNotMultipleOfHeadsKv) {
  ForwardCase c(Shape{.heads = 6, .heads_kv = 4});
  expect_invalid(c, {"q.shape[2] (heads) = 6", "heads_kv", "heads % heads_kv == 0"});
  ForwardCase c2(Shape{.heads = 2, .heads_kv = 4});
  expect_invalid(c2, {"heads_kv"});
  ForwardCase c3(Shape{.heads = 2, .heads_kv = 0});
  expect_invalid(c3, {"k.shape[2] (heads_kv) = 0"});
}

TEST(ValidateForward, RejectsBadHeadDims) {
  for (int64_t d : {4, 12, 36, 100, 264, 512}) {
    ForwardCase c(Shape{.head_dim = d});
    expect_invalid(c, {"head_dim) = " + std::to_string(d), "multiple of 8"});
  }
  for (int64_t d : {8, 32, 96, 256}) {
    ForwardCase c(Shape{.head_dim = d});
    EXPECT_NO_THROW((void)detail::validate(c.args)) << d;
  }
}

TEST(ValidateForward, RejectsWrongRank) {
  ForwardCase c;
  c.args.q.rank = 3;
  expect_invalid(c, {"q must have rank 4, got rank 3"});
  ForwardCase c2;
  c2.args.lse.rank = 4;
  c2.args.lse.shape[3] = 1;
  expect_invalid(c2, {"lse must have rank 3"});
}

TEST(ValidateForward, RejectsNonContiguousLastDim) {
  ForwardCase c;
  c.args.q.stride[3] = 2;
  expect_invalid(c, {"q.stride[3] = 2", "contiguous"});
  ForwardCase c2;
  c2.args.lse.stride[2] = 0;
  expect_invalid(c2, {"lse.stride[2]", "contiguous"});
}

TEST(ValidateForward, AcceptsArbitraryOuterStrides) {
  // A (batch, heads, seqlen, head_dim) memory layout seen through the (batch, seqlen, heads, head_dim) view.
  ForwardCase c;
  TensorView& q = c.args.q;
  q.stride[2] = q.shape[1] * q.shape[3];
  q.stride[1] = q.shape[3];
  EXPECT_NO_THROW((void)detail::validate(c.args));
}

TEST(ValidateForward, RejectsNullData) {
  ForwardCase c;
  c.args.v.data = nullptr;
  expect_invalid(c, {"v.data is null"});
  ForwardCase c2;
  c2.args.out.data = nullptr;
  expect_invalid(c2, {"out.data is null"});
}

TEST(ValidateForward, RejectsNegativeSizesAndStrides) {
  ForwardCase c;
  c.args.q.shape[1] = -1;
  expect_invalid(c, {"q.shape[1] (seqlen) = -1", ">= 0"});
  ForwardCase c2;
  c2.args.k.stride[0] = -16;
  expect_invalid(c2, {"k.stride[0] = -16", ">= 0"});
}

// A broadcast output (stride 0 in a dimension of size > 1, as torch's expand makes) would have every batch
// entry write the same memory, in whatever order the threads run: refused as torch refuses it. An empty one
// writes nothing and passes (EmptyTensorsAreValidAndWriteNothing).
TEST(ValidateForward, RejectsBroadcastOutputs) {
  ForwardCase c;
  c.args.out.stride[0] = 0;
  expect_invalid(c, {"out.stride[0] = 0 with out.shape[0] = 2", "must not share memory"});
  ForwardCase c2;
  c2.args.lse.stride[1] = 0;
  expect_invalid(c2, {"lse.stride[1] = 0 with lse.shape[1] = 4"});
  ForwardCase c3(Shape{.batch = 1});
  c3.args.out.stride[0] = 0;  // a size-1 dimension's stride means nothing
  EXPECT_NO_THROW(forward(c3.args));
}

// Masks take an unbounded window side as an offset of 2^41, so a sequence may have at most 2^40 - 1 tokens; a
// longer one (a broadcast k of 2^41 rows spans no memory) is refused naming the limit, not masked wrongly.
TEST(ValidateForward, RejectsSequencesBeyondTheMaskRange) {
  ForwardCase c;
  c.args.k.shape[1] = c.args.v.shape[1] = int64_t{1} << 41;
  c.args.k.stride[0] = c.args.k.stride[1] = c.args.v.stride[0] = c.args.v.stride[1] = 0;
  expect_invalid(c, {"k.shape[1] (seqlen_k) = 2199023255552 exceeds the 2^40 - 1 tokens a sequence may have"});
}

// Validation scopes come from the C API or casts too: only kFull and kWithoutBuffers are accepted.
TEST(ValidateForward, RejectsAnUnknownValidationScope) {
  ForwardCase c;
  for (int scope : {2, -1}) {
    try {
      (void)can_implement(c.args, static_cast<Validation>(scope));
      ADD_FAILURE() << "scope " << scope << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("scope = " + std::to_string(scope) + " must be 0"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ValidateForward, RejectsOverflowingSizes) {
  ForwardCase c;
  for (TensorView* t : {&c.args.q, &c.args.out}) {
    t->shape[0] = int64_t{1} << 40;
    t->shape[1] = int64_t{1} << 30;
  }
  c.args.lse.shape[0] = int64_t{1} << 40;
  expect_invalid(c, {"q is too large"});
  ForwardCase c2;
  c2.args.k.stride[0] = std::numeric_limits<int64_t>::max();
  expect_invalid(c2, {"k is too large"});
  ForwardCase c3;  // element extent fits int64, its byte count does not
  c3.args.v.stride[0] = std::numeric_limits<int64_t>::max() / 2 - 64;
  expect_invalid(c3, {"v is too large"});
}

// ---- forward: scalars ---------------------------------------------------------------------------------------

TEST(ValidateForward, RejectsBadSoftcap) {
  for (float cap : {-1.0f, kNaN, kInf}) {
    ForwardCase c;
    c.args.softcap = cap;
    expect_invalid(c, {"softcap"});
  }
}

TEST(ValidateForward, RejectsBadSoftmaxScale) {
  for (float scale : {kNaN, kInf, -kInf}) {
    ForwardCase c;
    c.args.softmax_scale = scale;
    expect_invalid(c, {"softmax_scale", "finite"});
  }
  ForwardCase c;
  c.args.softmax_scale = -0.5f;
  expect_invalid(c, {"softmax_scale", ">= 0"});
}

// The score's float32 factors (softmax_scale * log2(e), softcap * log2(e), softmax_scale / softcap) must be finite:
// an infinite factor turns every score, even a finite exact one, into NaN.
TEST(ValidateForward, RejectsScoreFactorsBeyondFloat32) {
  constexpr float kMax = std::numeric_limits<float>::max();
  ForwardCase c;
  c.args.softmax_scale = 3e38f;
  expect_invalid(c, {"softmax_scale = 3e+38", "log2(e)"});
  ForwardCase c2;
  c2.args.softcap = kMax;
  expect_invalid(c2, {"softcap = 3.40282e+38", "log2(e)"});
  ForwardCase c3;
  c3.args.softcap = 1e-45f;
  expect_invalid(c3, {"softmax_scale / softcap", "softcap = 1.4013e-45"});
  ForwardCase c4;  // a large scale is fine with a softcap: only softmax_scale / softcap multiplies q·k
  c4.args.softmax_scale = 3e38f;
  c4.args.softcap = 2.0f;
  EXPECT_NO_THROW(forward(c4.args));
}

// Tiny and huge values read as themselves in messages, not as "-0.000000" or forty digits.
TEST(ValidateForward, ScalarMessagesKeepSignificantDigits) {
  ForwardCase c;
  c.args.softcap = -1e-10f;
  expect_invalid(c, {"softcap = -1e-10 must be"});
  ForwardCase c2;
  c2.args.softmax_scale = -2.5e-8f;
  expect_invalid(c2, {"softmax_scale = -2.5e-08 must be"});
}

TEST(ValidateForward, RejectsWindowBelowMinusOne) {
  ForwardCase c;
  c.args.window_left = -2;
  expect_invalid(c, {"window_left = -2"});
  ForwardCase c2;
  c2.args.window_right = -3;
  expect_invalid(c2, {"window_right = -3"});
}

// ---- forward: devices and aliasing --------------------------------------------------------------------------

TEST(ValidateForward, RejectsMixedDevices) {
  ForwardCase c;
  c.args.k.device = Device::cuda(0);
  expect_invalid(c, {"k is on cuda:0 but q is on cpu"});
  ForwardCase c2;
  c2.args.lse.device = Device::cuda(1);
  expect_invalid(c2, {"lse is on cuda:1"});
  ForwardCase c3;
  for (TensorView* t : {&c3.args.q, &c3.args.k, &c3.args.v, &c3.args.out}) t->device = Device::cuda(0);
  c3.args.lse.device = Device::cuda(1);
  expect_invalid(c3, {"lse is on cuda:1 but q is on cuda:0"});
}

TEST(ValidateForward, RejectsOutAliasingInputs) {
  ForwardCase c;
  c.args.out.data = c.args.q.data;
  expect_invalid(c, {"out overlaps q"});
  ForwardCase c2;  // partial overlap: out starts inside v
  c2.args.v = c2.args.out;
  c2.args.v.data = static_cast<char*>(c2.args.out.data) - 2;
  c2.args.v.shape[1] = 7;
  c2.args.v.shape[2] = 2;
  c2.args.v.stride[0] = 7 * 2 * 16;
  c2.args.v.stride[1] = 2 * 16;
  expect_invalid(c2, {"out overlaps v"});
}

TEST(ValidateForward, RejectsLseAliasing) {
  ForwardCase c;
  c.args.lse.data = c.args.k.data;
  expect_invalid(c, {"lse overlaps k"});
  ForwardCase c2;
  c2.args.lse.data = c2.args.out.data;
  expect_invalid(c2, {"lse overlaps out"});
}

TEST(ValidateForward, AllowsAliasedInputs) {
  // Self-attention with k and v the same tensor is fine: only outputs may not alias.
  ForwardCase c;
  c.args.v.data = c.args.k.data;
  EXPECT_NO_THROW((void)detail::validate(c.args));
}

// ---- forward: normalization -----------------------------------------------------------------------------------

TEST(ValidateForward, ResolvesDefaultsAndFoldsCausal) {
  ForwardCase c(Shape{.head_dim = 64});
  detail::Problem p = detail::validate(c.args);
  EXPECT_FLOAT_EQ(p.softmax_scale, 0.125f);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen_q, 5);
  EXPECT_EQ(p.seqlen_k, 7);
  EXPECT_EQ(p.heads, 4);
  EXPECT_EQ(p.heads_kv, 2);
  EXPECT_EQ(p.head_dim, 64);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
  EXPECT_FALSE(p.causal);

  c.args.causal = true;
  p = detail::validate(c.args);
  EXPECT_TRUE(p.causal);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, 0);

  c.args.window_left = 3;
  c.args.window_right = 5;  // causal caps the right bound at the diagonal
  c.args.softmax_scale = 0.5f;
  c.args.softcap = 30.0f;
  p = detail::validate(c.args);
  EXPECT_EQ(p.window_left, 3);
  EXPECT_EQ(p.window_right, 0);
  EXPECT_FLOAT_EQ(p.softmax_scale, 0.5f);
  EXPECT_FLOAT_EQ(p.softcap, 30.0f);

  c.args.causal = false;
  p = detail::validate(c.args);
  EXPECT_EQ(p.window_right, 5);
}

TEST(ValidateForward, LseIsOptional) {
  ForwardCase c;
  c.args.lse = TensorView{};
  EXPECT_NO_THROW((void)detail::validate(c.args));
  c.args.lse.shape[0] = 2;  // a shape without data is a request for lse with a null pointer
  EXPECT_THROW((void)detail::validate(c.args), Error);
}

// ---- forward: empty tensors ------------------------------------------------------------------------------------

TEST(ValidateForward, EmptyTensorsAreValidAndWriteNothing) {
  for (Shape s : {Shape{.batch = 0}, Shape{.seqlen_q = 0}, Shape{.heads = 0, .heads_kv = 1}}) {
    ForwardCase c(s);
    EXPECT_NO_THROW(forward(c.args));
    EXPECT_TRUE(c.outputs_untouched());
    // Null pointers are fine when there are no elements.
    for (TensorView* t : {&c.args.q, &c.args.out, &c.args.lse}) t->data = nullptr;
    if (s.batch == 0) c.args.k.data = c.args.v.data = nullptr;
    EXPECT_NO_THROW(forward(c.args));
    EXPECT_TRUE(can_implement(c.args).ok);
  }
}

TEST(ValidateForward, NoKeysMeansFullyMaskedRows) {
  ForwardCase c(Shape{.seqlen_k = 0});
  c.args.k.data = c.args.v.data = nullptr;
  forward(c.args);
  for (size_t i = 0; i + 1 < c.out.bytes.size(); ++i) ASSERT_EQ(c.out.bytes[i], 0) << i;
  const float* lse = reinterpret_cast<const float*>(c.lse.bytes.data());
  for (int64_t i = 0; i < c.args.lse.numel(); ++i) EXPECT_EQ(lse[i], -kInf);
}

}  // namespace
}  // namespace flash4
