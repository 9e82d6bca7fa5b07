// Position in a ring of shared-memory stages: the stage index and the mbarrier phase parity expected there.
// Producer and consumer each keep one and advance it once per tile, so no kernel computes (i / kStages) % 2.
#pragma once

#include <cstdint>

namespace flash4::sm90 {

template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace flash4::sm90
