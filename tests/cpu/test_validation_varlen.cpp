// Bad packed-batch and sink arguments are rejected before any work: flash4::Error(kInvalidArgument) with a
// message naming the argument, and outputs left untouched. Host-resident offsets are checked value by value;
// CUDA-resident ones are never read on the host.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "api/backends.h"
#include "common/validation_case.h"
#include "flash4/api.h"

namespace flash4 {
namespace {

constexpr unsigned char kSentinel = 0xA5;

// Host buffer holding one tensor of any rank; outputs start filled with the sentinel.
struct Buffer {
  std::vector<unsigned char> bytes;
  TensorView view;

  Buffer(DType dtype, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    bytes.assign(static_cast<size_t>(n * dtype_size(dtype)) + 1, kSentinel);  // +1: never a null data()
    const int64_t* d = shape.begin();
    switch (shape.size()) {
      case 1: view = make_view(bytes.data(), dtype, Device::cpu(), d[0]); break;
      case 2: view = make_view(bytes.data(), dtype, Device::cpu(), d[0], d[1]); break;
      case 3: view = make_view(bytes.data(), dtype, Device::cpu(), d[0], d[1], d[2]); break;
      default: view = make_view(bytes.data(), dtype, Device::cpu(), d[0], d[1], d[2], d[3]); break;
    }
  }
  Buffer(const std::vector<int>& values) : Buffer(DType::kInt32, {static_cast<int64_t>(values.size())}) {
    std::memcpy(bytes.data(), values.data(), values.size() * sizeof(int));
  }
  bool untouched() const {
    for (unsigned char b : bytes)
      if (b != kSentinel) return false;
    return true;
  }
};

// Segments q {3, 0, 4} (total 7), k {5, 2, 1} (total 8), heads 4, heads_kv 2, head_dim 16, bf16.
constexpr DType kBF16 = DType::kBFloat16, kF32 = DType::kFloat32;

struct Packed {
  Buffer q{kBF16, {7, 4, 16}}, k{kBF16, {8, 2, 16}}, v{kBF16, {8, 2, 16}};
  Buffer cu_q{std::vector<int>{0, 3, 3, 7}}, cu_k{std::vector<int>{0, 5, 7, 8}};
  Buffer sink{kF32, {4}};
  template <typename Args>
  void fill(Args& a) {
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    a.cu_seqlens_q = cu_q.view;
    a.cu_seqlens_k = cu_k.view;
    a.max_seqlen_q = 4;
    a.max_seqlen_k = 5;
  }
};

struct ForwardCase : Packed {
  Buffer out{kBF16, {7, 4, 16}}, lse{kF32, {4, 7}};
  ForwardArgs args;
  ForwardCase() {
    fill(args);
    args.out = out.view;
    args.lse = lse.view;
  }
  bool outputs_untouched() const { return out.untouched() && lse.untouched(); }
};

struct BackwardCase : Packed {
  Buffer dout{kBF16, {7, 4, 16}}, out{kBF16, {7, 4, 16}}, lse{kF32, {4, 7}};
  Buffer dq{kBF16, {7, 4, 16}}, dk{kBF16, {8, 2, 16}}, dv{kBF16, {8, 2, 16}}, dsink{kF32, {4}};
  BackwardArgs args;
  BackwardCase() {
    fill(args);
    args.dout = dout.view;
    args.out = out.view;
    args.lse = lse.view;
    args.dq = dq.view;
    args.dk = dk.view;
    args.dv = dv.view;
  }
  bool outputs_untouched() const { return dq.untouched() && dk.untouched() && dv.untouched() && dsink.untouched(); }
};

using validation_test::expect_invalid;

TEST(ValidateVarlen, ValidInputGivesThePackedProblem) {
  ForwardCase c;
  c.args.learnable_sink = c.sink.view;
  const detail::Problem p = detail::validate(c.args);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.seqlen_q, 4);
  EXPECT_EQ(p.seqlen_k, 5);
  EXPECT_EQ(p.total_q, 7);
  EXPECT_EQ(p.total_k, 8);
  EXPECT_EQ(p.heads, 4);
  EXPECT_EQ(p.heads_kv, 2);
  EXPECT_EQ(p.head_dim, 16);
  EXPECT_TRUE(p.varlen());
  EXPECT_EQ(p.cu_seqlens_q, c.args.cu_seqlens_q.data);
  EXPECT_EQ(p.learnable_sink, c.args.learnable_sink.data);
  EXPECT_EQ(p.layout().info(2).q_offset, 3);
  EXPECT_EQ(p.layout().info(2).seqlen_k, 1);
  BackwardCase b;
  EXPECT_NO_THROW((void)detail::validate(b.args));
}

TEST(ValidateVarlen, DenseProblemsHaveTotals) {
  Buffer q{kBF16, {2, 5, 4, 16}}, k{kBF16, {2, 7, 2, 16}}, out{kBF16, {2, 5, 4, 16}};
  ForwardArgs a;
  a.q = q.view, a.k = k.view, a.v = k.view, a.out = out.view;
  const detail::Problem p = detail::validate(a);
  EXPECT_FALSE(p.varlen());
  EXPECT_EQ(p.total_q, 10);
  EXPECT_EQ(p.total_k, 14);
}

TEST(ValidateVarlen, NeedsBothOffsets) {
  ForwardCase c;
  c.args.cu_seqlens_k = TensorView{};
  expect_invalid(c, {"cu_seqlens_q is set but cu_seqlens_k is not"});
  ForwardCase c2;
  c2.args.cu_seqlens_q = TensorView{};
  expect_invalid(c2, {"cu_seqlens_k is set but cu_seqlens_q is not"});
}

TEST(ValidateVarlen, RejectsBadOffsetTensors) {
  ForwardCase c;
  c.args.cu_seqlens_q.dtype = kF32;
  expect_invalid(c, {"cu_seqlens_q.dtype is fp32 but must be int32"});
  ForwardCase c2;
  c2.args.cu_seqlens_k.rank = 2;
  c2.args.cu_seqlens_k.shape[1] = 1;
  expect_invalid(c2, {"cu_seqlens_k must have rank 1"});
  ForwardCase c3;
  c3.args.cu_seqlens_k.shape[0] = 3;
  expect_invalid(c3, {"cu_seqlens_k.shape[0] (batch + 1) = 3 but expected 4"});
  ForwardCase c4;
  c4.args.cu_seqlens_q.device = Device::cuda(0);
  expect_invalid(c4, {"cu_seqlens_q is on cuda:0 but q is on cpu"});
  ForwardCase c5;
  c5.args.cu_seqlens_q.shape[0] = 2;
  c5.args.cu_seqlens_q.stride[0] = 2;  // every other element
  expect_invalid(c5, {"cu_seqlens_q.stride[0] = 2", "contiguous"});
  ForwardCase c6;
  c6.args.cu_seqlens_q.shape[0] = 0;
  expect_invalid(c6, {"cu_seqlens_q.shape[0] (batch + 1) = 0"});
}

TEST(ValidateVarlen, RejectsBadMaxSeqlen) {
  ForwardCase c;
  c.args.max_seqlen_q = 0;
  expect_invalid(c, {"max_seqlen_q = 0 but the packed tensor has 7 rows"});
  ForwardCase c2;
  c2.args.max_seqlen_k = -1;
  expect_invalid(c2, {"max_seqlen_k = -1 must be in [0, 2^31 - 1]"});
  ForwardCase c3;
  c3.args.max_seqlen_q = 3;
  expect_invalid(c3, {"segment 2 of cu_seqlens_q has 4 tokens but max_seqlen_q = 3"});
  ForwardCase c4;
  c4.args.max_seqlen_k = 4;
  expect_invalid(c4, {"segment 0 of cu_seqlens_k has 5 tokens but max_seqlen_k = 4"});
  // max_seqlen only means something with cu_seqlens.
  Buffer q{kBF16, {2, 5, 4, 16}}, k{kBF16, {2, 7, 2, 16}}, out{kBF16, {2, 5, 4, 16}};
  ForwardCase dense;
  dense.args = ForwardArgs{};
  dense.args.q = q.view, dense.args.k = k.view, dense.args.v = k.view, dense.args.out = out.view;
  dense.args.max_seqlen_q = 5;
  expect_invalid(dense, {"max_seqlen_q = 5", "only used with cu_seqlens"});
}

TEST(ValidateVarlen, RejectsBadHostOffsets) {
  ForwardCase c;
  static_cast<int*>(c.args.cu_seqlens_q.data)[2] = 2;  // 0, 3, 2, 7
  expect_invalid(c, {"cu_seqlens_q must be non-decreasing", "cu_seqlens_q[2] = 2 < cu_seqlens_q[1] = 3"});
  ForwardCase c2;
  static_cast<int*>(c2.args.cu_seqlens_k.data)[0] = 1;
  expect_invalid(c2, {"cu_seqlens_k[0] = 1 but must be 0"});
  ForwardCase c3;
  static_cast<int*>(c3.args.cu_seqlens_q.data)[3] = 8;  // 4 tokens past total 7? no: segment 5 > max 4 first
  c3.args.max_seqlen_q = 5;
  expect_invalid(c3, {"cu_seqlens_q[3] = 8 exceeds q.shape[0] (total_q) = 7"});
}

TEST(ValidateVarlen, RejectsDenseShapesInPackedMode) {
  ForwardCase c;
  Buffer q4{kBF16, {1, 7, 4, 16}};
  c.args.q = q4.view;
  expect_invalid(c, {"q must have rank 3"});
  ForwardCase c2;
  Buffer lse3{kF32, {3, 4, 4}};
  c2.args.lse = lse3.view;
  expect_invalid(c2, {"lse must have rank 2"});
  ForwardCase c3;
  Buffer lse_t{kF32, {7, 4}};
  c3.args.lse = lse_t.view;
  expect_invalid(c3, {"lse.shape[0] (heads) = 7 but expected 4", "(heads, total_q)"});
  ForwardCase c4;
  Buffer out{kBF16, {6, 4, 16}};
  c4.args.out = out.view;
  expect_invalid(c4, {"out.shape[0] (total) = 6 but q.shape[0] = 7"});
  ForwardCase c5;
  Buffer qi{DType::kInt32, {7, 4, 16}};
  c5.args.q = qi.view;
  c5.args.k.dtype = c5.args.v.dtype = c5.args.out.dtype = DType::kInt32;
  expect_invalid(c5, {"q.dtype is int32 but must be fp32, fp16 or bf16"});
}

TEST(ValidateVarlen, RejectsBadSeqused) {
  ForwardCase c;
  Buffer used{std::vector<int>{3, 0}};
  c.args.seqused_k = used.view;
  expect_invalid(c, {"seqused_k.shape[0] (batch) = 2 but expected 3"});
  ForwardCase c2;
  Buffer used2{std::vector<int>{3, 1, 2}};
  c2.args.seqused_k = used2.view;
  expect_invalid(c2, {"seqused_k[2] = 2 but must be in [0, 1]"});
  ForwardCase c3;
  Buffer used3{std::vector<int>{-1, 0, 4}};
  c3.args.seqused_q = used3.view;
  expect_invalid(c3, {"seqused_q[0] = -1"});
  ForwardCase c4;
  Buffer used4{kF32, {3}};
  c4.args.seqused_q = used4.view;
  expect_invalid(c4, {"seqused_q.dtype is fp32 but must be int32"});
  // Dense mode takes seqused too: lengths per batch entry, bounded by seqlen.
  Buffer q{kBF16, {2, 5, 4, 16}}, k{kBF16, {2, 7, 2, 16}}, out{kBF16, {2, 5, 4, 16}};
  Buffer used5{std::vector<int>{7, 8}};
  ForwardCase dense;
  dense.args = ForwardArgs{};
  dense.args.q = q.view, dense.args.k = k.view, dense.args.v = k.view, dense.args.out = out.view;
  dense.args.seqused_k = used5.view;
  expect_invalid(dense, {"seqused_k[1] = 8 but must be in [0, 7]"});
}

TEST(ValidateVarlen, RejectsBadSink) {
  ForwardCase c;
  Buffer sink{kBF16, {4}};
  c.args.learnable_sink = sink.view;
  expect_invalid(c, {"learnable_sink.dtype is bf16 but must be fp32"});
  ForwardCase c2;
  Buffer sink2{kF32, {2}};
  c2.args.learnable_sink = sink2.view;
  expect_invalid(c2, {"learnable_sink.shape[0] (heads) = 2 but expected 4"});
  ForwardCase c3;
  Buffer sink3{kF32, {4, 1}};
  c3.args.learnable_sink = sink3.view;
  expect_invalid(c3, {"learnable_sink must have rank 1"});
  ForwardCase c4;
  c4.args.learnable_sink = c4.sink.view;
  c4.args.learnable_sink.device = Device::cuda(0);
  expect_invalid(c4, {"learnable_sink is on cuda:0 but q is on cpu"});
}

TEST(ValidateVarlen, RejectsOutputsAliasingTheNewInputs) {
  ForwardCase c;
  c.args.learnable_sink = c.sink.view;
  c.args.learnable_sink.data = c.out.bytes.data();  // (offsets inside out would be read as offsets first)
  expect_invalid(c, {"out overlaps learnable_sink"});
  ForwardCase c2;
  c2.args.cu_seqlens_k.data = c2.lse.bytes.data();
  std::memcpy(c2.lse.bytes.data(), c2.cu_k.bytes.data(), 16);
  try {
    forward(c2.args);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lse overlaps cu_seqlens_k"), std::string::npos) << e.what();
  }
  BackwardCase b;
  b.args.learnable_sink = b.sink.view;
  b.args.dsink = b.sink.view;
  b.args.dsink.data = b.sink.bytes.data();
  expect_invalid(b, {"dsink overlaps learnable_sink"});
}

TEST(ValidateVarlen, RejectsBadDsink) {
  BackwardCase b;
  b.args.dsink = b.dsink.view;
  expect_invalid(b, {"dsink is set but learnable_sink is not"});
  BackwardCase b2;
  Buffer dsink{kF32, {3}};
  b2.args.learnable_sink = b2.sink.view;
  b2.args.dsink = dsink.view;
  expect_invalid(b2, {"dsink.shape[0] (heads) = 3 but expected 4"});
  BackwardCase b3;
  Buffer lse{kF32, {4, 6}};
  b3.args.lse = lse.view;
  expect_invalid(b3, {"lse.shape[1] (total_q) = 6 but expected 7"});
}

// CUDA-resident offsets are not read on the host (that would need a synchronisation): validation passes with
// pointers the host cannot dereference, and the GPU path reports what it cannot run yet.
TEST(ValidateVarlen, CudaOffsetsAreNotReadOnTheHost) {
  ForwardCase c;
  for (TensorView* t : {&c.args.q, &c.args.k, &c.args.v, &c.args.out, &c.args.lse, &c.args.cu_seqlens_q,
                        &c.args.cu_seqlens_k}) {
    t->device = Device::cuda(0);
  }
  int bogus = 0;
  c.args.cu_seqlens_q.data = reinterpret_cast<void*>(uintptr_t{16});  // never dereferenced
  c.args.cu_seqlens_k.data = &bogus + 1;
  EXPECT_NO_THROW((void)detail::validate(c.args));
  const Support s = can_implement(c.args);
  EXPECT_FALSE(s.ok);
  try {
    forward(c.args);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
  }
  EXPECT_TRUE(c.outputs_untouched());
}

}  // namespace
}  // namespace flash4
