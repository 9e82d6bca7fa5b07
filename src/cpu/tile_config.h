// Tile sizes and constants of the CPU FlashAttention (the GPU kernels choose their own per head dim).
#pragma once

#include "common/score_transform.h"

namespace flash4::cpu {

// 64 x 64 fp32 tiles: Q, K^T, V, S/P and O for d = 256 take ~280 KB, which stays in L2; larger tiles do not
// vectorize better and make causal tiles waste more work on the diagonal.
inline constexpr int kBlockM = 64;  // query rows per tile (one task)
inline constexpr int kBlockN = 64;  // keys per tile

// FA4's conditional rescaling threshold in log2 units: P = 2^(t - m_ref) stays <= 2^8.
inline constexpr float kRescaleThreshold = 8.0f;

using detail::kLog2e;
using detail::kLn2;

}  // namespace flash4::cpu
