// From the matmul's raw dot products q·k to the softmax's log2-domain scores: one definition for the CPU path,
// the forward and the backward.
//
//   no softcap:  t = q·k · log2_scale                          log2_scale = softmax_scale · log2(e)
//   softcap c:   t = tanh(q·k · tanh_scale) · log2_scale       tanh_scale = softmax_scale / c, log2_scale = c · log2(e)
//
// t is the score in log2 units (softmax = exp2(t - max t)); LSE = (max t + log2(sum)) · ln(2). Kernels may keep
// the intermediate value (q·k, or the tanh) in registers and fold log2_scale into a later FMA.
#pragma once

#include "common/host_device.h"

namespace flash4::detail {

inline constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
inline constexpr float kLn2 = 0.69314718055994531f;   // ln(2) = 1 / log2(e)

struct ScoreTransform {
  float softmax_scale = 0.0f;  // the resolved scale (never 0)
  float softcap = 0.0f;        // c > 0, or 0 = off
  float tanh_scale = 0.0f;     // softmax_scale / c (softcap only)
  float log2_scale = 0.0f;     // multiplies q·k (no softcap) or the tanh (softcap) into log2 units

  FLASH4_HD static ScoreTransform make(float softmax_scale, float softcap) {
    ScoreTransform t;
    t.softmax_scale = softmax_scale;
    t.softcap = softcap > 0.0f ? softcap : 0.0f;
    t.tanh_scale = softcap > 0.0f ? softmax_scale / softcap : 0.0f;
    t.log2_scale = (softcap > 0.0f ? softcap : softmax_scale) * kLog2e;
    return t;
  }
  FLASH4_HD bool has_softcap() const { return softcap > 0.0f; }
};

}  // namespace flash4::detail
