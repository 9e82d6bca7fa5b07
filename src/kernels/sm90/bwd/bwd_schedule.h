// Which Q tiles a backward CTA visits for its key tile, and in which order the CTAs add into dQ in deterministic
// mode: the schedule of the wgmma kernels (tiles from `Tile`), plain C++ for the host and the device, so that
// tests/cpu/test_bwd_schedule.cpp checks it (coverage of the visible tiles, deadlock-free waits) without a GPU.
#pragma once

#include "common/host_device.h"
#include "kernels/sm90/bwd/bwd_params.h"

namespace flash4::sm90::bwd {

// By value, unlike std::min / std::max (whose references changed the kernels' SASS), and built on the host too.
template <class T>
FLASH4_HD T min_of(T a, T b) {
  return a < b ? a : b;
}
template <class T>
FLASH4_HD T max_of(T a, T b) {
  return a < b ? b : a;
}

// The mask as a band of key-minus-query offsets, with the meaning of common/mask.h's SequenceMask (built from it by
// bwd_api.cu, clamped to int): these tile questions agree with SequenceMask::block_visible and block_needs_mask
// (tests/cpu/test_bwd_schedule.cpp), in the int / 64-bit arithmetic the kernels' registers afford.
//
// True when the (m, n) tile holds at least one visible (query, key) pair. The band test on the tile's extreme
// offsets is exact because every offset in between occurs in a rectangle.
template <class Tile, class Shape>
FLASH4_HD bool tile_visible(const Shape& p, int m, int n) {
  const long long i0 = static_cast<long long>(m) * Tile::kBlockM;
  const long long i1 = min_of(i0 + Tile::kBlockM, static_cast<long long>(p.seqlen_q)) - 1;
  const long long j0 = static_cast<long long>(n) * Tile::kBlockN;
  const long long j1 = min_of(j0 + Tile::kBlockN, static_cast<long long>(p.seqlen_k)) - 1;
  return j0 - i1 <= p.band_hi && j1 - i0 >= p.band_lo;
}

// Non-zero when the tile of rows m0 .. m0 + kBlockM - 1 and keys n0 .. n0 + kBlockN - 1 holds a pair the kernel
// must hide: a key past seqlen_k or (kMasked) an offset outside the band. The kernels run their element mask only
// on these tiles; rows past seqlen_q need none (their LSE is +inf, so P = 0). An int, not a bool: returned as a
// bool, the test compiled to a byte conversion and a branch per tile in the wgmma kernels.
template <int kBlockM, int kBlockN, bool kMasked, class Shape>
FLASH4_HD int tile_needs_mask(const Shape& p, int m0, int n0) {
  int need = n0 + kBlockN > p.seqlen_k;
  if constexpr (kMasked) {
    const long long lo = static_cast<long long>(n0) - (m0 + kBlockM - 1);  // smallest j - i in the tile
    const long long hi = static_cast<long long>(n0 + kBlockN - 1) - m0;    // largest
    need = need || lo < p.band_lo || hi > p.band_hi;
  }
  return need;
}

// The Q tiles that can see a CTA's keys: [m_lo, m_lo + m_count), visited (per query head) starting at
// m_lo + m_first and wrapping around to m_lo.
//
// Why rotate: dQ rows receive one addition per (key tile, element), and the CTAs of one head run at the same
// pace. Unrotated, every CTA of a non-causal head starts at Q tile 0 and then moves in lockstep, so all of them
// add into the same dQ rows at the same moment and the L2 serializes the additions on those addresses. Starting
// each CTA at the Q tile "aligned" with its key tile, n_block * m_blocks / n_blocks (spread evenly over the Q
// tiles), keeps concurrent CTAs on different rows. For causal and other banded masks that start tile is usually
// m_lo already (ranges are staggered by the mask), so the order there is unchanged.
// Deterministic mode rotates only without a mask and when a (batch, kv head)'s CTAs fit on the GPU at once
// (det_rotated): then each Q tile's additions follow the order in which the rotated loops reach it
// (det_arrival_rank). Otherwise its semaphores add in a fixed n_block order (grid_n_block below), which an
// unrotated loop meets in that order.
struct QRange {
  int m_lo, m_count, m_first;
  // The Q tile of step `i` (0 <= i < m_count) of one query head's loop.
  FLASH4_HD int m_block(int i) const {
    const int k = m_first + i;
    return m_lo + (k >= m_count ? k - m_count : k);
  }
};

// A consumer's place in its work item's loop over (query head, Q tile): head = it / m_count and step = it %
// m_count of loop step `it`, advanced at each step so that the per-tile path has no integer division.
struct QStep {
  int head = 0, step = 0;
  FLASH4_HD void advance(const QRange& r) {
    if (++step == r.m_count) {
      step = 0;
      ++head;
    }
  }
};

// Deterministic mode: the order in which the CTAs of one (batch, kv head) add into each Q tile's dQ rows, and the
// launch order that makes it deadlock-free (a CTA waits only on CTAs of lower block index, which are resident or
// done). Masked (causal, window): decreasing n_block, highest n_block launched first, so that the short key tiles
// near the diagonal (whose Q ranges start late) add first instead of waiting for n_block 0 to reach them
// (shortest first). Unmasked: increasing n_block in launch order, which is faster there (all key tiles are equally
// long, so the launch order is the order in which they reach a Q tile).
template <bool kMasked, class Shape>
FLASH4_HD int key_tile_of_launch(const Shape& p, int launch) {
  return kMasked && p.deterministic ? p.n_blocks - 1 - launch : launch;
}

// The query heads of a work item: slot = hkv * group_parts + part (BwdParams::group_parts) takes `heads` query
// heads of kv head hkv's group, from h_first on. Without a split (group_parts = 1) the slot is the kv head and
// the item has the whole group.
struct GroupPart {
  int hkv, part, h_first, heads;
};
FLASH4_HD GroupPart group_part(const BwdParams& p, int slot) {
  if (p.group_parts == 1) return {slot, 0, slot * p.group, p.group};  // no division where nothing is split
  const int hkv = slot / p.group_parts, part = slot - hkv * p.group_parts, heads = p.group / p.group_parts;
  return {hkv, part, hkv * p.group + part * heads, heads};
}
FLASH4_HD int kv_slots(const BwdParams& p) { return p.heads_kv * p.group_parts; }
// A split group's fp32 partial of dK (width d) or dV (width dv): one (partial_rows, heads_kv, width) block per part,
// rows as the keys' (batch * seqlen_k, or total_k when packed).
FLASH4_HD int64_t partial_part_elements(const BwdParams& p, int width) {
  return p.partial_rows * p.heads_kv * width;
}
FLASH4_HD BshdStrides partial_strides(const BwdParams& p, int width) {
  const int64_t row = static_cast<int64_t>(p.heads_kv) * width;
  return {p.seqlen_k * row, row, width};
}

FLASH4_HD long long work_items(const BwdParams& p) {
  return static_cast<long long>(p.n_blocks) * kv_slots(p) * p.batch;
}

// Work items: one per (key tile, kv slot, batch), numbered w in one of two orders (BwdParams::order_section):
//  * key step fastest (order_section 0): w = step + n_blocks (slot + kv_slots b), each (slot, batch) pair's key
//    tiles one after the other. Deterministic mode keeps this order, so that a CTA waits only on CTAs launched
//    before it and the rotated order finds a pair's CTAs resident together (det_rotates); so do launches without
//    a mask, whose items are all alike (the order only decides what shares L2).
//  * slots first within L2 sections (order_section > 0): the pairs q = slot + kv_slots b are cut into sections of
//    order_section pairs (the last may be narrower); within a section the key step is slowest,
//    w = first n_blocks + step width + (q - first). Under a mask the first key steps are the longest items (a
//    causal band's first key tile sees every query), so every pair's longest items start before any pair's short
//    ones: longest-processing-time order, which the key-step-fastest order only gives within one pair, and which
//    decides the time where the items are few per SM (GQA, short sequences). The sections keep the pairs whose
//    Q and dO are read at the same time within L2 (bwd_order_section).
// The key tile of a step comes from key_tile_of_launch. 32-bit: the host launches only problems with fewer than
// 2^31 items (launch_bwd_wgmma_kernel), and a 64-bit division is a subroutine call whose registers the producer
// and dQ writer warps (24 each) do not have.
struct BwdWork {
  int n_block, slot, b;
};
// An item's launch step (key_tile_of_launch's argument), kv slot and batch entry.
struct ItemPosition {
  int launch, slot, b;
};
// Unmasked kernels are compiled with the key-step-fastest order alone (bwd_order_section never gives them
// another): their producer and dQ writer warps keep the registers the decode would take.
template <bool kMasked>
FLASH4_HD ItemPosition item_position(const BwdParams& p, int w) {
  const unsigned u = static_cast<unsigned>(w), n_blocks = static_cast<unsigned>(p.n_blocks);
  const unsigned slots = static_cast<unsigned>(kv_slots(p));
  if (kMasked && p.order_section > 0) {
    const unsigned pairs = slots * static_cast<unsigned>(p.batch), section = static_cast<unsigned>(p.order_section);
    const unsigned first = u / (section * n_blocks) * section;  // the section's first pair
    const unsigned width = pairs - first < section ? pairs - first : section;
    const unsigned r = u - first * n_blocks;  // position in the section
    const unsigned step = r / width, q = first + (r - step * width), b = q / slots;
    return {static_cast<int>(step), static_cast<int>(q - b * slots), static_cast<int>(b)};
  }
  const unsigned pair = u / n_blocks, b = pair / slots;
  return {static_cast<int>(u - pair * n_blocks), static_cast<int>(pair - b * slots), static_cast<int>(b)};
}
template <bool kMasked>
FLASH4_HD BwdWork work_item(const BwdParams& p, int w) {
  const ItemPosition at = item_position<kMasked>(p, w);
  return {key_tile_of_launch<kMasked>(p, at.launch), at.slot, at.b};
}
// The one-item-per-CTA grid in the same order: (n_blocks, kv slots, batch) with the key step fastest, or a 1-D
// grid of the items where the slots come first (whose sections a 3-D grid cannot express).
struct GridDims {
  unsigned x, y, z;
};
FLASH4_HD GridDims item_grid(const BwdParams& p) {
  if (p.order_section > 0) return {static_cast<unsigned>(work_items(p)), 1u, 1u};
  return {static_cast<unsigned>(p.n_blocks), static_cast<unsigned>(kv_slots(p)), static_cast<unsigned>(p.batch)};
}
// The item of the CTA at grid position (x, y, z) of item_grid (grid_item on the device).
template <bool kMasked>
FLASH4_HD ItemPosition grid_position(const BwdParams& p, unsigned x, unsigned y, unsigned z) {
  if (kMasked && p.order_section > 0) return item_position<kMasked>(p, static_cast<int>(x));
  return {static_cast<int>(x), static_cast<int>(y), static_cast<int>(z)};
}

// dQ staging across a persistent CTA's items: tile T of the CTA (counted over all its items) is staged in buffer
// T % buffers with mbarrier parity (T / buffers) % 2, which is where the consumers' PipelineState<buffers> stands
// at tile T. Writer `writer` handles the tiles T with T % buffers == writer; in an item whose first tile is
// T = tiles_before, its first one is item tile dq_writer_first_tile(...), and dq_phase gives each tile's parity.
FLASH4_HD int dq_writer_first_tile(int writer, unsigned tiles_before, int buffers) {
  const unsigned b = static_cast<unsigned>(buffers);
  return static_cast<int>((static_cast<unsigned>(writer) + b - tiles_before % b) % b);
}
FLASH4_HD unsigned dq_phase(unsigned tile, int buffers) { return (tile / static_cast<unsigned>(buffers)) & 1u; }

// The items a CTA runs. One item per CTA on item_grid in deterministic mode (a CTA may wait only on CTAs launched
// before it) and where bwd_persistent_pays says no: grid_item, grid_n_block. Otherwise one
// persistent CTA per SM on a 1-D grid: item blockIdx.x first, then items claimed from a counter in w order, the
// dynamic equivalent of the block scheduler's order (not a static stride: causal key tiles differ in length, and a
// stride that aliases with n_blocks gives one CTA all the long ones).
// bwd_wgmma_kernel.cuh: its producer loads the next item's first Q tile and K, V while the consumers still finish
// the previous item, and no CTA launch separates them.
struct BwdWorkRange {
  int first, total;  // a persistent CTA's first item (blockIdx.x) and the item count
};

#if defined(__CUDACC__)
__device__ __forceinline__ BwdWorkRange grid_work(const BwdParams& p) {
  return {static_cast<int>(blockIdx.x), static_cast<int>(work_items(p))};
}
// A persistent CTA's next item: the counter hands out gridDim.x, gridDim.x + 1, ... in order (the first gridDim.x
// items went to the CTAs by blockIdx), so CTAs pick up items as they free up, like the block scheduler would.
__device__ __forceinline__ int claim_next_item(const BwdParams& p) {
  return static_cast<int>(gridDim.x) + atomicAdd(p.work_counter, 1);
}
template <bool kMasked>
__device__ __forceinline__ ItemPosition grid_item(const BwdParams& p) {
  return grid_position<kMasked>(p, blockIdx.x, blockIdx.y, blockIdx.z);
}
template <bool kMasked>
__device__ __forceinline__ int grid_n_block(const BwdParams& p) {
  return key_tile_of_launch<kMasked>(p, grid_item<kMasked>(p).launch);
}
#endif

// The key tiles that Q tile m_block sees: [n_lo, n_hi] (empty when n_lo > n_hi). The band makes them one
// interval; the first estimate comes from the tile's extreme rows and the loops fix the clipped tiles at the ends.
struct KRange {
  int n_lo, n_hi;
};
template <class Tile, class Shape>
FLASH4_HD KRange k_range(const Shape& p, int m_block) {
  constexpr long long kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  const long long i0 = m_block * kBlockM;
  const long long i1 = min_of(i0 + kBlockM, static_cast<long long>(p.seqlen_q)) - 1;
  const long long last_key = i1 + p.band_hi;          // a visible tile starts at a key j0 <= last_key
  const long long first_key = i0 + p.band_lo;         // ... and ends at a key j1 >= first_key
  if (last_key < 0) return {0, -1};
  int n_hi = static_cast<int>(min_of(last_key / kBlockN, static_cast<long long>(p.n_blocks) - 1));
  // the first n with n * kBlockN + kBlockN - 1 >= first_key
  int n_lo = first_key <= 0 ? 0 : static_cast<int>(min_of(first_key / kBlockN, static_cast<long long>(p.n_blocks)));
  while (n_lo <= n_hi && !tile_visible<Tile>(p, m_block, n_lo)) ++n_lo;  // clipped key tail
  while (n_hi >= n_lo && !tile_visible<Tile>(p, m_block, n_hi)) --n_hi;
  return {n_lo, n_hi};
}

// The number of releases a deterministic CTA waits for before adding into Q tile m_block: `per_tile` for every
// visible (m_block, n) that adds before n_block (masked: n > n_block; unmasked: n < n_block). Closed form on
// k_range: the writer computes it once per Q tile, and a loop over the key tiles (up to 127 steps at 16k) made
// that single thread slower than the tile it was adding.
//
// Rotated (det_rotated; no mask, so every key tile sees every Q tile): CTA n starts at Q tile f(n) = n T / N
// (T = m_blocks, N = n_blocks, as q_range rotates) and reaches Q tile m at step (m - f(n)) mod T. The CTAs add in
// order of that step, ties (same start tile, when N > T) by n. Unrotated, CTA n would wait for all of n's
// predecessors to add into each tile one after the other (a chain of TMA completions per tile at the start of
// every head); rotated, the CTA before it in a tile's order added there a whole step earlier.
FLASH4_HD int det_arrival_rank(int m_block, int n_block, int m_blocks, int n_blocks) {
  const long long T = m_blocks, N = n_blocks;
  // CTAs whose start tile is <= x (0 <= x < T): n T / N <= x  <=>  n < (x + 1) N / T.
  auto starting_by = [&](long long x) { return x < 0 ? 0LL : min_of(N, ((x + 1) * N + T - 1) / T); };
  const long long f = n_block * T / N;
  // Earlier steps: start tiles in the cyclic interval (f, m_block].
  const long long earlier = m_block >= f ? starting_by(m_block) - starting_by(f)
                                         : N - starting_by(f) + starting_by(m_block);
  return static_cast<int>(earlier + n_block - starting_by(f - 1));  // + same start tile, lower n
}

template <class Tile, bool kMasked, class Shape>
FLASH4_HD int releases_before(const Shape& p, int m_block, int n_block, int per_tile) {
  if (!kMasked && p.det_rotated) return det_arrival_rank(m_block, n_block, p.m_blocks, p.n_blocks) * per_tile;
  const KRange r = k_range<Tile>(p, m_block);
  const int first = kMasked ? max_of(n_block + 1, r.n_lo) : r.n_lo;
  const int last = kMasked ? r.n_hi : min_of(n_block - 1, r.n_hi);
  return last >= first ? (last - first + 1) * per_tile : 0;
}

template <class Tile, class Shape>
FLASH4_HD QRange q_range(const Shape& p, int n_block) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  const int n0 = n_block * kBlockN;
  const long long j0 = n0, j1 = min_of(n0 + kBlockN, p.seqlen_k) - 1;
  const long long lo_rows = j0 - p.band_hi;  // first visible tile holds a row i >= j0 - band_hi
  const long long hi_rows = j1 - p.band_lo;  // last visible tile starts at a row i <= j1 - band_lo
  int m_lo = lo_rows <= 0 ? 0 : static_cast<int>(min_of(lo_rows / kBlockM, static_cast<long long>(p.m_blocks)));
  int m_hi = hi_rows < 0 ? -1 : static_cast<int>(min_of(hi_rows / kBlockM, static_cast<long long>(p.m_blocks) - 1));
  while (m_lo <= m_hi && !tile_visible<Tile>(p, m_lo, n_block)) ++m_lo;  // clipped last tile
  while (m_hi >= m_lo && !tile_visible<Tile>(p, m_hi, n_block)) --m_hi;
  const int m_count = max_of(m_hi - m_lo + 1, 0);
  int m_first = 0;
  if ((!p.deterministic || p.det_rotated) && m_count > 1) {
    const int target = static_cast<int>(static_cast<long long>(n_block) * p.m_blocks / p.n_blocks) - m_lo;
    if (target > 0 && target < m_count) m_first = target;
  }
  return {m_lo, m_count, m_first};
}

