// Bad FP8 forward input is rejected before any work, naming the argument, outputs untouched: FP8 q with bf16 k
// (and the reverse), an FP8 or fp32 out, descales of the wrong shape, dtype or device, descales without FP8, and
// FP8 in the backward. The Hopper dispatch refuses FP8 (checked on a GPU by tests/gpu/test_forward.cu).
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "api/backends.h"
#include "flash4/api.h"

namespace flash4 {
namespace {

constexpr int64_t kBatch = 2, kSeq = 5, kHeads = 4, kHeadsKv = 2, kDim = 16;

// A valid FP8 forward on the CPU (zeros in, out bf16), outputs holding a sentinel.
struct Fp8Call {
  std::vector<uint8_t> q = std::vector<uint8_t>(kBatch * kSeq * kHeads * kDim),
                       kv = std::vector<uint8_t>(kBatch * kSeq * kHeadsKv * kDim);
  std::vector<uint16_t> out = std::vector<uint16_t>(kBatch * kSeq * kHeads * kDim, 0xA5A5);
  std::vector<float> lse = std::vector<float>(kBatch * kHeads * kSeq, -7.0f);
  std::vector<float> descale = std::vector<float>(kBatch * kHeadsKv + 8, 0.5f);
  ForwardArgs args;

  Fp8Call() {
    const Device cpu = Device::cpu();
    args.q = make_view(q.data(), DType::kFloat8E4M3, cpu, kBatch, kSeq, kHeads, kDim);
    args.k = args.v = make_view(kv.data(), DType::kFloat8E4M3, cpu, kBatch, kSeq, kHeadsKv, kDim);
    args.out = make_view(out.data(), DType::kBFloat16, cpu, kBatch, kSeq, kHeads, kDim);
    args.lse = make_view(lse.data(), DType::kFloat32, cpu, kBatch, kHeads, kSeq);
    args.q_descale = args.k_descale = args.v_descale =
        make_view(descale.data(), DType::kFloat32, cpu, kBatch, kHeadsKv);
  }
  bool untouched() const {
    for (uint16_t x : out)
      if (x != 0xA5A5) return false;
    for (float x : lse)
      if (x != -7.0f) return false;
    return true;
  }
};

void expect_invalid(const Fp8Call& c, std::initializer_list<std::string> substrings) {
  try {
    forward(c.args);
    ADD_FAILURE() << "no error for an invalid input";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    for (const std::string& s : substrings) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
  EXPECT_TRUE(c.untouched());
  EXPECT_THROW((void)can_implement(c.args), Error);
}

TEST(ValidateFp8, ValidCallRunsAndFillsTheDescales) {
  Fp8Call c;
  const detail::Problem p = detail::validate(c.args);
  EXPECT_EQ(p.q_descale.data, c.descale.data());
  EXPECT_EQ(p.v_descale.at(1, 1), 0.5f);
  EXPECT_TRUE(can_implement(c.args));  // the CPU runs FP8
  forward(c.args);
  EXPECT_FALSE(c.untouched());
  c.args.out.dtype = DType::kFloat16;  // fp16 output too
  EXPECT_NO_THROW(forward(c.args));
  c.args.q_descale = c.args.k_descale = c.args.v_descale = TensorView{};  // descales are optional
  EXPECT_NO_THROW(forward(c.args));
}

TEST(ValidateFp8, RejectsMixedFp8AndSixteenBitInputs) {
  Fp8Call c;
  c.args.k.dtype = DType::kBFloat16;
  expect_invalid(c, {"k.dtype is bf16 but q.dtype is float8_e4m3fn"});
  Fp8Call c2;
  c2.args.q.dtype = DType::kBFloat16;
  c2.args.q_descale = c2.args.k_descale = c2.args.v_descale = TensorView{};
  expect_invalid(c2, {"k.dtype is float8_e4m3fn but q.dtype is bf16"});
}

TEST(ValidateFp8, OutputIsBf16OrFp16) {
  for (DType bad : {DType::kFloat8E4M3, DType::kFloat32}) {
    Fp8Call c;
    c.args.out.dtype = bad;
    expect_invalid(c, {std::string("out.dtype is ") + dtype_name(bad), "FP8 (float8_e4m3fn) forward writes bf16 or fp16"});
  }
}

TEST(ValidateFp8, RejectsBadDescales) {
  Fp8Call c;
  c.args.k_descale.shape[1] = 3;
  expect_invalid(c, {"k_descale.shape[1] (heads_kv) = 3 but expected 2", "(batch, heads_kv)"});
  Fp8Call c2;
  c2.args.q_descale = make_view(c2.descale.data(), DType::kFloat32, Device::cpu(), kBatch * kHeadsKv);
  expect_invalid(c2, {"q_descale must have rank 2"});
  Fp8Call c3;
  c3.args.v_descale.dtype = DType::kBFloat16;
  expect_invalid(c3, {"v_descale.dtype is bf16 but must be fp32"});
  Fp8Call c4;
  c4.args.v_descale.shape[0] = 1;
  expect_invalid(c4, {"v_descale.shape[0] (batch) = 1 but expected 2"});
  Fp8Call c5;
  c5.args.q_descale.device = Device::cuda(0);
  expect_invalid(c5, {"q_descale is on cuda:0 but q is on cpu"});
}

TEST(ValidateFp8, DescalesNeedFp8Inputs) {
  std::vector<uint16_t> q(kBatch * kSeq * kHeads * kDim), kv(kBatch * kSeq * kHeadsKv * kDim);
  Fp8Call c;
  c.args.q = make_view(q.data(), DType::kBFloat16, Device::cpu(), kBatch, kSeq, kHeads, kDim);
  c.args.k = c.args.v = make_view(kv.data(), DType::kBFloat16, Device::cpu(), kBatch, kSeq, kHeadsKv, kDim);
  c.args.q_descale = c.args.v_descale = TensorView{};
  expect_invalid(c, {"k_descale is set but q.dtype is bf16", "float8_e4m3fn"});
}

TEST(ValidateFp8, BackwardTakesNoFp8) {
  Fp8Call c;
  std::vector<uint8_t> dq(c.q.size(), 0xA5), dkv(c.kv.size(), 0xA5);
  BackwardArgs b;
  b.q = b.dout = b.out = c.args.q;
  b.k = b.v = c.args.k;
  b.lse = c.args.lse;
  b.dq = make_view(dq.data(), DType::kFloat8E4M3, Device::cpu(), kBatch, kSeq, kHeads, kDim);
  b.dk = b.dv = make_view(dkv.data(), DType::kFloat8E4M3, Device::cpu(), kBatch, kSeq, kHeadsKv, kDim);
  try {
    backward(b);
    ADD_FAILURE() << "no error for FP8 in the backward";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("q.dtype is float8_e4m3fn but the backward takes"), std::string::npos)
        << e.what();
  }
  for (uint8_t x : dq) ASSERT_EQ(x, 0xA5);
}

}  // namespace
}  // namespace flash4
