// How the host plans a backward launch's work items (bwd_schedule.h numbers them): how many parts each GQA group
// is split into, in which of the two orders the items run, and whether CTAs are persistent. Plain host/device
// functions, so that the CPU tests check each rule on the shapes it was measured on (docs/performance.md).
#pragma once

#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"

namespace flash4::sm90::bwd {

// Q-tile steps of one query head over the key tiles of one (batch entry, kv head), for tiles of Tile::kBlockM
// queries x Tile::kBlockN keys: the longest key tile's and their sum (bwd_group_parts' model). TileShape names a
// tile by its sizes where the host chooses it at run time.
struct KeyTileSteps {
  long long longest = 0, total = 0;
};
template <int kM, int kN>
struct TileShape {
  static constexpr int kBlockM = kM, kBlockN = kN;
};
template <class Tile, class Shape>
FLASH4_HD KeyTileSteps key_tile_steps(const Shape& p) {
  KeyTileSteps steps;
  for (int n = 0; n < p.n_blocks; ++n) {
    const long long count = q_range<Tile>(p, n).m_count;
    steps.longest = max_of(steps.longest, count);
    steps.total += count;
  }
  return steps;
}

// How many parts to split each GQA group into (BwdParams::group_parts): a divisor of the group. Items are
// (key tile, kv head, batch), each looping over its group's query heads; with few kv heads and short or few
// sequences (MQA after tensor parallelism: one kv head per GPU) they are fewer than the SMs, or a causal mask
// makes the first key tiles' items far longer than the average, and the longest item sets the time. Splitting
// the group divides every item by the parts, at the price of fp32 dK, dV partials and their sum. Model, in Q-tile
// steps, with L the longest item and W the work per busy SM: L where the items fit one wave on the SMs, else
// max(L, W + 0.3 L) (the items are handed out longest first, bwd_order_section, and the last ones still end
// unevenly), times 1 + 0.05 (parts - 1) for the partials' traffic and their sum; the cheapest parts wins, ties to
// fewer (the constants fit the measurements in docs/performance.md).
// Problems whose items fill the GPU several times over keep whole groups; and items x parts stays within 4 x SMs,
// which bounds the partials (about 70 MB at most: 528 items of 128 keys x 1 KB of dK + dV per key at d = 128, or
// 64 x 2 KB at 256) whatever the group size. `longest` and `total`: Q-tile steps of one query head. Deterministic
// mode splits by det_group_parts instead.
FLASH4_HD int bwd_group_parts(long long items, long long longest, long long total, int group, int sms) {
  if (group <= 1 || items <= 0 || longest <= 0 || sms <= 0 || items >= 4LL * sms) return 1;
  const double work = static_cast<double>(total) * group;  // over all items: total per head x the group
  int best = 1;
  double best_time = 0.0;
  for (int parts = 1; parts <= group && items * parts <= 4LL * sms; ++parts) {
    if (group % parts != 0) continue;
    const double busy = static_cast<double>(min_of(static_cast<long long>(sms), items * parts));
    const double item = static_cast<double>(longest) * group / parts;  // L
    const double waves = items * parts <= sms ? item : max_of(item, work / busy + 0.3 * item);
    const double time = waves * (1.0 + 0.05 * (parts - 1));
    if (parts == 1 || time < best_time) {
      best = parts;
      best_time = time;
    }
  }
  return best;
}

// The slots-first order's section (BwdParams::order_section; 0: key step fastest). Slots first outside
// deterministic mode where items differ in length (a mask), and only where they are few per SM (at most
// 4 x sms): there the last items' unevenness sets the time. With many items per SM the key step
// fastest order ends evenly enough, and its running items share their pairs' Q, dO and dQ rows in L2, which
// items of many pairs at once do not (docs/performance.md 4.13 has the measurements). A section
// holds as many (slot, batch) pairs as have the Q and dO their items read (the slot's query heads over
// max_seqlen_q rows, `element_bytes` each) within kBwdL2SectionBytes.
inline constexpr long long kBwdL2SectionBytes = 32ll << 20;
FLASH4_HD int bwd_order_section(const BwdParams& p, bool masked, int element_bytes, int sms,
                                long long budget_bytes = kBwdL2SectionBytes) {
  if (p.deterministic || !masked) return 0;
  if (work_items(p) > 4LL * sms) return 0;
  const long long pairs = static_cast<long long>(kv_slots(p)) * p.batch;
  const long long pair_bytes = static_cast<long long>(p.seqlen_q) * (p.group / p.group_parts) *
                               (p.head_dim + p.head_dim_v) * element_bytes;
  const long long section = pair_bytes > 0 ? budget_bytes / pair_bytes : pairs;
  return static_cast<int>(max_of(1LL, min_of(section, pairs)));
}

// Deterministic mode: a sequence's gradients must be the same bits whether it runs alone or in a packed batch,
// so the parts (whose fp32 partials change the order of dK, dV's sums) may depend on the heads only, never on the
// lengths or the batch: the fewest parts that give at least kDetGroupSlots kv slots (hkv x parts), or the whole
// group. Few kv heads then still give the GPU work at short lengths; the partials cost at most a dQ
// accumulator's size again (8 slots x (d + dv) floats per key row against heads x d per query row).
inline constexpr int kDetGroupSlots = 8;
FLASH4_HD int det_group_parts(int group, int heads_kv) {
  if (group <= 1 || heads_kv <= 0) return 1;
  for (int parts = 1; parts < group; ++parts)
    if (group % parts == 0 && static_cast<long long>(heads_kv) * parts >= kDetGroupSlots) return parts;
  return group;
}

// Whether persistent CTAs pay (non-deterministic d = 64 / 128, bwd_runs_persistent): they pay where an item
// loops over few Q tiles (the CTA launch they save is a larger share of a short item) and lose slightly on long
// ones. So at d = 128 they run where an item averages at most 16 Q tiles: the GQA group times the Q rows a key
// tile sees, all of them without a mask, about half under a band open on one side (causal), at most the band's
// width under a window. At d = 64 (block_m 128) they gain at every length, so there they always run
// (docs/performance.md has the measurements).
FLASH4_HD bool bwd_persistent_pays(const BwdParams& p, int block_m) {
  if (block_m == 128) return true;  // d = 64's tile
  const bool lo_open = p.band_lo <= -kBandSentinel, hi_open = p.band_hi >= kBandSentinel;
  long long rows = p.seqlen_q;
  if (lo_open != hi_open) rows = (rows + 1) / 2;
  else if (!lo_open) rows = min_of<long long>(rows, static_cast<long long>(p.band_hi) - p.band_lo + 1);
  const long long tiles_per_item = (rows + block_m - 1) / block_m * (p.group / p.group_parts);
  return tiles_per_item <= 16;
}

}  // namespace flash4::sm90::bwd
