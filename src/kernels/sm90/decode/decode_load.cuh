// The decode kernel's global -> shared copies (cp.async, 16 bytes per thread and instruction): the CTA's Q rows
// once, and per pipeline stage the rows of a block of kBlockN keys of K and V (all of them, or one warp's slice).
// Keys are found through the sequence's PagedKeys (common/paged_keys.h): once per slice that lies in one page
// (every slice of a contiguous cache), row by row for a slice that straddles pages, so a contiguous cache and pages
// of any size in any order take the same loader; rows outside [first, last] are zero-filled (a zero V row times a
// zero P adds nothing, where an unread cache row could hold NaN).
#pragma once

#include <cstdint>

#include "common/paged_keys.h"
#include "hw/sm90/cp_async.cuh"
#include "kernels/sm90/decode/decode_params.h"

namespace flash4::sm90::decode {

// Rows [row0, row0 + kBlockM) of the packed (query, group head) rows of sequence b, whose queries start at
// q_first along q's query dimension, KV head hkv, into s_q (kBlockM, kHeadDim) 16-bit, swizzled
// (DecodeTile::offset); rows >= rows_valid and columns >= head_dim (a kernel wider than d) are zeros.
template <class Element, class Tile>
__device__ __forceinline__ void load_q_rows(uint32_t s_q, const RowsView& q, int64_t b, int64_t q_first, int hkv,
                                            int group, int row0, int rows_valid, int head_dim) {
  constexpr int kChunks = Tile::kHeadDim / 8;  // 16-byte chunks per row
  const Element* base = static_cast<const Element*>(q.data);
  for (int c = static_cast<int>(threadIdx.x); c < Tile::kBlockM * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r < rows_valid && col < head_dim;
    const int packed = row0 + (r < rows_valid ? r : 0);
    const int64_t i = q_first + packed / group, h = int64_t{hkv} * group + packed % group;
    const Element* src = base + b * q.stride_0 + i * q.stride_1 + h * q.stride_h + (valid ? col : 0);
    cp_async_16(s_q + Tile::offset(r, col / 8), src, valid ? 16 : 0);
  }
}

// Rows [row0, row0 + kRows) of the block of keys starting at j0 (cache rows through `keys`), KV head hkv, into
// one stage: K at s_k, V at s_v, each (kBlockN, kHeadDim) 16-bit, swizzled. Copied by kLoaders threads, `loader`
// being this thread's index among them: the whole CTA for a whole block, or one warp for its own key slice.
// Keys > last and columns >= p.head_dim are zeros. row0 is a multiple of 8.
template <class Element, class Tile, int kLoaders, int kRows>
__device__ __forceinline__ void load_kv_rows(uint32_t s_k, uint32_t s_v, const DecodeParams& p,
                                             const detail::PagedKeys& keys, int hkv, int64_t j0, int row0,
                                             int64_t last, int loader) {
  constexpr int kChunks = Tile::kHeadDim / 8;
  constexpr int kRowsPerPass = kLoaders / kChunks;  // CTA: 16 (d = 64), 8 (128), 4 (256); warp: 4, 2, 1
  static_assert(kRows % kRowsPerPass == 0, "whole rows per pass");
  const int r0 = loader / kChunks, col = (loader % kChunks) * 8;
  // Row row0 + r0 + pass * kRowsPerPass differs from row row0 + r0 in its bits 0-2 by (pass * kRowsPerPass) % 8
  // (r0 < kRowsPerPass when a pass is under 8 rows), so its swizzled chunk is the first row's XORed by that.
  const uint32_t first = Tile::offset(row0 + r0, col / 8);
  auto stage_offset = [&](int pass) {  // the thread's destination in pass `pass`
    return (first ^ (((pass * kRowsPerPass) & 7) << 4)) + pass * kRowsPerPass * Tile::kRowBytes;
  };
  // A chunk past the head dim is zero-filled from a valid address (the row's first chunk).
  const bool col_valid = col < p.head_dim;
  const int src_col = col_valid ? col : 0;
  const Element* k_base = static_cast<const Element*>(p.k_cache.data) + hkv * p.k_cache.stride_h + src_col;
  const Element* v_base = static_cast<const Element*>(p.v_cache.data) + hkv * p.v_cache.stride_h + src_col;
  const int64_t j_first = j0 + row0;  // the slice's first key
  const int64_t j_end = j_first + kRows - 1 < last ? j_first + kRows - 1 : last;  // its last key that is read
  if (j_first > last || keys.same_page(j_first, j_end)) {
    // The slice's keys lie in one page (always, in a contiguous cache): one lookup, then rows at a fixed stride.
    // Rows past `last` take the looked-up row's address (a valid one) and copy nothing.
    const detail::CacheRow at = keys.at(j_first <= last ? j_first : j0);
    const Element* k_row = k_base + at.slot * p.k_cache.stride_0 + at.row * p.k_cache.stride_1;
    const Element* v_row = v_base + at.slot * p.v_cache.stride_0 + at.row * p.v_cache.stride_1;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
      const int rows_on = r0 + pass * kRowsPerPass;  // from the slice's first key
      const bool valid = j_first + rows_on <= last && col_valid;
      const int64_t step = valid ? rows_on : 0;
      cp_async_16_line(s_k + stage_offset(pass), k_row + step * p.k_cache.stride_1, valid ? 16 : 0);
      cp_async_16_line(s_v + stage_offset(pass), v_row + step * p.v_cache.stride_1, valid ? 16 : 0);
    }
    return;
  }
  // The slice straddles pages: one lookup per row, which serves K and V (both caches share the geometry).
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const int64_t j = j_first + r0 + pass * kRowsPerPass;
    const bool valid = j <= last && col_valid;
    const detail::CacheRow at = keys.at(j <= last ? j : j0);
    const Element* k_src = k_base + at.slot * p.k_cache.stride_0 + at.row * p.k_cache.stride_1;
    const Element* v_src = v_base + at.slot * p.v_cache.stride_0 + at.row * p.v_cache.stride_1;
    cp_async_16_line(s_k + stage_offset(pass), k_src, valid ? 16 : 0);
    cp_async_16_line(s_v + stage_offset(pass), v_src, valid ? 16 : 0);
  }
}

}  // namespace flash4::sm90::decode
