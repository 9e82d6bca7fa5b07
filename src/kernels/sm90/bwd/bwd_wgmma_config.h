// Tile configuration of the wgmma + TMA backward kernel (bwd_wgmma_kernel.cuh), shared by the host (workspace,
// grid, shared-memory size) and the kernel. Plain constexpr data.
//
// A CTA owns kBlockN = 128 keys of one (batch, kv head); consumer warpgroup w owns keys 64w .. 64w + 63 (the M of
// every wgmma is 64) and keeps their dK, dV (64 x d fp32 each) in registers across the whole Q loop.
//  * d = 128: dK + dV = 128 registers per thread, so Q tiles are kBlockM = 64 rows: S^T, dP^T are 64 x 64
//             (32 registers each). dQ (64 x 128) is split by columns: warpgroup w computes columns 64w .. 64w + 63.
//  * d = 64:  dK + dV = 64 registers, so kBlockM = 128: S^T, dP^T are 64 x 128 (64 registers each). dQ
//             (128 x 64) is split by rows: warpgroup w computes rows 64w .. 64w + 63.
//  * d = 96:  d = 128's tiles and shared memory (rows padded to two 64-column chunks; TMA zero-fills the columns
//             past 96), with S^T, dP^T over 96 columns and dK, dV 96 wide (48 registers each). dQ keeps d =
//             128's two 64-column pieces: the second is half zeros (K's padded columns), and its writer sends
//             only the first half. (An N = 32 wgmma for that piece needs its own compiled consumer loop, which
//             made ptxas serialize the persistent kernel's wgmmas for lack of registers.)
// Either way each warpgroup's dQ piece is 64 x 64 (32 registers), one wgmma N = 64 per k-step.
// Shared memory (bytes): K, V 2 * 128 d * 2; Q, dO 2 stages * 2 * kBlockM d * 2; dS 2 buffers * kBlockM * 128 * 2;
// d = 128: 64 + 64 + 32 KB = 160 KB; d = 64: 32 + 64 + 64 KB = 160 KB (+ LSE, D, barriers, 1 KB alignment).
// head_dim 192 and 256 have their own tile below (dK + dV would be 192 or 256 registers per thread at 64 keys per
// warpgroup).
#pragma once

namespace flash4::sm90::bwd {

template <int kHeadDim_>
struct WgmmaTile {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128, "the wgmma backward covers head_dim 64 .. 128");
  static constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;  // queries per Q tile
  static constexpr int kBlockN = 128;                         // keys per CTA
  static constexpr int kStages = 2;                           // Q / dO / LSE / D ring depth
  static constexpr int kConsumers = 2;                        // warpgroups of 64 keys
  static constexpr int kThreads = 128 * (1 + kConsumers);     // + one producer warpgroup
  static constexpr int kChunks = (kHeadDim + 63) / 64;        // 64-column (128-byte) swizzle chunks per row
  // dQ split between the consumers: by rows when kBlockM = 128, by 64-column chunks when kBlockM = 64.
  static constexpr bool kDqSplitRows = kBlockM == 128;
  static constexpr int kDqCols = kDqSplitRows ? kHeadDim : 64;
  static_assert(kBlockN == 64 * kConsumers);
  static_assert(kDqCols == 64 && (kDqSplitRows ? kBlockM == 128 : kBlockM == 64), "each dQ piece is 64 x 64");
};

// head_dim 192 and 256 (bwd_wgmma_roles_kernel.cuh): a CTA owns 64 keys and the two consumer warpgroups split the
// work by role: one computes S^T, P^T and dV, the other dP^T, dS^T and dK (each accumulator 64 x d: d / 2
// registers per thread), and they split dQ's columns by whole 64-column chunks (d = 256: two each; d = 192: two
// for the dP warpgroup, one for the S warpgroup). Shared memory at d = 256: K, V 2 x 32 KB; Q, dO 2 stages x 2 x
// 32 KB; dS 2 x 8 KB; P^T hand-off 16 KB: 224 KB (+ LSE, D, barriers, 1 KB alignment: exactly the 227 KB limit);
// at d = 192 K, V 2 x 24 KB and Q, dO 3 stages x 2 x 24 KB: 224 KB as well.
// (192, 128), DeepSeek's MLA, has role-split kernels of its own (BwdWgmmaRolesKernel's kHeadDimV = 128): V and dO
// tiles of two chunks, dV in 64 registers; other pairs with a narrower v run it zero-padded to q / k's width.
constexpr bool bwd_has_split_kernel(int head_dim, int head_dim_v) { return head_dim == 192 && head_dim_v == 128; }

template <int kHeadDim_>
struct WgmmaTileRoles {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 192 || kHeadDim == 256, "the role-split backward covers head_dim 192 and 256");
  static constexpr int kBlockM = 64;    // queries per Q tile
  static constexpr int kBlockN = 64;    // keys per CTA
  // Q / dO / LSE / D ring depth: a third stage fits at d = 192, whose tiles are 3/4 of d = 256's.
  static constexpr int kStages = kHeadDim == 192 ? 3 : 2;
  static constexpr int kConsumers = 2;  // warpgroups: the S role and the dP role
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kChunks = kHeadDim / 64;  // 64-column (128-byte) swizzle chunks per row
  // dQ's chunks per Q tile: the dP warpgroup's share (columns of one wgmma N) and the S warpgroup's; equal at 256.
  static constexpr int kDqWideChunks = (kChunks + 1) / 2;
  static constexpr int kDqNarrowChunks = kChunks / 2;
};

}  // namespace flash4::sm90::bwd
