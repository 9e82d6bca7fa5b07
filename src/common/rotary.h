// Rotary position embedding (RoPE) of one head's feature row, as flash-attn's KV-cache path applies it to the
// new keys and the queries: features are rotated in pairs by the angle of the position, whose cos and sin are
// rows of (seqlen_ro, rotary_dim / 2) tables; features from rotary_dim on are left alone.
//   interleaved:     pairs (2i, 2i + 1)
//   not interleaved: pairs (i, i + rotary_dim / 2)  (GPT-NeoX)
//   (x, y) -> (x cos_i - y sin_i, x sin_i + y cos_i)
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

FLASH4_HD void apply_rotary(float* x, const float* cos, const float* sin, int64_t rotary_dim, bool interleaved) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float xa = x[a], xb = x[b];
    x[a] = xa * cos[i] - xb * sin[i];
    x[b] = xa * sin[i] + xb * cos[i];
  }
}

}  // namespace flash4::detail
