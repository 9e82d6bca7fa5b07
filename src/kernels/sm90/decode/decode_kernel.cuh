// The split-KV decode kernel: attention of a few query rows to a long (paged or contiguous) KV cache, memory-bound.
// Grid (split x row tile, KV head, sequence); 128 threads. Each CTA:
//   1. rows: the (query, query head) pairs of its row tile that share KV head hkv, packed query-major (GQA packing:
//      the K/V of the head are read once for the whole group);
//   2. keys: the keys some row of the tile sees (common/mask.h), cut into `splits` parts of whole 64-key blocks
//      (common/split_kv.h); the CTA walks its part;
//   3. a kStages-deep cp.async ring of K/V blocks (kStages - 1 blocks in flight while one is computed; 64-128 KB
//      per CTA, 1-2 CTAs per SM: the bytes in flight that HBM's latency asks for at full bandwidth); with 16 rows
//      each warp copies and waits for its own key slice of every block, so warps never wait for each other;
//   4. per block: S = Q K^T, online softmax (exp2, fp32), O += P V on mma.sync (decode_warp.cuh), the element mask
//      only on blocks that need it (the split's last block, and blocks crossing a window or causal edge);
//   5. the epilogue (decode_epilogue.cuh): out and lse directly with one split, else a partial O and LSE, which
//      the tile's last split CTA merges (decode_split_merge.cuh) or, for 64-row tiles, the combine kernel.
// In a packed batch, the first CTA of each sequence also clears the rows no segment covers
// (decode_uncovered_rows.cuh).
// Shared memory (decode_config.h): stages (kStages, K | V, kBlockN, kHeadDim) 16-bit, Q (kBlockM, kHeadDim)
// 16-bit (rows chunk-swizzled), row stats.
// Nothing reads device-resident lengths, page numbers or cache rows unclamped (KvCacheProblem, PagedKeys), and no
// host synchronisation is needed: the launch is CUDA-graph capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/split_kv.h"
#include "hw/sm90/cp_async.cuh"
#include "hw/sm90/grid_dependency.cuh"
#include "kernels/sm90/decode/decode_config.h"
#include "kernels/sm90/decode/decode_epilogue.cuh"
#include "kernels/sm90/decode/decode_load.cuh"
#include "kernels/sm90/decode/decode_params.h"
#include "kernels/sm90/decode/decode_uncovered_rows.cuh"
#include "kernels/sm90/decode/decode_warp.cuh"

