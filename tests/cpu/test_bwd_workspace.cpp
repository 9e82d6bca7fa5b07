// The backward's workspace (src/kernels/sm90/bwd/bwd_workspace.h, plain C++): one allocation whose parts are
// 256-byte aligned, in order, disjoint and large enough for what they hold, with absent parts taking no bytes;
// and the layout of the dQ accumulator's rows in fragment order (bwd_params.h).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_workspace.h"

namespace {

using flash4::sm90::bwd::BwdWorkspaceLayout;
using flash4::sm90::bwd::BwdWorkspaceNeeds;
using flash4::sm90::bwd::bwd_workspace_layout;

struct Part {
  const char* name;
  size_t offset, bytes_needed;
};

// Every part in allocation order with the bytes it must hold.
std::vector<Part> parts_of(const BwdWorkspaceNeeds& n, const BwdWorkspaceLayout& l) {
  const auto f = [](int64_t count) { return static_cast<size_t>(count) * sizeof(float); };
  return {{"dq_accum", l.dq_accum, f(n.rows * n.dq_accum_cols)},
          {"dsum", l.dsum, f(n.rows)},
          {"lse_log2", l.lse_log2, f(n.rows)},
          {"semaphores", l.semaphores, static_cast<size_t>(n.semaphores) * sizeof(int)},
          {"work_counter", l.work_counter, n.work_counter ? sizeof(int) : 0},
          {"dsink_partial", l.dsink_partial, f(n.dsink_partials)},
          {"dk_partial", l.dk_partial, f(n.partial_rows * n.head_dim)},
          {"dv_partial", l.dv_partial, f(n.partial_rows * n.head_dim_v)}};
}

TEST(BwdWorkspace, PartsAreAlignedOrderedDisjointAndLargeEnough) {
  int checked = 0;
  for (int64_t rows : {0, 1, 17, 4096, 1000003})
    for (int cols : {8, 64, 96, 128, 256})
      for (int64_t semaphores : {0, 1, 513})
        for (bool counter : {false, true})
          for (int64_t dsink : {0, 3, 528})
            for (int64_t partial_rows : {0, 5, 8192}) {
              const BwdWorkspaceNeeds n{rows, cols, semaphores, counter, dsink, partial_rows, cols, cols / 2};
              const BwdWorkspaceLayout l = bwd_workspace_layout(n);
              const std::vector<Part> parts = parts_of(n, l);
              EXPECT_EQ(parts.front().offset, 0u);
              for (size_t i = 0; i < parts.size(); ++i) {
                SCOPED_TRACE(parts[i].name);
                EXPECT_EQ(parts[i].offset % 256, 0u);
                const size_t end = i + 1 < parts.size() ? parts[i + 1].offset : l.bytes;
                ASSERT_LE(parts[i].offset, end);
                EXPECT_GE(end - parts[i].offset, parts[i].bytes_needed);  // room, and no overlap with the next
                EXPECT_LT(end - parts[i].offset, parts[i].bytes_needed + 256 + (end == l.bytes ? 256 : 0));
              }
              EXPECT_GE(l.bytes, 256u);  // an empty problem still gets a valid block
              EXPECT_EQ(l.semaphore_bytes, l.work_counter - l.semaphores);
              ++checked;
            }
  EXPECT_EQ(checked, 5 * 5 * 3 * 2 * 3 * 3);
}

TEST(BwdWorkspace, AbsentPartsTakeNoBytes) {
  const BwdWorkspaceLayout l = bwd_workspace_layout(BwdWorkspaceNeeds{100, 64, 0, false, 0, 0, 64, 64});
  EXPECT_EQ(l.semaphore_bytes, 0u);
  EXPECT_EQ(l.semaphores, l.work_counter);
  EXPECT_EQ(l.work_counter, l.dsink_partial);
  EXPECT_EQ(l.dsink_partial, l.dk_partial);
  EXPECT_EQ(l.dk_partial, l.dv_partial);
  EXPECT_EQ(l.dv_partial, l.bytes);
  EXPECT_EQ(l.bytes, 100 * 64 * 4 + 2 * 512u);  // 25600 bytes of dQ rows, then two 400-byte rows rounded to 512
}

// The sink gradient's slices: at least one, about 1024 row slots each, at most about 528 CTAs over all heads.
TEST(BwdWorkspace, DsinkSlicesSpreadRowsOverTheGpu) {
  using flash4::sm90::bwd::dsink_slices;
  EXPECT_EQ(dsink_slices(0, 8), 1);
  EXPECT_EQ(dsink_slices(1024, 8), 1);
  EXPECT_EQ(dsink_slices(1025, 8), 2);
  EXPECT_EQ(dsink_slices(int64_t{1} << 30, 8), 66);
  EXPECT_EQ(dsink_slices(int64_t{1} << 30, 1000), 1);
}

}  // namespace

// The fragment-order dQ accumulator (bwd_params.h): a permutation inside each 32-column block, and a thread's four
// columns of a 16-column group (2t, 2t + 1, 2t + 8, 2t + 9, as the wgmma accumulator holds them) are one 16-byte
// unit, 2t + q, in that order; so the consumers' eight 16-byte stores and the postprocess's loads agree.
TEST(BwdWorkspace, DqFragmentOrderIsAUnitPerThreadAndGroup) {
  using flash4::sm90::dq_fragment_column;
  for (int block = 0; block < 8; ++block) {
    std::vector<int> seen(32, 0);
    for (int c = 0; c < 32; ++c) {
      const int stored = dq_fragment_column(32 * block + c);
      ASSERT_GE(stored, 32 * block);
      ASSERT_LT(stored, 32 * block + 32);
      ++seen[stored - 32 * block];
    }
    for (int n : seen) EXPECT_EQ(n, 1);
  }
  for (int q = 0; q < 2; ++q) {
    for (int t = 0; t < 4; ++t) {
      const int group = 16 * q, unit = 4 * (2 * t + q);
      EXPECT_EQ(dq_fragment_column(group + 2 * t), unit);
      EXPECT_EQ(dq_fragment_column(group + 2 * t + 1), unit + 1);
      EXPECT_EQ(dq_fragment_column(group + 2 * t + 8), unit + 2);
      EXPECT_EQ(dq_fragment_column(group + 2 * t + 9), unit + 3);
    }
  }
}
