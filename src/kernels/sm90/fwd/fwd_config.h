// Tile configuration of the Hopper forward kernel per (head dim, masked). Plain constexpr data, shared by the
// host dispatch (shared-memory size, grid) and the kernel, and checked on the CPU by tests.
//
// Budget per CTA (one CTA per SM): 227 KB of shared memory, 64K registers, one producer warpgroup plus two or
// three consumer warpgroups of 64 query rows each; setmaxnreg moves the registers to the consumers.
//  * d = 64:  three consumers (block_m 192, 160 registers each): S (64 regs) + P (32) + O (32) still fit, and
//             the third warpgroup gives each scheduler a third warp to hide the softmax's latency (the d = 64
//             softmax is as long as its matmuls). K/V tiles are small (16 KB), so a 3-deep ring. Short masked
//             problems use 128 x 128 instead (fwd_short_tile_config below).
//  * d = 128: 128 x 128 tiles: S (64 regs) + P (32) + O (64) fit in 232 registers while the next S is in
//             flight; 2 stages of K and V (4 x 32 KB) + Q (32 KB) = 160 KB.
//  * d = 96:  d = 128's configuration and shared memory (rows padded to two 64-column chunks), with matmuls
//             96 wide: 3/4 of the matmul work, and O in 48 registers. Three consumers on 192 x 96 tiles fit
//             their registers (192 x 128 spills) but were no faster overall (docs/performance.md).
//  * d = 192: O takes 96 registers, so S of 112 keys (56) and P (28) still fit beside the next S in flight;
//             Q 48 KB + 2 x (42 + 42) KB = 216 KB. Three 64-column chunks per row; 3/4 of the matmul work of
//             192 zero-padded on the 256 kernel.
//  * d = 256: O alone takes 128 registers, so S shrinks to 64 keys (32 regs); Q 64 KB + 2 x (32 + 32) KB =
//             192 KB. The exp is ~17 % of the matmul time: no emulation.
#pragma once

namespace flash4::sm90 {

struct FwdTileConfig {
  int block_m;            // query rows per CTA (64 per consumer warpgroup)
  int block_n;            // keys per K/V tile
  int stages;             // depth of the K/V shared-memory ring
  int poly_exp2_per_8;    // of every 8 exponentials, how many use the FMA-pipe polynomial (0 = none)
  bool intra_wg_overlap;  // issue S(j+1) with P(j) V(j); softmax of j+1 overlaps P(j) V(j)
  bool pingpong;          // consumer warpgroups take turns issuing matmuls (named barriers)
  bool double_p = false;  // two P fragment buffers: P(j) is converted while P(j+1) V(j+1) still runs

  // Named edits, for the ablation benchmark and tests: `table.with_pingpong(true)`.
  constexpr FwdTileConfig with_tile(int m, int n) const { FwdTileConfig c = *this; c.block_m = m; c.block_n = n; return c; }
  constexpr FwdTileConfig with_stages(int n) const { FwdTileConfig c = *this; c.stages = n; return c; }
  constexpr FwdTileConfig with_poly_exp2_per_8(int n) const { FwdTileConfig c = *this; c.poly_exp2_per_8 = n; return c; }
  constexpr FwdTileConfig with_intra_wg_overlap(bool on) const { FwdTileConfig c = *this; c.intra_wg_overlap = on; return c; }
  constexpr FwdTileConfig with_pingpong(bool on) const { FwdTileConfig c = *this; c.pingpong = on; return c; }
  constexpr FwdTileConfig with_double_p(bool on) const { FwdTileConfig c = *this; c.double_p = on; return c; }
};

// Every choice below was measured on the H200 (bench/flash4_bench --ablation / --candidates; the numbers and
// rejected candidates are in docs/performance.md). Intra-warpgroup overlap wins everywhere. Ping-pong is off: the
// consumer warpgroups already interleave on the SM sub-partitions. The FMA-pipe polynomial is off: the softmax is
// issue- and latency-bound (the polynomial is ~9 instructions where MUFU.EX2 is one), not MUFU-throughput-bound;
// the kernel keeps it for the ablation. A second P buffer pays at d = 128 only (d = 64 has no registers for it).
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool masked) {
  (void)masked;
  if (head_dim <= 64) return {192, 128, 3, 0, true, false};
  if (head_dim <= 128) return {128, 128, 2, 0, true, false, /*double_p=*/true};
  if (head_dim <= 192) return {128, 112, 2, 0, true, false};
  return {128, 64, 2, 0, true, false};
}

// v / out narrower than q / k: (192, 128), DeepSeek's multi-head latent attention, has a kernel of its own
// (FwdSplitTableConfig): O takes 64 registers instead of 96, so S of 128 keys (64) and P (32) fit beside the next
// S in flight, and V's tiles are 128 columns: Q 48 KB + 2 x (48 + 32) KB = 208 KB.
constexpr bool fwd_has_split_kernel(int head_dim, int head_dim_v) { return head_dim == 192 && head_dim_v == 128; }
constexpr FwdTileConfig fwd_split_tile_config(int head_dim, int head_dim_v) {
  (void)head_dim;
  (void)head_dim_v;
  return {128, 128, 2, 0, true, false};
}

// Short masked problems at d = 64 (seqlen_q <= 2048): the 192-row tile wastes more of the short diagonal tiles
// than its third consumer gains, so two consumers on 128 x 128 run instead (a second compiled kernel).
constexpr bool fwd_has_short_config(int head_dim, bool masked) { return head_dim <= 64 && masked; }
constexpr FwdTileConfig fwd_short_tile_config(int head_dim) {
  (void)head_dim;
  return {128, 128, 3, 0, true, false};
}
constexpr bool fwd_use_short_config(int head_dim, bool masked, int seqlen_q) {
  return fwd_has_short_config(head_dim, masked) && seqlen_q <= 2048;
}

