// A data pointer not aligned to its element size is refused with a message naming the tensor (found by
// fuzz/api_args_fuzzer.cpp: the CPU path's typed loads were undefined behaviour on such a pointer).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flash4/api.h"

namespace flash4 {
namespace {

TEST(ValidateAlignment, RefusesMisalignedData) {
  alignas(16) static unsigned char bytes[4 * 8 * 4 * 6 + 64];
  const Device cpu = Device::cpu();
  ForwardArgs a;
  a.q = make_view(bytes + 1 * 2, DType::kFloat32, cpu, 1, 4, 1, 8);  // 2 bytes past a float boundary
  a.k = make_view(bytes + 2 * 128, DType::kFloat32, cpu, 1, 4, 1, 8);
  a.v = make_view(bytes + 3 * 128, DType::kFloat32, cpu, 1, 4, 1, 8);
  a.out = make_view(bytes + 4 * 128, DType::kFloat32, cpu, 1, 4, 1, 8);
  const std::vector<unsigned char> before(bytes, bytes + sizeof(bytes));
  try {
    forward(a);
    FAIL() << "a misaligned q was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()), "flash4::forward: q.data is not aligned to its element size (4 bytes for fp32)");
  }
  EXPECT_EQ(before, std::vector<unsigned char>(bytes, bytes + sizeof(bytes))) << "nothing written on an error";
  a.q.data = bytes + 8;  // aligned
  EXPECT_NO_THROW(forward(a));
  a.out.data = bytes + 4 * 128 + 1;  // bf16 needs 2
  a.q.dtype = a.k.dtype = a.v.dtype = a.out.dtype = DType::kBFloat16;
  EXPECT_THROW(forward(a), Error);
  EXPECT_TRUE(can_implement(a, Validation::kWithoutBuffers).ok);  // no pointers looked at
}

}  // namespace
}  // namespace flash4
