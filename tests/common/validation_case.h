// Fixtures of the validation tests (tests/cpu/test_validation_*.cpp): host buffers that start filled with a
// sentinel byte, one attention problem's forward or backward arguments over them, and expect_invalid, which
// checks that an entry point refuses the arguments with kInvalidArgument, a message naming what is wrong, and
// no output written (can_implement refusing them the same way).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "flash4/api.h"

namespace flash4::validation_test {

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

// Runs the entry point of `c.args` (ForwardArgs or BackwardArgs) and checks the status, that the message contains
// every substring, and that no output was written (`c.outputs_untouched()`). can_implement must reject the same
// input the same way. Any case type with those two members serves (test_validation_varlen.cpp's packed ones too).
template <typename Case>
void expect_invalid(const Case& c, std::initializer_list<std::string> substrings) {
  constexpr bool is_forward = std::is_same_v<std::decay_t<decltype(c.args)>, ForwardArgs>;
  try {
    if constexpr (is_forward) {
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

}  // namespace flash4::validation_test
