// Which output tiles (m_block, head, batch) the forward kernel computes, and in what order. Plain host/device
// code: the CPU tests check that every order visits each tile once.
//
// CTAs claim tiles in a fixed order: CTA i starts with tile i, then takes the next unclaimed one from a global
// counter (persistent launches), or the grid has one CTA per tile, which the hardware starts in order as SMs free
// up. (Claiming is dynamic because a static round-robin assignment keeps handing a CTA tiles of similar length
// when the CTA count is close to the m-blocks per head.)
//  * Without a mask every tile costs the same: head-major, so the CTAs running at the same time read one or two
//    heads' K/V.
//  * With a mask tiles differ in length, and the longest must start first or the last ones finish alone
//    (longest-processing-time order). The (batch, head) pairs are cut into L2 sections of `section` pairs whose
//    K/V fit in L2 together (fwd_tile_section); within a section the order is level-major: every pair's longest
//    m-block, then every pair's second longest, ... A section of one pair is head-major with each head's
//    m-blocks longest first; one section across all pairs would be global longest-first, which loses once the
//    K/V of all heads no longer fit in L2 (long causal sequences).
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::sm90 {

struct FwdTile {
  int m_block, head, batch;
};

template <bool kMasked>
struct FwdTileScheduler {
  int num_m_blocks, heads, batch;
  int section;  // (batch, head) pairs per L2 section of the masked order (>= 1)

  FLASH4_HD int total() const { return num_m_blocks * heads * batch; }

  FLASH4_HD FwdTile tile(int t) const {
    if constexpr (!kMasked) {
      const int bh = t / num_m_blocks;
      return {t % num_m_blocks, bh % heads, bh / heads};
    } else {
      const int pairs = heads * batch;
      const int first_pair = t / (section * num_m_blocks) * section;  // this section's first (batch, head)
      const int width = pairs - first_pair < section ? pairs - first_pair : section;  // the last may be narrower
      const int r = t - first_pair * num_m_blocks;                                       // position in the section
      const int bh = first_pair + r % width;
      return {num_m_blocks - 1 - r / width, bh % heads, bh / heads};
    }
  }
};

// The section of the masked order: as many (batch, head) pairs as have their keys and values within
// kL2SectionBytes (K and V of one kv head serve `group` query heads, which are consecutive pairs).
inline constexpr int64_t kL2SectionBytes = 32ll << 20;
constexpr int fwd_tile_section(int64_t pairs, int64_t group, int64_t seqlen_k, int64_t head_dim, int64_t head_dim_v,
                               int64_t element_bytes, int64_t budget_bytes = kL2SectionBytes) {
  const int64_t kv_head_bytes = seqlen_k * (head_dim + head_dim_v) * element_bytes;
  const int64_t kv_heads = kv_head_bytes > 0 ? budget_bytes / kv_head_bytes : pairs;
  const int64_t section = (kv_heads > 1 ? kv_heads : 1) * (group > 1 ? group : 1);
  return static_cast<int>(section < pairs ? section : (pairs > 1 ? pairs : 1));
}

}  // namespace flash4::sm90
