// The Hopper forward's tile table (src/kernels/sm90/fwd/fwd_config.h) is plain constexpr data shared by the host
// dispatch and the kernel; these checks run on any machine, so a table edit that breaks a hardware budget or the
// host/kernel agreement fails CI rather than a launch on the H200.
#include <gtest/gtest.h>

#include "kernels/sm90/fwd/fwd_config.h"

namespace flash4::sm90 {
namespace {

constexpr int kSmemLimit = 232448;  // per-block opt-in maximum of sm_90
constexpr int kHeadDims[] = {64, 96, 128, 192, 256};

void check_config(const FwdTileConfig& c, int head_dim) {
  SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", tile " + std::to_string(c.block_m) + " x " +
               std::to_string(c.block_n));
  EXPECT_EQ(c.block_m % 64, 0) << "64 query rows per consumer warpgroup";
  const int consumers = fwd_consumer_warpgroups(c);
  EXPECT_TRUE(consumers == 2 || consumers == 3);
  EXPECT_EQ(fwd_threads(c), 128 * (1 + consumers));
  EXPECT_EQ(c.block_n % 16, 0) << "wgmma N and the P V k-steps";
  EXPECT_LE(c.block_n, 256) << "TMA box rows";
  EXPECT_LE(c.block_m, 256) << "TMA box rows";
  EXPECT_GE(c.stages, 2) << "the K/V ring needs two slots to overlap loads";
  EXPECT_LE(fwd_smem_bytes(c, head_dim), kSmemLimit);
  EXPECT_TRUE(c.poly_exp2_per_8 >= 0 && c.poly_exp2_per_8 < 8) << "the last exp of every 8 stays on MUFU";
  // Accumulator registers per consumer thread: O (d / 2) + S (block_n / 2) + P (block_n / 4) must leave room
  // in the setmaxnreg budget (240 with two consumers, 160 with three).
  const int accumulators = head_dim / 2 + c.block_n / 2 + c.block_n / 4;
  EXPECT_LE(accumulators, consumers == 3 ? 160 - 24 : 240 - 48);
}

TEST(FwdConfig, EveryTableEntryFitsTheHardware) {
  for (int d : kHeadDims) {
    for (bool masked : {false, true}) check_config(fwd_tile_config(d, masked), d);
    if (fwd_has_short_config(d, true)) check_config(fwd_short_tile_config(d), d);
  }
}

// (192, 128) has a kernel of its own: its tile fits the registers (O at v's width) and shared memory (V tiles at
// v's width); other pairs run on the q / k width's kernel with v zero-padded.
TEST(FwdConfig, SplitKernelFitsTheHardware) {
  EXPECT_TRUE(fwd_has_split_kernel(192, 128));
  EXPECT_FALSE(fwd_has_split_kernel(192, 192));
  EXPECT_FALSE(fwd_has_split_kernel(128, 64));
  const FwdTileConfig c = fwd_split_tile_config(192, 128);
  EXPECT_LE(128 / 2 + c.block_n / 2 + c.block_n / 4, 240 - 48);
  EXPECT_LE(c.block_m * 192 * 2 + c.stages * c.block_n * (192 + 128) * 2 + 1024 + 512, kSmemLimit);
  const FwdLaunchConfig split = fwd_launch_config(192, 128, true, 4096);
  EXPECT_EQ(split.tile.block_n, c.block_n);
  EXPECT_FALSE(split.short_tile);
  EXPECT_EQ(split.persistent, fwd_launch_persistent(192, true, 4096));
  EXPECT_EQ(fwd_launch_config(128, 128, false, 4096).tile.block_n, fwd_launch_config(128, false, 4096).tile.block_n);
}

// d = 96 keeps whole 64-column swizzle chunks in shared memory: its tiles cost what d = 128's do.
TEST(FwdConfig, HeadDim96IsStoredAsTwoChunks) {
  EXPECT_EQ(fwd_smem_head_dim(96), 128);
  EXPECT_EQ(fwd_smem_head_dim(192), 192);
  const FwdTileConfig c = fwd_tile_config(128, true);
  EXPECT_EQ(fwd_smem_bytes_with(c, 96, 1), fwd_smem_bytes_with(c, 128, 1));
}

// The cross-tile overlap (two Q buffers) runs only at d = 128, where it pays (docs/performance.md, 3.4 and 3.12).
TEST(FwdConfig, CrossTileOverlapAtHeadDim128Only) {
  for (bool masked : {false, true}) {
    EXPECT_TRUE(fwd_cross_tile(fwd_tile_config(128, masked), 128));
    EXPECT_EQ(fwd_q_buffers(fwd_tile_config(128, masked), 128), 2);
    EXPECT_FALSE(fwd_cross_tile(fwd_tile_config(64, masked), 64));
    EXPECT_FALSE(fwd_cross_tile(fwd_tile_config(256, masked), 256));
    EXPECT_EQ(fwd_q_buffers(fwd_tile_config(256, masked), 256), 1);
    EXPECT_GT(fwd_smem_bytes_with(fwd_tile_config(256, masked), 256, 2), kSmemLimit);
  }
  EXPECT_FALSE(fwd_cross_tile(fwd_short_tile_config(64), 64));
}

TEST(FwdConfig, ShortConfigOnlyWhereCompiledAndOnlyForShortMaskedProblems) {
  for (int d : kHeadDims) {
    EXPECT_FALSE(fwd_use_short_config(d, false, 512)) << "unmasked problems always use the table";
    EXPECT_FALSE(fwd_use_short_config(d, true, 1 << 20)) << "long problems always use the table";
    for (int sq : {1, 512, 1024, 2048, 2049, 4096}) {
      const bool short_cfg = fwd_use_short_config(d, true, sq);
      if (short_cfg) EXPECT_TRUE(fwd_has_short_config(d, true));
      const FwdLaunchConfig launch = fwd_launch_config(d, true, sq);
      EXPECT_EQ(launch.short_tile, short_cfg);
      EXPECT_EQ(launch.persistent, fwd_launch_persistent(d, true, sq));
      const FwdTileConfig chosen = launch.tile;
      const FwdTileConfig expected = short_cfg ? fwd_short_tile_config(d) : fwd_tile_config(d, true);
      EXPECT_EQ(chosen.block_m, expected.block_m);
      EXPECT_EQ(chosen.block_n, expected.block_n);
    }
  }
}

TEST(FwdConfig, PersistentForUnmaskedAndShortMaskedProblems) {
  for (int d : {64, 128, 256}) EXPECT_TRUE(fwd_launch_persistent(d, false, 1 << 20));
  EXPECT_TRUE(fwd_launch_persistent(128, true, 8192));
  EXPECT_FALSE(fwd_launch_persistent(128, true, 8193));
  EXPECT_TRUE(fwd_launch_persistent(256, true, 2048));
  EXPECT_FALSE(fwd_launch_persistent(256, true, 2049));
  EXPECT_TRUE(fwd_launch_persistent(64, true, 8192));
  EXPECT_FALSE(fwd_launch_persistent(64, true, 8193));
}

}  // namespace
}  // namespace flash4::sm90
