// The decode kernel's tile shapes and shared-memory plan (constexpr, used by the kernel, its launch and CPU tests),
// and the choice of tile and split count for a problem. Host and device; no CUDA headers.
//
// A CTA owns kBlockM rows = (query, query head of the GQA group) pairs of one (sequence, KV head), packed
// query-major (row r = i * group + g), so each K/V byte of the head is read once for the whole group. Two shapes:
//   kWarpsM = 1: 16 rows; the 4 warps split every 64-key block (16 keys each) and merge at the end. Decode
//                (seqlen_q * group <= 16): the rows fill one m16 fragment and the keys keep every warp busy.
//   kWarpsM = 4: 64 rows, 16 per warp, every warp over all 64 keys of a block (FlashAttention-2's split):
//                speculative decoding, chunked prefill and the dense route's larger groups.
#pragma once

#include <cstdint>

#include "common/split_kv.h"

namespace flash4::sm90::decode {

inline constexpr int kThreads = 128;                // 4 warps
inline constexpr int kBlockN = 64;                  // keys per pipeline stage
inline constexpr int kSmemPerSm = 233472;           // sm_90: 228 KB per SM for all resident CTAs
inline constexpr int kSmemReservedPerCta = 1024;    // the driver's share of each CTA
inline constexpr int kMaxSmemPerCta = 232448;       // the per-block opt-in maximum (227 KB)
inline constexpr int kMaxStages = 8;

template <int kHeadDim_, int kWarpsM_>
struct DecodeTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kWarpsN = kWarps / kWarpsM;         // warps sharing one 16-row fragment
  static constexpr int kBlockM = 16 * kWarpsM;             // rows per CTA
  static constexpr int kKeysPerWarp = kBlockN / kWarpsN;   // 16 or 64 keys of each block per warp
  static constexpr int kKeyFrags = kKeysPerWarp / 8;       // n8 fragments of S per warp
  static_assert(kWarpsM * kWarpsN == kWarps && kKeysPerWarp % 16 == 0, "P V needs whole k16 steps per warp");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "64, 128 or 256");

  // Shared rows of Q, K and V are unpadded, (rows, kHeadDim) 16-bit, with each row's 16-byte chunk index XORed by
  // row % 8: the 8 rows of an ldmatrix phase and the 16-byte cp.async writes of a quarter-warp then hit 32 distinct
  // banks, and a row's chunks land in shared memory in row order, so each warp's cp.async requests cover whole
  // 128-byte lines of the cache (padded rows split them: half as many L2 sectors again per byte).
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kTileBytes = kBlockN * kRowBytes;   // one K or V block, (kBlockN, kHeadDim) 16-bit
  static constexpr int kStageBytes = 2 * kTileBytes;       // K and V of one block
  static constexpr int kQBytes = kBlockM * kRowBytes;      // (kBlockM, kHeadDim) 16-bit
  // Byte offset of 16-byte chunk `chunk` of row `row` in a Q, K or V tile.
  static constexpr int offset(int row, int chunk) { return row * kRowBytes + ((chunk ^ (row & 7)) << 4); }
  // The end-of-loop merge reuses the stages: every warp's unnormalized O, (kWarps, 16, kHeadDim + 4) fp32 (rows
  // padded so the float2 stores of a quad's rows do not collide), and per (warp, row) max, sum and weight.
  static constexpr int kMergeLd = kHeadDim + 4;
  static constexpr int kMergeBytes = kWarps * 16 * kMergeLd * 4;
  static constexpr int kRowStatBytes = 3 * kWarps * 16 * 4 + kBlockM * 4;

  // Two CTAs per SM for the 16-row shape up to d = 128 (a second CTA's loads cover the first one's epilogue and
  // the latency of short key ranges); one otherwise, where the larger Q tile or K/V rows leave no room for two.
  static constexpr int kCtasPerSm = (kWarpsM == 1 && kHeadDim <= 128) ? 2 : 1;
  static constexpr int kBudget =
      kCtasPerSm == 2 ? kSmemPerSm / 2 - kSmemReservedPerCta : kMaxSmemPerCta;
  // As many stages as the budget holds (memory-bound: the bytes in flight per SM set the bandwidth): d = 64 6
  // stages (16 rows) or 8 (64 rows), d = 128 3 or 6, d = 256 3; up to kMaxStages.
  // The kernel rounds its dynamic shared memory's start up to 128 bytes (the swizzle's XOR addressing needs
  // 128-byte aligned tiles; the runtime promises 16): up to kAlignSlack bytes are skipped.
  static constexpr int kAlignSlack = 128;
  static constexpr int kStagesFit = (kBudget - kAlignSlack - kQBytes - kRowStatBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit > kMaxStages ? kMaxStages : kStagesFit;
  static_assert(kStages >= 2, "a pipeline needs two stages");
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static_assert(kMergeBytes <= kPipeBytes, "the merge fits in the stages it reuses");
  static constexpr int kOffStages = 0;
  static constexpr int kOffQ = kPipeBytes;
  static constexpr int kOffStats = kOffQ + kQBytes;
  static constexpr int kSmemBytes = kOffStats + kRowStatBytes + kAlignSlack;  // what the launch asks for
  static_assert(kSmemBytes <= kBudget, "shared memory of the CTAs per SM");
};

// Which shape a problem with `rows` = seqlen_q * group rows per (sequence, KV head) uses.
inline constexpr int64_t kNarrowTileRows = 16;  // the kWarpsM = 1 tile's rows
constexpr bool decode_wide_rows(int64_t rows) { return rows > kNarrowTileRows; }
constexpr int64_t decode_block_m(int64_t rows) { return decode_wide_rows(rows) ? 64 : kNarrowTileRows; }
constexpr int decode_ctas_per_sm(int64_t rows, int64_t head_dim) {
  return decode_wide_rows(rows) ? 1 : head_dim <= 128 ? 2 : 1;
}

// The split count (docs/kvcache.md). Work items: one per (sequence, KV head, row tile); slots: the GPU's resident
// CTAs (SMs x CTAs per SM). No split while the items fill 80 % of the slots (common/split_kv.h's rule). Otherwise
// one wave: where the SMs alone still give each item at least two splits, one CTA per SM's worth of splits (fewer
// partials to merge, each CTA reading more keys: measured faster for contiguous, head-major and paged caches
// alike, docs/performance.md, KV-cache decode); else as many splits as fill every slot.
// At least kMinKeysPerSplit keys per split. `max_keys` is the cache's capacity (device-resident lengths are not
// read on the host), so a batch of short sequences in a long cache may split more than it needs; the surplus
// splits find no key and cost one small CTA each.
constexpr int decode_num_splits(int requested, int64_t sms, int64_t batch, int64_t heads_kv, int64_t rows,
                                int64_t head_dim, int64_t max_keys) {
  if (requested > 0) return requested;
  const int64_t tiles = (rows + decode_block_m(rows) - 1) / decode_block_m(rows);
  const int64_t items = batch * heads_kv * tiles, slots = sms * decode_ctas_per_sm(rows, head_dim);
  if (items <= 0 || items * 5 >= slots * 4) return 1;
  int64_t splits = sms / items >= 2 ? sms / items : slots / items;
  if (splits > max_keys / detail::kMinKeysPerSplit) splits = max_keys / detail::kMinKeysPerSplit;
  if (splits > detail::kMaxSplits) splits = detail::kMaxSplits;
  return splits > 1 ? static_cast<int>(splits) : 1;
}

}  // namespace flash4::sm90::decode
