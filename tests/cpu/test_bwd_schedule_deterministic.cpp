// The wgmma backward's deterministic schedule (src/kernels/sm90/bwd/bwd_schedule.h), on any machine:
//   * releases_before counts exactly the visible contributions of key tiles launched earlier, and a CTA
//     therefore never waits on one launched later;
//   * a simulation with few resident CTAs runs every deterministic schedule to completion (no deadlock) and ends
//     with each Q tile's semaphore at its number of visible key tiles;
//   * the rotated deterministic order (no mask, all of a head's CTAs resident): releases_before counts the CTAs
//     that reach the Q tile at an earlier step of their rotated loops, and a simulation in lockstep never waits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/bwd_schedule_case.h"
#include "kernels/sm90/bwd/bwd_item_plan.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_wgmma_config.h"

namespace flash4::sm90::bwd {
namespace {

using namespace schedule_test;

template <class Tile, bool kMasked>
void check_release_counts(const BwdParams& p) {
  for (int n = 0; n < p.n_blocks; ++n)
    for (int m = 0; m < p.m_blocks; ++m) {
      if (!tile_visible<Tile>(p, m, n)) continue;
      int earlier = 0;  // visible contributions to Q tile m from key tiles launched before n
      for (int other = 0; other < p.n_blocks; ++other)
        if (other != n && tile_visible<Tile>(p, m, other) && launch_of<kMasked>(p, other) < launch_of<kMasked>(p, n))
          ++earlier;
      ASSERT_EQ((releases_before<Tile, kMasked>(p, m, n, 2)), 2 * earlier) << "Q tile " << m << ", key tile " << n;
    }
}

template <class Tile>
void check_deterministic_waits(const char* tile_name) {
  for (const Mask& mask : kMasks)
    for (int sq : kSeqlens)
      for (int sk : kSeqlens) {
        SCOPED_TRACE(std::string(tile_name) + " " + mask.name + " sq " + std::to_string(sq) + " sk " +
                     std::to_string(sk));
        const BwdParams p = make_params<Tile>(sq, sk, mask, true);
        if (mask.masked) {
          EXPECT_EQ(key_tile_of_launch<true>(p, 0), p.n_blocks - 1) << "shortest (highest) key tile first";
          check_release_counts<Tile, true>(p);
        } else {
          check_release_counts<Tile, false>(p);
        }
      }
}

TEST(BwdSchedule, DeterministicWaitsOnlyOnEarlierLaunches) {
  check_deterministic_waits<WgmmaTile<64>>("d64");
  check_deterministic_waits<WgmmaTile<128>>("d128");
  check_deterministic_waits<WgmmaTileRoles<256>>("d256");
}

// Runs one head's deterministic schedule with `resident` CTA slots filled in launch order. Every round, each
// resident CTA whose next Q tile has all its earlier releases adds there (one release) and moves on; a finished
// CTA frees its slot for the next launch. Returns the rounds taken, or -1 on a round where nothing could move.
template <class Tile, bool kMasked>
int simulate(const BwdParams& p, int resident, std::vector<int>& semaphores) {
  struct Cta {
    int n, next;
    QRange range;
  };
  semaphores.assign(p.m_blocks, 0);
  std::vector<Cta> running;
  int launched = 0, rounds = 0;
  while (true) {
    while (static_cast<int>(running.size()) < resident && launched < p.n_blocks) {
      const int n = key_tile_of_launch<kMasked>(p, launched++);
      running.push_back({n, 0, q_range<Tile>(p, n)});
    }
    running.erase(std::remove_if(running.begin(), running.end(), [](const Cta& c) { return c.next == c.range.m_count; }),
                  running.end());
    if (running.empty() && launched == p.n_blocks) return rounds;
    if (running.empty()) continue;
    std::vector<int> adds;  // this round's releases, applied together
    for (Cta& c : running) {
      const int m = c.range.m_block(c.next);
      if (semaphores[m] == releases_before<Tile, kMasked>(p, m, c.n, 1)) {
        adds.push_back(m);
        ++c.next;
      }
    }
    if (adds.empty()) return -1;
    for (int m : adds) ++semaphores[m];
    ++rounds;
  }
}

template <class Tile, bool kMasked>
void check_simulation(const BwdParams& p) {
  for (int resident : {1, 3, 8}) {
    std::vector<int> semaphores;
    const int rounds = simulate<Tile, kMasked>(p, resident, semaphores);
    ASSERT_GE(rounds, 0) << "deadlock with " << resident << " resident CTAs";
    for (int m = 0; m < p.m_blocks; ++m) {
      int visible = 0;
      for (int n = 0; n < p.n_blocks; ++n) visible += tile_visible<Tile>(p, m, n) ? 1 : 0;
      EXPECT_EQ(semaphores[m], visible) << "Q tile " << m;
    }
  }
}

// The rotated deterministic order (det_rotated) on `Tile`: each Q tile's releases_before is the number of CTAs
// that reach it at an earlier step of their q_range loops (ties: lower n_block first), and with every CTA
// resident the simulation finishes in exactly one round per Q tile when no two CTAs start at the same tile.
template <class Tile>
void check_rotated_order(const char* tile_name) {
  const Mask none = kMasks[0];
  for (int sq : {1, 17, 128, 300, 1000, 1013, 2048, 4097})
    for (int sk : {1, 64, 129, 300, 1000, 2048, 4097}) {
      SCOPED_TRACE(std::string(tile_name) + " sq " + std::to_string(sq) + " sk " + std::to_string(sk));
      BwdParams p = make_params<Tile>(sq, sk, none, true);
      p.det_rotated = true;
      std::vector<QRange> ranges;
      for (int n = 0; n < p.n_blocks; ++n) ranges.push_back(q_range<Tile>(p, n));
      auto step_of = [&](int n, int m) {
        for (int i = 0; i < ranges[n].m_count; ++i)
          if (ranges[n].m_block(i) == m) return i;
        return -1;
      };
      for (int m = 0; m < p.m_blocks; ++m)
        for (int n = 0; n < p.n_blocks; ++n) {
          const int step = step_of(n, m);
          ASSERT_GE(step, 0) << "every key tile sees every Q tile without a mask";
          int earlier = 0;
          for (int other = 0; other < p.n_blocks; ++other) {
            const int s = step_of(other, m);
            if (s < step || (s == step && other < n)) ++earlier;
          }
          ASSERT_EQ((releases_before<Tile, false>(p, m, n, 2)), 2 * earlier) << "Q tile " << m << ", key tile " << n;
        }
      std::vector<int> semaphores;
      const int rounds = simulate<Tile, false>(p, p.n_blocks, semaphores);
      ASSERT_GE(rounds, 0) << "deadlock with all CTAs resident";
      if (p.n_blocks <= p.m_blocks) EXPECT_EQ(rounds, p.m_blocks) << "a CTA waited";
      for (int m = 0; m < p.m_blocks; ++m) EXPECT_EQ(semaphores[m], p.n_blocks) << "Q tile " << m;
    }
}

TEST(BwdSchedule, RotatedDeterministicOrderFollowsArrival) {
  check_rotated_order<WgmmaTile<64>>("d64");
  check_rotated_order<WgmmaTile<128>>("d128");
  check_rotated_order<WgmmaTileRoles<256>>("d256");
}

TEST(BwdSchedule, DeterministicScheduleCompletesWithFewResidentCtas) {
  for (const Mask& mask : kMasks)
    for (int sq : {1, 129, 1000, 4097})
      for (int sk : {17, 300, 1013, 4097}) {
        SCOPED_TRACE(std::string(mask.name) + " sq " + std::to_string(sq) + " sk " + std::to_string(sk));
        const BwdParams p64 = make_params<WgmmaTile<64>>(sq, sk, mask, true);
        const BwdParams p256 = make_params<WgmmaTileRoles<256>>(sq, sk, mask, true);
        if (mask.masked) {
          check_simulation<WgmmaTile<64>, true>(p64);
          check_simulation<WgmmaTileRoles<256>, true>(p256);
        } else {
          check_simulation<WgmmaTile<64>, false>(p64);
          check_simulation<WgmmaTileRoles<256>, false>(p256);
        }
      }
}

// The whole one-item-per-CTA grid of a deterministic launch with GQA groups split into parts (det_group_parts):
// CTAs launched in block order (item_grid's x fastest) while fewer than `resident` run, each looping over its
// part's query heads and Q tiles and adding into a (batch, query head, Q tile) semaphore when its releases_before
// is reached. Returns the rounds to completion, -1 on a deadlock; `semaphores` ends with every count.
template <class Tile, bool kMasked>
int simulate_grid(const BwdParams& p, int resident, std::vector<int>& semaphores) {
  struct Cta {
    int n, b, h_first, heads, head, next;
    QRange range;
  };
  const GridDims dims = item_grid(p);
  const long long ctas = static_cast<long long>(dims.x) * dims.y * dims.z;
  semaphores.assign(static_cast<size_t>(p.batch) * p.heads * p.m_blocks, 0);
  std::vector<Cta> running;
  long long launched = 0;
  int rounds = 0;
  while (true) {
    running.erase(std::remove_if(running.begin(), running.end(),
                                 [](const Cta& c) { return c.range.m_count == 0 || c.head == c.heads; }),
                  running.end());
    while (static_cast<int>(running.size()) < resident && launched < ctas) {
      const int x = static_cast<int>(launched % dims.x), y = static_cast<int>(launched / dims.x % dims.y);
      const int z = static_cast<int>(launched / (static_cast<long long>(dims.x) * dims.y));
      ++launched;
      const ItemPosition item = grid_position<kMasked>(p, x, y, z);  // as grid_item on the device
      const int n = key_tile_of_launch<kMasked>(p, item.launch);
      const GroupPart gp = group_part(p, item.slot);
      running.push_back({n, item.b, gp.h_first, gp.heads, 0, 0, q_range<Tile>(p, n)});
    }
    running.erase(std::remove_if(running.begin(), running.end(), [](const Cta& c) { return c.range.m_count == 0; }),
                  running.end());
    if (running.empty() && launched == ctas) return rounds;
    if (running.empty()) continue;
    std::vector<size_t> adds;  // this round's releases, applied together
    for (Cta& c : running) {
      const int m = c.range.m_block(c.next);
      const size_t sem = (static_cast<size_t>(c.b) * p.heads + c.h_first + c.head) * p.m_blocks + m;
      if (semaphores[sem] == releases_before<Tile, kMasked>(p, m, c.n, 1)) {
        adds.push_back(sem);
        if (++c.next == c.range.m_count) c.next = 0, ++c.head;
      }
    }
    if (adds.empty()) return -1;
    for (size_t sem : adds) ++semaphores[sem];
    ++rounds;
  }
}

// Deterministic launches with split GQA groups: no deadlock however few CTAs are resident (and, in the rotated
// order, with a slot's CTAs resident together, as det_rotates requires), every (batch, query head, Q tile) added
// into once per visible key tile, and the one-item-per-CTA grid keeps each slot's key tiles together.
TEST(BwdSchedule, DeterministicSplitGroupsCompleteWithoutDeadlock) {
  using Tile = WgmmaTile<64>;
  for (const Mask& mask : kMasks)
    for (int sq : {129, 1000})
      for (int sk : {300, 1013})
        for (auto [group, heads_kv] : {std::pair{8, 2}, std::pair{16, 1}, std::pair{4, 4}, std::pair{6, 3}})
          for (int batch : {1, 2}) {
            SCOPED_TRACE(std::string(mask.name) + " sq " + std::to_string(sq) + " sk " + std::to_string(sk) +
                         " group " + std::to_string(group) + " hkv " + std::to_string(heads_kv));
            BwdParams p = make_params<Tile>(sq, sk, mask, true);
            p.group = group;
            p.heads_kv = heads_kv;
            p.heads = group * heads_kv;
            p.batch = batch;
            p.group_parts = det_group_parts(group, heads_kv);
            ASSERT_GT(p.group_parts, 1);
            ASSERT_EQ(bwd_order_section(p, true, 2, 132), 0) << "deterministic: a slot's key tiles stay together";
            const bool rotate = !mask.masked && det_rotates(p.m_blocks, p.n_blocks, p.n_blocks);
            for (bool rotated : {false, rotate}) {
              p.det_rotated = rotated;
              // Rotated: a slot's CTAs resident together (det_rotates' condition), the fewest that allows it.
              for (int resident : rotated ? std::vector<int>{p.n_blocks, p.n_blocks + 1}
                                          : std::vector<int>{1, 3, p.n_blocks + 2}) {
                std::vector<int> semaphores;
                const int rounds = mask.masked ? simulate_grid<Tile, true>(p, resident, semaphores)
                                               : simulate_grid<Tile, false>(p, resident, semaphores);
                ASSERT_GE(rounds, 0) << "deadlock with " << resident << " resident CTAs"
                                     << (rotated ? " (rotated)" : "");
                for (int b = 0; b < batch; ++b)
                  for (int h = 0; h < p.heads; ++h)
                    for (int m = 0; m < p.m_blocks; ++m) {
                      int visible = 0;
                      for (int n = 0; n < p.n_blocks; ++n) visible += tile_visible<Tile>(p, m, n) ? 1 : 0;
                      ASSERT_EQ(semaphores[(static_cast<size_t>(b) * p.heads + h) * p.m_blocks + m], visible)
                          << "b " << b << " h " << h << " Q tile " << m;
                    }
              }
            }
          }
}

}  // namespace
}  // namespace flash4::sm90::bwd
