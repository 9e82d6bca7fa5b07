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

}  // namespace flash4::detail
