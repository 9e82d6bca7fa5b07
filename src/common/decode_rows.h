// Which attention problems are decode-like: few query rows per KV head, where the split-KV decode kernel (a KV
// head's query rows packed into its tiles, the keys spread over the SMs) beats the dense forward's 128-row tiles.
// One rule for the forward's decode route, the KV-cache path's choice of kernel and the CPU path that mirrors them.
// Host and device; no CUDA headers.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

inline constexpr int64_t kDecodeMaxQueries = 16;  // queries per sequence
inline constexpr int64_t kDecodeMaxRows = 128;    // queries x the GQA group per KV head: two 64-row tiles

FLASH4_HD constexpr bool decode_rows(int64_t seqlen_q, int64_t group) {
  return seqlen_q <= kDecodeMaxQueries && seqlen_q * group <= kDecodeMaxRows;
}

// The most queries a sequence holds for decode_rows at this GQA group (0 when a single query's rows exceed it):
// in a packed batch of mixed counts, the segments the decode kernel takes.
FLASH4_HD constexpr int64_t decode_max_queries(int64_t group) {
  return group <= 0 ? 0 : kDecodeMaxRows / group < kDecodeMaxQueries ? kDecodeMaxRows / group : kDecodeMaxQueries;
}

// The GPU's second case: a few long caches with up to 64 queries each (speculative or chunked steps). The dense
// kernel gives each (sequence, query head) one CTA that walks every key, so batch x heads CTAs at most half the SMs
// leave the rest idle, while the decode kernel spreads the keys over all of them (up to four 64-row tiles per KV
// head). The dense kernel's time is then one CTA's walk, whatever share of its 128-row tile the queries fill; the
// decode kernel's grows with the call's query rows (batch x heads x seqlen_q), and the two meet near 2048 of them
// (docs/performance.md, the decode route's bounds). Not mirrored by the CPU path, whose threads are not the SMs.
inline constexpr int64_t kDecodeFewCtasMaxQueries = 64;
inline constexpr int64_t kDecodeFewCtasMaxRows = 256;
inline constexpr int64_t kDecodeFewCtasMaxQueryRows = 2048;
inline constexpr int64_t kDecodeFewCtasMinKeys = 16384;

FLASH4_HD constexpr bool decode_rows_on_few_ctas(int64_t seqlen_q, int64_t group, int64_t batch, int64_t heads,
                                                 int64_t seqlen_k, int64_t sm_count) {
  return seqlen_q <= kDecodeFewCtasMaxQueries && seqlen_q * group <= kDecodeFewCtasMaxRows &&
         seqlen_k >= kDecodeFewCtasMinKeys && 2 * batch * heads <= sm_count &&
         batch * heads * seqlen_q <= kDecodeFewCtasMaxQueryRows;
}

}  // namespace flash4::detail
