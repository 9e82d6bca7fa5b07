// The wgmma backward's schedule (src/kernels/sm90/bwd/bwd_schedule.h) is plain C++ shared by the host and the
// kernels; these checks run on any machine:
//   * tile_visible agrees with a brute-force scan of the tile, q_range visits exactly the visible Q tiles of a
//     key tile, each once (also with the non-deterministic rotation), and k_range holds exactly the key tiles a Q
//     tile sees;
//   * deterministic mode: releases_before counts exactly the visible contributions of key tiles launched earlier,
//     and a CTA therefore never waits on one launched later;
//   * work_item numbers every (key tile, kv head, batch) once, each pair's key tiles in key_tile_of_launch's order;
//   * tile_visible, tile_needs_mask, k_range and q_range agree with the common mask policy (common/mask.h:
//     SequenceMask::block_visible, block_needs_mask, key_tiles, query_tiles);
//   * bwd_persistent_pays picks persistent CTAs exactly for the shapes where they were measured to win;
//   * a simulation with few resident CTAs runs every deterministic schedule to completion (no deadlock) and ends
//     with each Q tile's semaphore at its number of visible key tiles;
//   * the rotated deterministic order (no mask, all of a head's CTAs resident): releases_before counts the CTAs
//     that reach the Q tile at an earlier step of their rotated loops, and a simulation in lockstep never waits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/mask.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_wgmma_config.h"

namespace flash4::sm90::bwd {
namespace {

struct Mask {
  const char* name;
  bool masked;
  int64_t window_left, window_right;  // -1 = unbounded, as in the public API
};

// No mask, causal (bottom-right), a left window, a two-sided window.
constexpr Mask kMasks[] = {{"none", false, -1, -1}, {"causal", true, -1, 0}, {"left32", true, 32, 0},
                           {"band70_5", true, 70, 5}};
constexpr int kSeqlens[] = {1, 17, 64, 65, 127, 128, 129, 300, 1000, 1013};

detail::SequenceMask sequence_mask(int sq, int sk, const Mask& mask) {
  return detail::SequenceMask::make(detail::AttentionMask{mask.window_left, mask.window_right}, sq, sk);
}

// BwdParams of one (seqlen_q, seqlen_k, mask) on `Tile`, as make_bwd_params fills the fields the schedule reads.
template <class Tile>
BwdParams make_params(int sq, int sk, const Mask& mask, bool deterministic) {
  BwdParams p;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.m_blocks = (sq + Tile::kBlockM - 1) / Tile::kBlockM;
  p.n_blocks = (sk + Tile::kBlockN - 1) / Tile::kBlockN;
  const detail::SequenceMask band = sequence_mask(sq, sk, mask);
  p.band_lo = clamp_band(band.band_lo);
  p.band_hi = clamp_band(band.band_hi);
  p.deterministic = deterministic;
  return p;
}

template <class Tile>
bool visible_brute_force(const BwdParams& p, int m, int n) {
  for (int i = m * Tile::kBlockM; i < std::min((m + 1) * Tile::kBlockM, p.seqlen_q); ++i)
    for (int j = n * Tile::kBlockN; j < std::min((n + 1) * Tile::kBlockN, p.seqlen_k); ++j)
      if (j - i >= p.band_lo && j - i <= p.band_hi) return true;
  return false;
}

// The launch position (blockIdx.x) of key tile n.
template <bool kMasked>
int launch_of(const BwdParams& p, int n) {
  for (int x = 0; x < p.n_blocks; ++x)
    if (key_tile_of_launch<kMasked>(p, x) == n) return x;
  return -1;
}

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
// increasing stride keeps); with a split GQA group, the slots' query heads cover each kv head's group once.
TEST(BwdSchedule, WorkItemsCoverEveryTileOnce) {
  for (int n_blocks : {1, 3, 32})
    for (int heads_kv : {1, 5})
      for (int batch : {1, 3})
        for (int parts : {1, 2, 4})
          for (bool deterministic : {false, true})
            for (bool masked : {false, true}) {
              BwdParams p;
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
              for (long long w = 0; w < work_items(p); ++w) {
                const BwdWork item = masked ? work_item<true>(p, w) : work_item<false>(p, w);
                ASSERT_TRUE(item.n_block >= 0 && item.n_block < n_blocks && item.slot >= 0 && item.slot < slots &&
                            item.b >= 0 && item.b < batch);
                const int pair = item.b * slots + item.slot;
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

// The GQA group split (bwd_group_parts): none where it cannot pay (deterministic, MHA, items that fill the GPU
// several times), a divisor of the group otherwise, and enough parts to occupy the SMs for MQA after tensor
// parallelism (one kv head, 32 key tiles); a causal mask's long first items are split further than a full mask's.
TEST(BwdSchedule, GroupSplitWhereItemsLeaveSmsIdle) {
  constexpr int kSms = 132;
  EXPECT_EQ(bwd_group_parts(32, 64, 32 * 64, 8, kSms, /*deterministic=*/true), 1);
  EXPECT_EQ(bwd_group_parts(32, 64, 32 * 64, 1, kSms, false), 1);
  EXPECT_EQ(bwd_group_parts(4 * kSms, 64, 4 * kSms * 64, 8, kSms, false), 1);
  // b = 1, s = 4096, 8 query heads on 1 kv head, d = 128 (64 x 128 tiles): 32 items of 64 Q tiles per head.
  const int full = bwd_group_parts(32, 64, 32 * 64, 8, kSms, false);
  EXPECT_EQ(full, 4);
  // Causal: key tile n sees 64 - 2n Q tiles.
  long long total = 0;
  for (int n = 0; n < 32; ++n) total += 64 - 2 * n;
  EXPECT_GE(bwd_group_parts(32, 64, total, 8, kSms, false), full);
  for (int group : {2, 3, 6, 7, 12, 16, 64, 256})
    for (long long items : {1LL, 10LL, 64LL, 131LL, 200LL})
      for (bool causal : {false, true}) {
        const long long total = causal ? items * 8 : items * 16;  // causal: the longest item twice the average
        const int parts = bwd_group_parts(items, 16, total, group, kSms, false);
        EXPECT_TRUE(parts >= 1 && group % parts == 0) << "group " << group << " items " << items;
        EXPECT_TRUE(parts == 1 || items * parts <= 4LL * kSms) << "group " << group << " items " << items;
      }
  // 128 full items already fill 132 SMs: a split would only add partials.
  EXPECT_EQ(bwd_group_parts(128, 64, 128 * 64, 8, kSms, false), 1);
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

}  // namespace
}  // namespace flash4::sm90::bwd
