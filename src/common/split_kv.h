// Split-KV: how many parts the keys of each (sequence, head) are split into, and which keys each part gets.
// One definition for the CPU path and the GPU path, so the split and the combine (common/lse_combine.h) agree.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

inline constexpr int kMaxSplits = 128;                // partial results per row (the combine's bound)
inline constexpr int64_t kMinKeysPerSplit = 256;      // fewer keys per part cost more in the combine than they gain
inline constexpr double kSplitWaveEfficiency = 0.85;  // the fewest splits within this fraction of the best waves

// Number of splits for `work_items` independent units of work (GPU: batch x heads_kv x query tiles with GQA
// packing; CPU: batch x heads x query tiles) on `units` parallel workers (SMs, or CPU threads) with at most
// `max_keys` keys per sequence. Splitting pays only when the work leaves workers idle: with enough items it is 1.
// Otherwise the split count fills the workers' waves best (items x splits spread over units), bounded so each part
// keeps kMinKeysPerSplit keys; of the counts within kSplitWaveEfficiency of the best, the smallest (the combine
// costs per split).
constexpr int choose_num_splits(int64_t units, int64_t work_items, int64_t max_keys) {
  if (units <= 1 || work_items <= 0 || work_items * 5 >= units * 4) return 1;  // >= 80 % of the workers busy
  int64_t bound = max_keys / kMinKeysPerSplit;
  if (bound > kMaxSplits) bound = kMaxSplits;
  if (bound < 2) return 1;
  double best = 0.0;
  double efficiency[kMaxSplits + 1] = {};
  for (int64_t s = 1; s <= bound; ++s) {
    const int64_t tasks = work_items * s, waves = (tasks + units - 1) / units;
    efficiency[s] = static_cast<double>(tasks) / static_cast<double>(waves * units);
    if (efficiency[s] > best) best = efficiency[s];
  }
  for (int64_t s = 1; s <= bound; ++s)
    if (efficiency[s] >= kSplitWaveEfficiency * best) return static_cast<int>(s);
  return 1;
}

// The keys [lo, hi] (inclusive; empty when lo > hi) of split `s` of `splits`, for a row range whose visible keys
// are [first, last]: whole blocks of `block_n` keys dealt out evenly, so every split but the last starts and ends
// on a block boundary of the range.
FLASH4_HD void split_keys(int64_t first, int64_t last, int64_t block_n, int64_t splits, int64_t s, int64_t& lo,
                          int64_t& hi) {
  if (last < first) {
    lo = 0;
    hi = -1;
    return;
  }
  const int64_t blocks = (last - first) / block_n + 1;
  const int64_t per_split = (blocks + splits - 1) / splits;
  lo = first + s * per_split * block_n;
  hi = lo + per_split * block_n - 1;
  if (hi > last) hi = last;
}

}  // namespace flash4::detail