// Deterministic mode without a mask: whether the rotated order runs for a (batch, kv head) of n_blocks key tiles
// over m_blocks Q tiles, when `resident` key tiles fit on the GPU at once. A CTA may wait on CTAs of its head
// launched after it, so all of them must be resident together. It also ties every CTA of a head to the pace of
// the latest-launched one, which pays while start tiles are spread apart: up to 32 key tiles per step of spacing
// between start tiles (the measurements are in docs/performance.md).
FLASH4_HD bool det_rotates(int m_blocks, int n_blocks, int resident) {
  if (n_blocks <= 0) return false;
  const int spacing = max_of(1, m_blocks / n_blocks);
  return n_blocks <= min_of(resident, 32 * spacing);
}

// One batch entry of a packed or seqused launch (BwdParams::seq): the fields of BwdParams that the schedule above
// and the kernels read, for this entry, and where its rows start. A dense launch passes BwdParams itself, whose
// offsets are the constant 0 (bwd_params.h).
struct BwdSequence {
  int seqlen_q, seqlen_k, m_blocks, n_blocks, band_lo, band_hi;
  bool deterministic, det_rotated;
  int q_offset, k_offset;   // first row in the packed (total, heads, d) tensors; 0 where they are not packed
  bool packed_q, packed_k;  // the tensors are packed: batch coordinate 0, rows from the offsets
};

