// The running softmax state of one query row, with FA4's conditional rescaling.
#pragma once

#include <cmath>
#include <limits>

#include "cpu/tile_config.h"

namespace flash4::cpu {

// Scores are in the log2 domain (t = score * log2e). O and l are kept relative to a reference max m_ref:
// O = sum_j 2^(t_j - m_ref) v_j, l = sum_j 2^(t_j - m_ref). Any m_ref works as long as O and l share it, so
// m_ref only has to move when a new tile max would make 2^(t - m_ref) overflow the P dtype's comfort zone.
struct OnlineSoftmaxRow {
  float m_ref = -std::numeric_limits<float>::infinity();  // -inf until the row has seen a key
  float l = 0.0f;

  // Called with the max of the next tile's (unmasked) scores of this row. Returns the factor by which the caller
  // must multiply its O row (1 when nothing changes). With conditional = false this is the classic online
  // softmax: rescale whenever the max grows.
  float update(float m_tile, bool conditional) {
    if (m_ref == -std::numeric_limits<float>::infinity()) {
      m_ref = m_tile;  // first keys of the row: O and l are still 0, nothing to rescale
      return 1.0f;
    }
    const bool grow = conditional ? m_tile - m_ref > kRescaleThreshold : m_tile > m_ref;
    if (!grow) return 1.0f;
    const float factor = std::exp2(m_ref - m_tile);
    m_ref = m_tile;
    l *= factor;
    return factor;
  }

  // Natural-log LSE of the row: log(sum_j e^(s_j)) = (m_ref + log2 l) * ln 2; -inf when the row saw no key.
  float lse() const {
    if (l == 0.0f) return -std::numeric_limits<float>::infinity();
    return (m_ref + std::log2(l)) * kLn2;
  }
};

}  // namespace flash4::cpu
