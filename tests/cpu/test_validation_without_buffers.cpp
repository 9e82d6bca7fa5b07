// can_implement(args, Validation::kWithoutBuffers): a configuration is checked before its memory exists (null
// data, no aliasing check) with the same messages, while forward/backward still refuse null data.
#include <gtest/gtest.h>

#include <string>

#include "flash4/api.h"

namespace flash4 {
namespace {

ForwardArgs unallocated_forward(int64_t head_dim) {
  const Device cpu = Device::cpu();
  ForwardArgs a;
  a.q = make_view(nullptr, DType::kBFloat16, cpu, 2, 100, 4, head_dim);
  a.k = make_view(nullptr, DType::kBFloat16, cpu, 2, 130, 2, head_dim);
  a.v = a.k;
  a.out = a.q;  // the same (null) buffer as q: aliasing is not looked at without buffers
  a.lse = make_view(nullptr, DType::kFloat32, cpu, 2, 4, 100);
  return a;
}

std::string error_of(const ForwardArgs& a, Validation scope) {
  try {
    (void)can_implement(a, scope);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(ValidateWithoutBuffers, AcceptsNullDataAndSharedBuffers) {
  EXPECT_TRUE(can_implement(unallocated_forward(64), Validation::kWithoutBuffers).ok);
  EXPECT_EQ(error_of(unallocated_forward(64), Validation::kFull),
            "flash4::forward: q.data is null but q has 51200 elements");
}

TEST(ValidateWithoutBuffers, StillChecksShapesAndValues) {
  EXPECT_EQ(error_of(unallocated_forward(1000), Validation::kWithoutBuffers),
            "flash4::forward: q.shape[3] (head_dim) = 1000 but head_dim must be a multiple of 8 in [8, 256]");
  ForwardArgs a = unallocated_forward(64);
  a.softcap = -1.0f;
  EXPECT_NE(error_of(a, Validation::kWithoutBuffers).find("softcap"), std::string::npos);
  a = unallocated_forward(64);
  a.q = make_view(nullptr, DType::kBFloat16, Device::cpu(), int64_t{1} << 62, int64_t{1} << 62, 4, 64);
  EXPECT_NE(error_of(a, Validation::kWithoutBuffers).find("q is too large"), std::string::npos);
}

TEST(ValidateWithoutBuffers, BackwardToo) {
  const ForwardArgs f = unallocated_forward(64);
  BackwardArgs b;
  b.dout = b.q = b.out = b.dq = f.q;
  b.k = b.v = b.dk = b.dv = f.k;
  b.lse = f.lse;
  EXPECT_TRUE(can_implement(b, Validation::kWithoutBuffers).ok);
  EXPECT_THROW((void)can_implement(b), Error);
  EXPECT_THROW(backward(b), Error);
}

}  // namespace
}  // namespace flash4