// Entry b of a packed or seqused launch, for tiles of kBlockM x kBlockN. Its band is the call's window aligned
// to the entry's own lengths (bottom-right, common/mask.h). Offsets and lengths come clamped from the layout, so
// no entry addresses rows outside the packed tensors whatever the device-resident offsets hold; the host
// checks that totals fit 32-bit TMA coordinates (bwd_api.cu). An entry takes the rotated deterministic order
// where a dense call of its shape would (det_rotates), so that deterministic results do not depend on how the
// sequences are batched.
template <int kBlockM, int kBlockN>
FLASH4_HD BwdSequence entry_of(const BwdParams& p, int b) {
  const detail::SequenceInfo si = p.seq.info(b);
  const detail::SequenceMask band = detail::SequenceMask::make(p.mask, si.seqlen_q, si.seqlen_k);
  BwdSequence e;
  e.seqlen_q = static_cast<int>(si.seqlen_q);
  e.seqlen_k = static_cast<int>(si.seqlen_k);
  e.m_blocks = (e.seqlen_q + kBlockM - 1) / kBlockM;
  e.n_blocks = (e.seqlen_k + kBlockN - 1) / kBlockN;
  e.band_lo = clamp_band(band.band_lo);
  e.band_hi = clamp_band(band.band_hi);
  e.deterministic = p.deterministic;
  e.det_rotated = p.det_resident_key_tiles > 0 && det_rotates(e.m_blocks, e.n_blocks, p.det_resident_key_tiles);
  e.q_offset = static_cast<int>(si.q_offset);
  e.k_offset = static_cast<int>(si.k_offset);
  e.packed_q = p.seq.cu_seqlens_q != nullptr;
  e.packed_k = p.seq.cu_seqlens_k != nullptr;
  return e;
}

