// The forward's tile order (src/kernels/sm90/fwd/fwd_tile_scheduler.h) is plain host/device code: every order
// must visit each (m_block, head, batch) tile exactly once, and the masked order must start the longest tiles
// of a section first.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/sm90/fwd/fwd_tile_scheduler.h"

namespace flash4::sm90 {
namespace {

template <bool kMasked>
void check_bijection(const FwdTileScheduler<kMasked>& s) {
  SCOPED_TRACE("m_blocks " + std::to_string(s.num_m_blocks) + ", heads " + std::to_string(s.heads) + ", batch " +
               std::to_string(s.batch) + ", section " + std::to_string(s.section));
  std::vector<int> seen(static_cast<size_t>(s.total()), 0);
  for (int t = 0; t < s.total(); ++t) {
    const FwdTile tile = s.tile(t);
    ASSERT_TRUE(tile.m_block >= 0 && tile.m_block < s.num_m_blocks) << "t " << t;
    ASSERT_TRUE(tile.head >= 0 && tile.head < s.heads) << "t " << t;
    ASSERT_TRUE(tile.batch >= 0 && tile.batch < s.batch) << "t " << t;
    ++seen[static_cast<size_t>((tile.batch * s.heads + tile.head) * s.num_m_blocks + tile.m_block)];
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "tile " << i;
}

TEST(FwdTileScheduler, EveryOrderVisitsEachTileOnce) {
  for (int m : {1, 2, 7, 64})
    for (int heads : {1, 3, 8})
      for (int batch : {1, 2, 5}) {
        check_bijection(FwdTileScheduler<false>{m, heads, batch, 1});
        for (int section : {1, 2, 3, 4, 8, 16, 40}) check_bijection(FwdTileScheduler<true>{m, heads, batch, section});
      }
}

// Within a section the masked order is level-major: all of the section's longest m-blocks (the last, under a
// causal mask) before any second longest; sections follow each other.
TEST(FwdTileScheduler, MaskedOrderIsLongestFirstWithinASection) {
  const FwdTileScheduler<true> s{5, 4, 3, 8};  // 12 (batch, head) pairs: sections of 8 and 4
  for (int t = 0; t < s.total(); ++t) {
    const FwdTile tile = s.tile(t);
    const int pair = tile.batch * s.heads + tile.head;
    const bool first_section = t < 8 * 5;
    EXPECT_EQ(pair < 8, first_section) << "t " << t;
    const int width = first_section ? 8 : 4, start = first_section ? 0 : 40;
    EXPECT_EQ(tile.m_block, 4 - (t - start) / width) << "t " << t;
  }
  // A section of one pair is head-major, each head's m-blocks longest first.
  const FwdTileScheduler<true> head_major{3, 2, 1, 1};
  const FwdTile first = head_major.tile(0), fourth = head_major.tile(3);
  EXPECT_EQ(first.head, 0);
  EXPECT_EQ(first.m_block, 2);
  EXPECT_EQ(fourth.head, 1);
  EXPECT_EQ(fourth.m_block, 2);
}

TEST(FwdTileScheduler, SectionHoldsTheKeysAndValuesThatFitTheBudget) {
  // d = 128 bf16, 8k keys: 4 MB of K and V per kv head, 8 of them in 32 MB.
  EXPECT_EQ(fwd_tile_section(1024, 1, 8192, 128, 128, 2), 8);
  EXPECT_EQ(fwd_tile_section(1024, 4, 8192, 128, 128, 2), 32) << "a kv head's K/V serve its whole group";
  EXPECT_EQ(fwd_tile_section(6, 1, 8192, 128, 128, 2), 6) << "never more than the pairs";
  EXPECT_EQ(fwd_tile_section(64, 1, 1 << 20, 256, 256, 2), 1) << "at least one pair";
  EXPECT_EQ(fwd_tile_section(64, 8, 1 << 20, 256, 256, 2), 8) << "at least one kv head's group";
  EXPECT_EQ(fwd_tile_section(64, 1, 0, 128, 128, 2), 64) << "no keys: one section";
  EXPECT_EQ(fwd_tile_section(0, 1, 128, 128, 128, 2), 1);
}

}  // namespace
}  // namespace flash4::sm90
