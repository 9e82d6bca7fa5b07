// Every bad input is rejected before any work: flash4::Error(kInvalidArgument) with a message naming the
// argument, and outputs left untouched (they hold a sentinel pattern before the call and after it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/backends.h"
#include "flash4/api.h"

namespace flash4 {
namespace {

constexpr unsigned char kSentinel = 0xA5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Host buffer holding one tensor; outputs start filled with the sentinel.
struct Buffer {
  std::vector<unsigned char> bytes;
  TensorView view;

  Buffer(DType dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3 = -1) {
    const int64_t n = d0 * d1 * d2 * (d3 < 0 ? 1 : d3);
    bytes.assign(static_cast<size_t>(n * dtype_size(dtype)) + 1, kSentinel);  // +1: never a null data()
    view = d3 < 0 ? make_view(bytes.data(), dtype, Device::cpu(), d0, d1, d2)
                  : make_view(bytes.data(), dtype, Device::cpu(), d0, d1, d2, d3);
  }
  bool untouched() const {
    for (unsigned char b : bytes)
      if (b != kSentinel) return false;
    return true;
  }
};

struct Shape {
  int64_t batch = 2, seqlen_q = 5, seqlen_k = 7, heads = 4, heads_kv = 2, head_dim = 16;
  DType dtype = DType::kBFloat16;
  int64_t head_dim_v = 0;  // v's, out's (and dout's, dv's) head dim; 0 = head_dim
  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

struct ForwardCase {
  Buffer q, k, v, out, lse;
  ForwardArgs args;

  explicit ForwardCase(Shape s = {})
      : q(s.dtype, s.batch, s.seqlen_q, s.heads, s.head_dim),
        k(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim),
        v(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.dv()),
        out(s.dtype, s.batch, s.seqlen_q, s.heads, s.dv()),
        lse(DType::kFloat32, s.batch, s.heads, s.seqlen_q) {
    args.q = q.view;
    args.k = k.view;
    args.v = v.view;
    args.out = out.view;
    args.lse = lse.view;
  }
  bool outputs_untouched() const { return out.untouched() && lse.untouched(); }
};

struct BackwardCase {
  Buffer dout, q, k, v, out, lse, dq, dk, dv;
  BackwardArgs args;

  explicit BackwardCase(Shape s = {})
      : dout(s.dtype, s.batch, s.seqlen_q, s.heads, s.dv()),
        q(s.dtype, s.batch, s.seqlen_q, s.heads, s.head_dim),
        k(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim),
        v(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.dv()),
        out(s.dtype, s.batch, s.seqlen_q, s.heads, s.dv()),
        lse(DType::kFloat32, s.batch, s.heads, s.seqlen_q),
        dq(s.dtype, s.batch, s.seqlen_q, s.heads, s.head_dim),
        dk(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim),
        dv(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.dv()) {
    args.dout = dout.view;
    args.q = q.view;
    args.k = k.view;
    args.v = v.view;
    args.out = out.view;
    args.lse = lse.view;
    args.dq = dq.view;
    args.dk = dk.view;
    args.dv = dv.view;
  }
  bool outputs_untouched() const { return dq.untouched() && dk.untouched() && dv.untouched(); }
};

// Runs the entry point and checks the status, that the message contains every substring, and that no output
// was written. can_implement must reject the same input the same way.
template <typename Case>
void expect_invalid(const Case& c, std::initializer_list<std::string> substrings) {
  const bool is_forward = std::is_same_v<Case, ForwardCase>;
  try {
    if constexpr (std::is_same_v<Case, ForwardCase>) {
      forward(c.args);
    } else {
      backward(c.args);
    }
    ADD_FAILURE() << "no error for an invalid input";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(is_forward ? "flash4::forward: " : "flash4::backward: ", 0), 0u) << message;
    for (const std::string& s : substrings) EXPECT_NE(message.find(s), std::string::npos) << message;
  }
  EXPECT_TRUE(c.outputs_untouched());
  EXPECT_THROW((void)can_implement(c.args), Error);
  EXPECT_TRUE(c.outputs_untouched());
}

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