// A packed launch sizes its grid for the longest entry: the key tile of launch position `launch` in entry e, or
// e.n_blocks (past the entry's keys: an empty item, which writes nothing) where the entry has fewer tiles.
template <bool kMasked>
FLASH4_HD int entry_key_tile(const BwdSequence& e, int launch) {
  return launch < e.n_blocks ? key_tile_of_launch<kMasked>(e, launch) : e.n_blocks;
}

// The Q tiles of key tile n_block of a dense launch or an entry; none past the entry's keys.
template <class Tile, class Shape>
FLASH4_HD QRange entry_q_range(const Shape& e, int n_block) {
  if (n_block >= e.n_blocks) return {0, 0, 0};
  return q_range<Tile>(e, n_block);
}

// Row of (entry b, head h)'s first query in the LSE / D / dQ-accumulator workspace: (b, h, seqlen_q) for a dense
// batch, (h, total_q) when the queries are packed.
template <class Shape>
FLASH4_HD int64_t workspace_row0(const BwdParams& p, const Shape& e, int b, int h) {
  const int64_t rows = e.packed_q ? p.seq.total_q : p.seqlen_q;
  return (static_cast<int64_t>(e.packed_q ? 0 : b) * p.heads + h) * rows + e.q_offset;
}

}  // namespace flash4::sm90::bwd