namespace flash4::sm90::decode {

template <class Element, int kHeadDim, int kWarpsM>
__global__ void __launch_bounds__(kThreads, DecodeTile<kHeadDim, kWarpsM>::kCtasPerSm)
    decode_kernel(const __grid_constant__ DecodeParams p) {
  using Tile = DecodeTile<kHeadDim, kWarpsM>;
  constexpr int kStages = Tile::kStages;
  // The combine kernel, if any (a programmatic dependent), may launch now: it waits for this grid before reading.
  grid_dependency_launch_dependents();
  extern __shared__ __align__(128) unsigned char smem_unaligned[];
  // Tiles start on 128 bytes (SwizzledLane's addresses XOR bits 5-6); kSmemBytes includes the slack.
  const uint32_t skip = (128u - smem_addr(smem_unaligned) % 128u) % 128u;
  unsigned char* smem = smem_unaligned + skip;
  const uint32_t s_base = smem_addr(smem);
  const uint32_t s_q = s_base + Tile::kOffQ;

  const int split = static_cast<int>(blockIdx.x) / p.row_tiles, row_tile = static_cast<int>(blockIdx.x) % p.row_tiles;
  const int hkv = static_cast<int>(blockIdx.y);
  const int64_t b = blockIdx.z;
  const int row0 = row_tile * Tile::kBlockM;
  // The sequence's queries (a packed batch's counts may differ): a tile past its rows has nothing to do, in every
  // split alike, so its split counter is never touched.
  const DecodeSpan ds = decode_span(p.cu_seqlens_q, p.total_q, p.kv.attention.seqlen_q, p.max_seqlen_q, b);
  const QuerySpan span = ds.span;
  if (p.cu_seqlens_q != nullptr && blockIdx.x == 0 && hkv == 0) clear_rows_in_no_segment(p, b, span);
  if (!ds.computed) return;  // the dense kernel's sequence
  const int rows_valid = min(Tile::kBlockM, static_cast<int>(span.count) * p.group - row0);
  if (rows_valid <= 0) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int wm = warp / Tile::kWarpsN, wn = warp % Tile::kWarpsN;  // row fragment, key slice

  // The keys of this CTA: those some row of the tile sees, then this split's part of them.
  const detail::SequenceMask mask = detail::SequenceMask::make(p.kv.window(), span.count, p.kv.seqlen_k(b));
  const int64_t i_first = row0 / p.group, i_last = (row0 + rows_valid - 1) / p.group;
  const detail::IndexRange visible = mask.keys_of_any_row(i_first, i_last);
  int64_t lo = 0, hi = -1;
  detail::split_keys(visible.lo, visible.hi, kBlockN, p.splits, split, lo, hi);
  const int n_blocks = lo <= hi ? static_cast<int>((hi - lo) / kBlockN + 1) : 0;
  const detail::PagedKeys keys = p.kv.keys(b);
  const bool windowed = p.kv.window().any();

  // With 16 rows each warp reads only its own kKeysPerWarp keys of every block, so each warp copies its slice
  // itself and its ring needs no CTA barrier (one __syncwarp per block); with 64 rows every warp reads the whole
  // block and the CTA copies it together.
  constexpr bool kWarpRing = Tile::kWarpsN == Tile::kWarps;
  auto stage_k = [&](int stage) { return s_base + Tile::kOffStages + stage * Tile::kStageBytes; };
  auto load_block = [&](int block, int stage) {
    const int64_t j0 = lo + int64_t{block} * kBlockN;
    if constexpr (kWarpRing) {
      load_kv_rows<Element, Tile, 32, Tile::kKeysPerWarp>(stage_k(stage), stage_k(stage) + Tile::kTileBytes, p,
                                                          keys, hkv, j0, wn * Tile::kKeysPerWarp, hi, lane);
    } else {
      load_kv_rows<Element, Tile, kThreads, kBlockN>(stage_k(stage), stage_k(stage) + Tile::kTileBytes, p, keys,
                                                     hkv, j0, 0, hi, static_cast<int>(threadIdx.x));
    }
  };

  // Prologue: Q and the first kStages - 1 blocks, one commit group per block (Q rides with the first).
  load_q_rows<Element, Tile>(s_q, p.q, b, span.first, hkv, p.group, row0, rows_valid, p.head_dim);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_blocks) load_block(s, s);
    cp_async_commit();
  }

  DecodeWarp<Element, Tile> w;
  w.init();
  const int g = lane / 4, t = lane % 4;
  const int64_t i_row[2] = {(row0 + 16 * wm + g) / p.group, (row0 + 16 * wm + g + 8) / p.group};
  const SwizzledLane<Tile> q_lane = LaneAddresses<Tile>::q(lane, 16 * wm).in(s_q);
  const SwizzledLane<Tile> k_lane = LaneAddresses<Tile>::k(lane, wn * Tile::kKeysPerWarp);
  const SwizzledLane<Tile> v_lane = LaneAddresses<Tile>::v(lane, wn * Tile::kKeysPerWarp);

  int stage = 0, load_stage = kStages - 1;  // the stage computed now, and the one the next load fills
  for (int block = 0; block < n_blocks; ++block) {
    cp_async_wait<kStages - 2>();  // this block's group has landed (for this thread) ...
    // ... for every thread that copied it (Q: the whole CTA, with the first block); and every reader is done
    // with the stage loaded next.
    if (!kWarpRing || block == 0) {
      __syncthreads();
    } else {
      __syncwarp();
    }
    if (block + kStages - 1 < n_blocks) load_block(block + kStages - 1, load_stage);
    cp_async_commit();             // an empty group at the tail keeps the wait count uniform
    if (block == 0) w.load_q(q_lane);  // Q rode with the first block's group

    const int64_t j0 = lo + int64_t{block} * kBlockN;
    // The element mask only where some key of the block is past the split or outside a row's band.
    const bool masked = j0 + kBlockN - 1 > hi ||
                        (windowed && mask.block_needs_mask(i_first, i_last, j0, j0 + kBlockN - 1));
    float s[Tile::kKeyFrags][4];
    w.scores(q_lane, k_lane.in(stage_k(stage)), s);
    w.transform(s, p.score, masked, mask, i_row, j0 + wn * Tile::kKeysPerWarp + 2 * t, hi);
    w.softmax(s);
    w.accumulate(s, v_lane.in(stage_k(stage) + Tile::kTileBytes));

    stage = stage + 1 == kStages ? 0 : stage + 1;
    load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages become the merge buffer
  store_rows<Element, Tile>(p, w, smem, b, span.first, hkv, split, row_tile, row0, rows_valid);
}

}  // namespace flash4::sm90::decode