// FP8 (e4m3) kernels, d = 128 and 256: 128 x 128 tiles (V^T tiles are whole 128-key swizzle chunks); one-byte
// tiles halve the shared memory, so a 3-deep ring at d = 128. One P buffer: its fragments are a quarter of S's.
// At d = 256, O (128 registers) and S (64) leave no room for the next S in flight: no intra-warpgroup overlap
// (with it the kernel spills); the two consumer warpgroups still overlap each other's softmax and matmuls.
constexpr FwdTileConfig fwd_fp8_tile_config(int head_dim) {
  if (head_dim <= 128) return {128, 128, 3, 0, true, false};
  return {128, 128, 2, 0, false, false};
}

// Persistent CTAs (one per SM, claiming tiles from the dynamic scheduler) or one CTA per tile. Persistent pays
// without a mask (no per-CTA prologue; the epilogue overlaps the next tile's loads) and for masked problems up to
// 8k at d = 64 / 128; beyond that, and at d = 256 past 2k, the hardware block scheduler balances the long
// diagonal tiles better than longest-first claiming. Only the grid differs: a runtime choice.
constexpr bool fwd_launch_persistent(int head_dim, bool masked, int seqlen_q) {
  return !masked || seqlen_q <= (head_dim <= 128 ? 8192 : 2048);
}

// The one launch decision for a problem, made by dispatch and handed to both the parameter builder (tile sizes:
// TMA boxes, number of m-blocks) and the launcher (which compiled kernel, which grid).
struct FwdLaunchConfig {
  FwdTileConfig tile;
  bool short_tile;  // the short-problem kernel (fwd_short_tile_config) instead of the table's
  bool persistent;  // one CTA per SM claiming tiles, else one CTA per tile
};
constexpr FwdLaunchConfig fwd_launch_config(int head_dim, bool masked, int seqlen_q) {
  const bool short_tile = fwd_use_short_config(head_dim, masked, seqlen_q);
  return {short_tile ? fwd_short_tile_config(head_dim) : fwd_tile_config(head_dim, masked), short_tile,
          fwd_launch_persistent(head_dim, masked, seqlen_q)};
}
// The same for kernel head dims (head_dim, head_dim_v): the split kernel's tile where there is one.
constexpr FwdLaunchConfig fwd_launch_config(int head_dim, int head_dim_v, bool masked, int seqlen_q) {
  if (!fwd_has_split_kernel(head_dim, head_dim_v)) return fwd_launch_config(head_dim, masked, seqlen_q);
  return {fwd_split_tile_config(head_dim, head_dim_v), false, fwd_launch_persistent(head_dim, masked, seqlen_q)};
}

// Consumer warpgroups (64 query rows each) and threads (+ one producer warpgroup) of a configuration.
constexpr int fwd_consumer_warpgroups(const FwdTileConfig& c) { return c.block_m / 64; }
constexpr int fwd_threads(const FwdTileConfig& c) { return 128 * (1 + fwd_consumer_warpgroups(c)); }

// Columns of a 16-bit Q / K / V row in shared memory: whole 64-column (128-byte) swizzle chunks, so d = 96 is
// stored as 128 (TMA zero-fills the columns past the tensor's width; no matmul reads them).
constexpr int fwd_smem_head_dim(int head_dim) { return (head_dim + 63) / 64 * 64; }

// Q tiles in shared memory: two for the cross-tile overlap (a consumer issues the next tile's first S while this
// tile's last P V runs, so the next Q must already be in place), which needs two P buffers: d = 128. A second Q
// buffer alone does not pay, and d = 256's 64 KB Q does not fit twice.
constexpr int fwd_smem_bytes_with(const FwdTileConfig& c, int head_dim, int q_buffers) {
  const int q = q_buffers * c.block_m * fwd_smem_head_dim(head_dim) * 2;
  const int kv = 2 * c.stages * c.block_n * fwd_smem_head_dim(head_dim) * 2;
  const int barriers = (2 * q_buffers + 4 * c.stages) * 8 + q_buffers * 8;  // + the tile ids
  return q + kv + barriers + 1024;  // + 1 KB to align the base for 128B swizzle
}
constexpr bool fwd_cross_tile(const FwdTileConfig& c, int head_dim) {
  return c.intra_wg_overlap && c.double_p && !c.pingpong && fwd_smem_bytes_with(c, head_dim, 2) <= 232448;
}
constexpr int fwd_q_buffers(const FwdTileConfig& c, int head_dim) { return fwd_cross_tile(c, head_dim) ? 2 : 1; }
// Shared memory a configuration needs (16-bit elements).
constexpr int fwd_smem_bytes(const FwdTileConfig& c, int head_dim) {
  return fwd_smem_bytes_with(c, head_dim, fwd_q_buffers(c, head_dim));
}
constexpr int fwd_smem_bytes(int head_dim, bool masked) {
  return fwd_smem_bytes(fwd_tile_config(head_dim, masked), head_dim);
}

static_assert(fwd_smem_bytes(64, false) <= 232448);
static_assert(fwd_smem_bytes(96, false) <= 232448);
static_assert(fwd_smem_bytes(128, false) <= 232448);
static_assert(fwd_smem_bytes(192, false) <= 232448);
static_assert(fwd_smem_bytes(256, false) <= 232448);
static_assert(fwd_smem_bytes(64, true) <= 232448);
static_assert(fwd_smem_bytes(96, true) <= 232448);
static_assert(fwd_smem_bytes(128, true) <= 232448);
static_assert(fwd_smem_bytes(192, true) <= 232448);
static_assert(fwd_smem_bytes(256, true) <= 232448);

}  // namespace flash4::sm90
