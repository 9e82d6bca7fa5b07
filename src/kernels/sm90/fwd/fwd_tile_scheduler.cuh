// Which output tiles (m_block, head, batch) a CTA of the persistent forward kernel computes, and in what order.
// The grid is at most one CTA per SM; CTAs claim tiles in a fixed head-major order (CTA i starts with tile i,
// then takes the next unclaimed one from a global counter), so the CTAs running at the same time share one or
// two heads' K/V in L2 (a level-major order across all heads loses for long causal sequences: their K/V no
// longer fit in the 60 MB L2). With a mask, each head's m-blocks go longest first, so the short tiles near the
// top fill in the gaps. (Claiming is dynamic because a static round-robin assignment keeps handing a CTA tiles
// of similar length when the CTA count is close to the m-blocks per head.)
// Launching one CTA per tile (grid = total tiles) degenerates to the classic non-persistent kernel.
#pragma once

namespace flash4::sm90 {

struct FwdTile {
  int m_block, head, batch;
};

template <bool kMasked>
struct FwdTileScheduler {
  int num_m_blocks, heads, batch;

  __device__ __forceinline__ int total() const { return num_m_blocks * heads * batch; }

  __device__ __forceinline__ FwdTile tile(int t) const {
    const int bh = t / num_m_blocks, m = t % num_m_blocks;
    return {kMasked ? num_m_blocks - 1 - m : m, bh % heads, bh / heads};
  }
};

}  // namespace flash4::sm90
