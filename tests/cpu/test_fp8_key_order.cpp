// The FP8 forward's key renumbering (src/kernels/sm90/fwd/fwd_fp8_key_order.h) against the register layouts of
// PTX's wgmma: S's f32 accumulator (m64nN: element e of a thread is row g + 8 ((e / 2) % 2), column
// 8 (e / 4) + 2 (lane % 4) + e % 2) and an e4m3 A fragment (m64nNk32: register r byte i is row g + 8 (r % 2),
// column 4 (lane % 4) + 16 (r / 2) + i). Every byte of P's A fragment must carry, from the thread's own
// accumulator, the element of its row whose key V^T's column of that A column holds; then P V sums exactly the
// products P[row][key] * V[key][:].
#include <gtest/gtest.h>

#include <vector>

#include "kernels/sm90/fwd/fwd_fp8_key_order.h"

namespace flash4::test {
namespace {

using sm90::fp8::key_of_column;
using sm90::fp8::p_fragment_element;

TEST(Fp8KeyOrder, PFragmentsAndTransposedVAgree) {
  for (int t = 0; t < 4; ++t) {      // lane % 4; the row group g = lane / 4 is the same on both sides
    for (int r = 0; r < 4; ++r) {    // A register
      for (int i = 0; i < 4; ++i) {  // byte
        const int a_column = 4 * t + 16 * (r / 2) + i, a_row_half = r % 2;
        const int e = p_fragment_element(r, i);
        ASSERT_GE(e, 0);
        ASSERT_LT(e, 16);
        const int acc_key = 8 * (e / 4) + 2 * t + e % 2, acc_row_half = (e / 2) % 2;
        EXPECT_EQ(acc_row_half, a_row_half) << "t " << t << " r " << r << " i " << i;
        EXPECT_EQ(key_of_column(a_column), acc_key) << "t " << t << " r " << r << " i " << i;
      }
    }
  }
}

TEST(Fp8KeyOrder, EachSixteenKeysArePermuted) {
  std::vector<int> seen(256, 0);
  for (int c = 0; c < 256; ++c) {
    const int k = key_of_column(c);
    ASSERT_GE(k, c - c % 16);
    ASSERT_LT(k, c - c % 16 + 16);
    ++seen[k];
  }
  for (int k = 0; k < 256; ++k) EXPECT_EQ(seen[k], 1) << k;
  // Every accumulator element of a thread's k-step is used once by its four registers.
  std::vector<int> used(16, 0);
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 4; ++i) ++used[p_fragment_element(r, i)];
  for (int e = 0; e < 16; ++e) EXPECT_EQ(used[e], 1) << e;
}

}  // namespace
}  // namespace flash4::test
