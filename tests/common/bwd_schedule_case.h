// Fixtures of the backward schedule's CPU tests (tests/cpu/test_bwd_schedule*.cpp): the masks and lengths they
// sweep, BwdParams of one problem as make_bwd_params fills the fields the schedule reads, and brute-force
// answers to the schedule's questions.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/mask.h"
#include "kernels/sm90/bwd/bwd_schedule.h"

namespace flash4::sm90::bwd::schedule_test {

struct Mask {
  const char* name;
  bool masked;
  int64_t window_left, window_right;  // -1 = unbounded, as in the public API
};

// No mask, causal (bottom-right), a left window, a two-sided window.
inline constexpr Mask kMasks[] = {{"none", false, -1, -1}, {"causal", true, -1, 0}, {"left32", true, 32, 0},
                           {"band70_5", true, 70, 5}};
inline constexpr int kSeqlens[] = {1, 17, 64, 65, 127, 128, 129, 300, 1000, 1013};

inline detail::SequenceMask sequence_mask(int sq, int sk, const Mask& mask) {
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

}  // namespace flash4::sm90::bwd::schedule_test
