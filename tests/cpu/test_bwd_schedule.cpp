// The wgmma backward's schedule (src/kernels/sm90/bwd/bwd_schedule.h) is plain C++ shared by the host and the
// kernels; these checks run on any machine (the deterministic order's: test_bwd_schedule_deterministic.cpp):
//   * tile_visible agrees with a brute-force scan of the tile, q_range visits exactly the visible Q tiles of a
//     key tile, each once (also with the non-deterministic rotation), and k_range holds exactly the key tiles a Q
//     tile sees;
//   * work_item numbers every (key tile, kv head, batch) once, each pair's key tiles in key_tile_of_launch's order;
//   * tile_visible, tile_needs_mask, k_range and q_range agree with the common mask policy (common/mask.h:
//     SequenceMask::block_visible, block_needs_mask, key_tiles, query_tiles);
//   * bwd_persistent_pays picks persistent CTAs exactly for the shapes where they were measured to win;
//   * the GQA group split and the dQ writers' hand-over across a persistent CTA's items.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/mask.h"
#include "kernels/sm90/bwd/bwd_item_plan.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_wgmma_config.h"
#include "common/bwd_schedule_case.h"

namespace flash4::sm90::bwd {
namespace {

using namespace schedule_test;

template <class Tile>
void check_ranges(const char* tile_name) {
  for (const Mask& mask : kMasks)
    for (int sq : kSeqlens)
      for (int sk : kSeqlens)
        for (bool deterministic : {false, true}) {
          const BwdParams p = make_params<Tile>(sq, sk, mask, deterministic);
          SCOPED_TRACE(std::string(tile_name) + " " + mask.name + " sq " + std::to_string(sq) + " sk " +
                       std::to_string(sk) + (deterministic ? " deterministic" : ""));
          for (int n = 0; n < p.n_blocks; ++n) {
            std::vector<int> expected, visited;
            for (int m = 0; m < p.m_blocks; ++m) {
              ASSERT_EQ(tile_visible<Tile>(p, m, n), visible_brute_force<Tile>(p, m, n)) << "tile " << m << ", " << n;
              if (tile_visible<Tile>(p, m, n)) expected.push_back(m);
            }
            const QRange range = q_range<Tile>(p, n);
            if (deterministic) EXPECT_EQ(range.m_first, 0) << "deterministic mode visits Q tiles in order";
            for (int i = 0; i < range.m_count; ++i) visited.push_back(range.m_block(i));
            std::sort(visited.begin(), visited.end());
            EXPECT_EQ(visited, expected) << "key tile " << n;
          }
          // k_range: exactly the key tiles each Q tile sees (an interval).
          for (int m = 0; m < p.m_blocks; ++m) {
            const KRange keys = k_range<Tile>(p, m);
            for (int n = 0; n < p.n_blocks; ++n)
              ASSERT_EQ(n >= keys.n_lo && n <= keys.n_hi, visible_brute_force<Tile>(p, m, n))
                  << "Q tile " << m << ", key tile " << n << " (k_range " << keys.n_lo << ".." << keys.n_hi << ")";
          }
        }
}

TEST(BwdSchedule, QRangeVisitsExactlyTheVisibleTiles) {
  check_ranges<WgmmaTile<64>>("d64");
  check_ranges<WgmmaTile<128>>("d128");
  check_ranges<WgmmaTileRoles<256>>("d256");
}

// The consumers' stepped loop position is the divided one: head it / m_count, step it % m_count.
TEST(BwdSchedule, QStepMatchesDivision) {
  for (int m_count : {1, 2, 3, 7, 64})
    for (int m_first : {0, m_count / 2, m_count - 1}) {
      const QRange range{5, m_count, m_first};
      QStep at;
      for (int it = 0; it < 4 * m_count + 3; ++it, at.advance(range)) {
        ASSERT_EQ(at.head, it / m_count) << "m_count " << m_count << ", step " << it;
        ASSERT_EQ(at.step, it % m_count) << "m_count " << m_count << ", step " << it;
      }
    }
}

// The schedule's tile questions, asked in the kernels' int band, give the answers of the common mask policy
// (SequenceMask, 64-bit band): the same tiles visible, the same tiles cut, the same key / query tile ranges. The
// kernels' tiles are full: tile_needs_mask looks at all kBlockM rows and kBlockN keys of a tile.
template <class Tile>
void check_against_sequence_mask(const char* tile_name) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  const Mask masks[] = {kMasks[0], kMasks[1], kMasks[2], kMasks[3], {"right20", true, -1, 20},
                        {"left0_open", true, 0, -1}, {"band0_0", true, 0, 0}};
  for (const Mask& mask : masks)
    for (int sq : kSeqlens)
      for (int sk : kSeqlens) {
        const BwdParams p = make_params<Tile>(sq, sk, mask, false);
        const detail::SequenceMask band = sequence_mask(sq, sk, mask);
        SCOPED_TRACE(std::string(tile_name) + " " + mask.name + " sq " + std::to_string(sq) + " sk " +
                     std::to_string(sk));
        for (int m = 0; m < p.m_blocks; ++m) {
          const int64_t i0 = int64_t{m} * kBlockM, i1 = std::min<int64_t>(i0 + kBlockM, sq) - 1;
          const KRange keys = k_range<Tile>(p, m);
          const detail::IndexRange key_tiles = band.key_tiles(i0, i1, kBlockN);
          if (key_tiles.empty()) {
            EXPECT_GT(keys.n_lo, keys.n_hi) << "Q tile " << m;
          } else {
            EXPECT_EQ(keys.n_lo, key_tiles.lo) << "Q tile " << m;
            EXPECT_EQ(keys.n_hi, key_tiles.hi) << "Q tile " << m;
          }
          for (int n = 0; n < p.n_blocks; ++n) {
            const int64_t j0 = int64_t{n} * kBlockN, j1 = std::min<int64_t>(j0 + kBlockN, sk) - 1;
            ASSERT_EQ(tile_visible<Tile>(p, m, n), band.block_visible(i0, i1, j0, j1)) << "tile " << m << ", " << n;
            const bool cut = band.block_needs_mask(i0, i0 + kBlockM - 1, j0, j0 + kBlockN - 1);
            ASSERT_EQ((tile_needs_mask<kBlockM, kBlockN, true>(p, static_cast<int>(i0), static_cast<int>(j0))), cut)
                << "tile " << m << ", " << n;
            if (!mask.masked) {
              ASSERT_EQ((tile_needs_mask<kBlockM, kBlockN, false>(p, static_cast<int>(i0), static_cast<int>(j0))), cut)
                  << "tile " << m << ", " << n;
            }
          }
        }
        for (int n = 0; n < p.n_blocks; ++n) {
          const int64_t j0 = int64_t{n} * kBlockN, j1 = std::min<int64_t>(j0 + kBlockN, sk) - 1;
          const QRange rows = q_range<Tile>(p, n);
          const detail::IndexRange query_tiles = band.query_tiles(j0, j1, kBlockM);
          EXPECT_EQ(rows.m_count, query_tiles.count()) << "key tile " << n;
          if (!query_tiles.empty()) EXPECT_EQ(rows.m_lo, query_tiles.lo) << "key tile " << n;
        }
      }
}

TEST(BwdSchedule, TileQuestionsAgreeWithTheSequenceMask) {
  check_against_sequence_mask<WgmmaTile<64>>("d64");
  check_against_sequence_mask<WgmmaTile<128>>("d128");
  check_against_sequence_mask<WgmmaTileRoles<256>>("d256");
}

// The persistent / one-per-item choice at the shapes it was measured on (16k tokens, group 1: at d = 128
// persistent CTAs win on short items, at d = 64 at every length; docs/performance.md), and for short windows
// and GQA.
TEST(BwdSchedule, PersistentCtasWhereItemsAreShort) {
  const Mask& none = kMasks[0];
  const Mask& causal = kMasks[1];
  struct Case {
    int head_dim, seqlen;
    const Mask* mask;
    int group;
    bool persistent;
  };
  const Case cases[] = {{64, 512, &none, 1, true},     {64, 1024, &none, 1, true},    {64, 2048, &none, 1, true},
                        {64, 4096, &none, 1, true},    {64, 16384, &none, 1, true},  {64, 4096, &causal, 1, true},
                        {64, 8192, &causal, 1, true}, {128, 1024, &none, 1, true},   {128, 2048, &none, 1, false},
                        {128, 2048, &causal, 1, true}, {128, 4096, &causal, 1, false}, {128, 512, &none, 2, true},
                        {128, 512, &none, 4, false},   {128, 16384, &kMasks[3], 1, true}};
  for (const Case& c : cases) {
    const BwdParams p = c.head_dim == 64 ? make_params<WgmmaTile<64>>(c.seqlen, c.seqlen, *c.mask, false)
                                         : make_params<WgmmaTile<128>>(c.seqlen, c.seqlen, *c.mask, false);
    BwdParams g = p;
    g.group = c.group;
    const int block_m = c.head_dim == 64 ? WgmmaTile<64>::kBlockM : WgmmaTile<128>::kBlockM;
    EXPECT_EQ(bwd_persistent_pays(g, block_m), c.persistent)
        << "d=" << c.head_dim << " s=" << c.seqlen << " mask=" << c.mask->name << " group=" << c.group;
  }
}

// work_item numbers every (key tile, kv slot, batch) once, with each pair's key tiles in key_tile_of_launch's
// order as w grows (what deterministic waits assume on the one-item-per-CTA grid, and what a persistent CTA's
// increasing stride keeps); with a split GQA group, the slots' query heads cover each kv head's group once. In
// the slots-first order (order_section > 0) every pair of a section takes its step s before any takes s + 1,
// and the sections follow one another; the one-item-per-CTA grid (item_grid, grid_position) runs the same order.
TEST(BwdSchedule, WorkItemsCoverEveryTileOnce) {
  for (int n_blocks : {1, 3, 32})
    for (int heads_kv : {1, 5})
      for (int batch : {1, 3})
        for (int parts : {1, 2, 4})
          for (bool deterministic : {false, true})
            for (bool masked : {false, true})
              for (int section : {0, 1, 2, 7, 1000}) {
                if ((deterministic || !masked) && section > 0) continue;  // never so (bwd_order_section)
                BwdParams p;
                p.order_section = section;
                p.n_blocks = n_blocks;
                p.heads_kv = heads_kv;
                p.group = 4;
                p.heads = heads_kv * p.group;
                p.group_parts = parts;
                p.batch = batch;
                p.deterministic = deterministic;
                const int slots = heads_kv * parts;
                ASSERT_EQ(kv_slots(p), slots);
                ASSERT_EQ(work_items(p), static_cast<long long>(n_blocks) * slots * batch);
                std::vector<int> seen(static_cast<size_t>(work_items(p)), 0), steps(slots * batch, 0);
                std::vector<int> head_seen(static_cast<size_t>(p.heads * batch * n_blocks), 0);
                const GridDims dims = item_grid(p);
                ASSERT_EQ(static_cast<long long>(dims.x) * dims.y * dims.z, work_items(p));
                long long last_rank = -1;  // (section, step) of the slots-first order, non-decreasing in w
                for (long long w = 0; w < work_items(p); ++w) {
                  const BwdWork item = masked ? work_item<true>(p, w) : work_item<false>(p, w);
                  ASSERT_TRUE(item.n_block >= 0 && item.n_block < n_blocks && item.slot >= 0 && item.slot < slots &&
                              item.b >= 0 && item.b < batch);
                  const unsigned x = static_cast<unsigned>(w % dims.x), y = static_cast<unsigned>(w / dims.x % dims.y);
                  const unsigned z = static_cast<unsigned>(w / (static_cast<long long>(dims.x) * dims.y));
                  const ItemPosition at = masked ? grid_position<true>(p, x, y, z)  // the CTA launched w-th
                                                 : grid_position<false>(p, x, y, z);
                  const int at_tile =
                      masked ? key_tile_of_launch<true>(p, at.launch) : key_tile_of_launch<false>(p, at.launch);
                  ASSERT_TRUE(at.slot == item.slot && at.b == item.b && at_tile == item.n_block)
                      << "grid position " << w;
                  const int pair = item.b * slots + item.slot;
                  if (section > 0) {
                    const long long rank = static_cast<long long>(pair / section) * n_blocks + at.launch;
                    EXPECT_GE(rank, last_rank) << "item " << w;
                    last_rank = rank;
                  }
                  ++seen[static_cast<size_t>(pair) * n_blocks + item.n_block];
                  const int expected =
                      masked ? key_tile_of_launch<true>(p, steps[pair]) : key_tile_of_launch<false>(p, steps[pair]);
                  EXPECT_EQ(item.n_block, expected) << "item " << w;
                  ++steps[pair];
                  const GroupPart gp = group_part(p, item.slot);
                  ASSERT_EQ(gp.heads, p.group / parts);
                  ASSERT_EQ(gp.hkv, item.slot / parts);
                  for (int h = gp.h_first; h < gp.h_first + gp.heads; ++h) {
                    ASSERT_TRUE(h >= gp.hkv * p.group && h < (gp.hkv + 1) * p.group) << "h " << h;
                    ++head_seen[(static_cast<size_t>(item.b) * p.heads + h) * n_blocks + item.n_block];
                  }
                }
                for (int count : seen) EXPECT_EQ(count, 1);
                for (int count : head_seen) EXPECT_EQ(count, 1);  // each (query head, key tile) in one item
              }
}

// The GQA group split (bwd_group_parts): none where it cannot pay (MHA, items that fill the GPU several times), a
// divisor of the group otherwise, and enough parts to occupy the SMs for MQA after tensor parallelism (one kv
// head, 32 key tiles); a causal mask's long first items are split further than a full mask's.
TEST(BwdSchedule, GroupSplitWhereItemsLeaveSmsIdle) {
  constexpr int kSms = 132;
  EXPECT_EQ(bwd_group_parts(32, 64, 32 * 64, 1, kSms), 1);
  EXPECT_EQ(bwd_group_parts(4 * kSms, 64, 4 * kSms * 64, 8, kSms), 1);
  // b = 1, s = 4096, 8 query heads on 1 kv head, d = 128 (64 x 128 tiles): 32 items of 64 Q tiles per head.
  const int full = bwd_group_parts(32, 64, 32 * 64, 8, kSms);
  EXPECT_EQ(full, 4);
  // Causal: key tile n sees 64 - 2n Q tiles.
  long long total = 0;
  for (int n = 0; n < 32; ++n) total += 64 - 2 * n;
  EXPECT_GE(bwd_group_parts(32, 64, total, 8, kSms), full);
  for (int group : {2, 3, 6, 7, 12, 16, 64, 256})
    for (long long items : {1LL, 10LL, 64LL, 131LL, 200LL})
      for (bool causal : {false, true}) {
        const long long total = causal ? items * 8 : items * 16;  // causal: the longest item twice the average
        const int parts = bwd_group_parts(items, 16, total, group, kSms);
        EXPECT_TRUE(parts >= 1 && group % parts == 0) << "group " << group << " items " << items;
        EXPECT_TRUE(parts == 1 || items * parts <= 4LL * kSms) << "group " << group << " items " << items;
      }
  // 128 full items already fill 132 SMs: a split would only add partials.
  EXPECT_EQ(bwd_group_parts(128, 64, 128 * 64, 8, kSms), 1);
  // Measured (docs/performance.md 4.13): b = 1, s = 4096, 32 / 4 heads, causal, d = 128: 128 items whose longest
  // holds 64 Q tiles per head; four parts ran 1.15x two.
  EXPECT_EQ(bwd_group_parts(128, 64, 4 * total, 8, kSms), 4);
  // b = 1, s = 8192, 8 / 1, causal: 64 items of up to 128 Q tiles; four parts 1.05x eight.
  long long total_8k = 0;
  for (int n = 0; n < 64; ++n) total_8k += 128 - 2 * n;
  EXPECT_EQ(bwd_group_parts(64, 128, total_8k, 8, kSms), 4);
  // b = 4, s = 4096, 16 / 4, causal, d = 64 (128 x 128 tiles): 512 items, no room for parts (4 x SMs).
  EXPECT_EQ(bwd_group_parts(512, 32, 16 * 528, 4, kSms), 1);
}

// The slots-first order's sections (bwd_order_section): none in deterministic mode, for unmasked launches or
// for more than 4 items per SM; otherwise as many (slot, batch) pairs as have their Q and dO within the budget,
// at least one.
TEST(BwdSchedule, OrderSectionsHoldTheirQueriesInL2) {
  constexpr int kSms = 132;
  BwdParams p;
  p.batch = 1;
  p.heads = 16;
  p.heads_kv = 16;
  p.group = 1;
  p.head_dim = p.head_dim_v = 128;
  p.seqlen_q = 4096;  // 2 MB of Q and dO per head
  p.n_blocks = 32;    // 512 items
  EXPECT_EQ(bwd_order_section(p, false, 2, kSms), 0);
  EXPECT_EQ(bwd_order_section(p, true, 2, kSms), 16);             // 32 MB: every pair
  EXPECT_EQ(bwd_order_section(p, true, 2, kSms, 8ll << 20), 4);   // 8 MB
  p.batch = 2;                                                    // 1024 items: many per SM
  EXPECT_EQ(bwd_order_section(p, true, 2, kSms), 0);
  p.batch = 1;
  p.seqlen_q = 1 << 20;
  EXPECT_EQ(bwd_order_section(p, true, 2, kSms), 1);
  p.seqlen_q = 4096;
  p.heads_kv = 4;
  p.group = 4;
  p.group_parts = 2;  // a slot holds two query heads: 256 items
  EXPECT_EQ(bwd_order_section(p, true, 2, kSms), 8);
  EXPECT_EQ(bwd_order_section(p, false, 2, kSms), 0);  // unmasked kernels know one order
  p.deterministic = true;
  EXPECT_EQ(bwd_order_section(p, true, 2, kSms), 0);
}

// Deterministic mode's split (det_group_parts) depends on the heads alone: the fewest parts (a divisor of the
// group) that give at least kDetGroupSlots kv slots, the whole group where none does, none for MHA or many kv
// heads.
TEST(BwdSchedule, DeterministicGroupSplitFromTheHeadsAlone) {
  EXPECT_EQ(det_group_parts(1, 1), 1);
  EXPECT_EQ(det_group_parts(1, 32), 1);
  EXPECT_EQ(det_group_parts(4, 8), 1);    // 8 kv heads: enough slots already
  EXPECT_EQ(det_group_parts(8, 2), 4);    // 16 / 2 heads: 8 slots
  EXPECT_EQ(det_group_parts(4, 4), 2);    // 16 / 4 heads: 8 slots
  EXPECT_EQ(det_group_parts(16, 1), 8);   // MQA 16: 8 slots
  EXPECT_EQ(det_group_parts(7, 1), 7);    // no divisor reaches 8 slots: the whole group
  EXPECT_EQ(det_group_parts(6, 3), 3);    // 9 slots
  for (int group = 1; group <= 64; ++group)
    for (int hkv = 1; hkv <= 16; ++hkv) {
      const int parts = det_group_parts(group, hkv);
      ASSERT_TRUE(parts >= 1 && group % parts == 0) << group << " / " << hkv;
      EXPECT_TRUE(parts == group || hkv * parts >= kDetGroupSlots) << group << " / " << hkv;
    }
}

// key_tile_steps sums q_range's Q tiles: every Q tile of a full mask, the causal staircase.
TEST(BwdSchedule, KeyTileStepsCountTheVisibleTiles) {
  using Tile = WgmmaTile<128>;
  const BwdParams full = make_params<Tile>(4096, 4096, kMasks[0], false);
  const KeyTileSteps a = key_tile_steps<Tile>(full);
  EXPECT_EQ(a.longest, 64);
  EXPECT_EQ(a.total, 32 * 64);
  const BwdParams causal = make_params<Tile>(4096, 4096, kMasks[1], false);
  const KeyTileSteps c = key_tile_steps<Tile>(causal);
  EXPECT_EQ(c.longest, 64);
  long long total = 0;
  for (int n = 0; n < 32; ++n) total += 64 - 2 * n;
  EXPECT_EQ(c.total, total);
}

// A persistent CTA's dQ staging over items of uneven length: the consumers' PipelineState-style position at each
// tile (buffer, parity) is what the writer that dq_writer_first_tile assigns computes with dq_phase, and every
// tile has exactly one writer.
TEST(BwdSchedule, DqWritersFollowTheConsumersAcrossItems) {
  for (int buffers : {1, 2})
    for (const std::vector<int>& items :
         {std::vector<int>{3, 0, 5, 1, 1, 4}, std::vector<int>{1}, std::vector<int>{2, 7, 0, 0, 3}}) {
      // Consumers: buffer / parity at each CTA tile T.
      std::vector<std::pair<int, unsigned>> staged;
      int stage = 0;
      unsigned phase = 0;
      for (int n : items)
        for (int it = 0; it < n; ++it) {
          staged.push_back({stage, phase});
          if (++stage == buffers) {
            stage = 0;
            phase ^= 1u;
          }
        }
      // Writers.
      std::vector<int> writers_of(staged.size(), 0);
      for (int writer = 0; writer < buffers; ++writer) {
        unsigned tiles_before = 0;
        for (int n : items) {
          for (int it = dq_writer_first_tile(writer, tiles_before, buffers); it < n; it += buffers) {
            const unsigned tile = tiles_before + static_cast<unsigned>(it);
            ASSERT_LT(tile, staged.size());
            EXPECT_EQ(staged[tile].first, writer) << "tile " << tile;
            EXPECT_EQ(staged[tile].second, dq_phase(tile, buffers)) << "tile " << tile;
            ++writers_of[tile];
          }
          tiles_before += static_cast<unsigned>(n);
        }
      }
      for (size_t t = 0; t < writers_of.size(); ++t) EXPECT_EQ(writers_of[t], 1) << "tile " << t;
    }
}

}  // namespace
}  // namespace flash4::sm90::bwd
