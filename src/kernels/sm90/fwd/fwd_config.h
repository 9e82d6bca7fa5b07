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
};

// Pipeline choices are measured on the H200 (bench/flash4_bench --ablation at seqlen 8k and --candidates at
// every seqlen; tables in docs/performance.md). Intra-warpgroup overlap wins everywhere (+3-19 %). Ping-pong
// costs 3-13 % with two consumers except at d = 64 causal, and with three consumers at d = 64 it costs 1-6 %:
// the consumer warpgroups already interleave on the SM sub-partitions without turn-taking. The FMA-pipe
// polynomial (2 of 8 exps) won 5 % only at d = 64 causal with two consumers; with three it costs 4-14 %, and
// elsewhere even 1 of 8 costs 2-15 %: the softmax is issue/latency bound (the polynomial is ~9 instructions
// where MUFU.EX2 is 1), not MUFU-throughput bound, so it is off everywhere (the kernel keeps it for ablation).
// A second P buffer (double_p) wins at d = 128 (+1..+6 % at every seqlen but one noisy point; bench/results/
// 2026-11-29-h200-fwd-double-p.json); at d = 256 it measured -9..+4 %, and d = 64 has no registers for it.
// Candidates measured and rejected: 128 x 176 at d = 128 (-2..-12 %) and 128 x 80 at d = 256 (-7..+4 %), both
// spill with S that large.
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool masked) {
  (void)masked;
  if (head_dim <= 64) return {192, 128, 3, 0, true, false};
  if (head_dim <= 128) return {128, 128, 2, 0, true, false, /*double_p=*/true};
  return {128, 64, 2, 0, true, false};
}

// Short masked problems at d = 64 (seqlen_q <= 2048): the 192-row tile wastes more of the short diagonal tiles
// than it gains, and two consumers on 128 x 128 measured 1.14-1.20x faster at 512 and 1k (causal; bench/results/
// 2026-11-29-h200-tile-candidates.json); at 2k it measured 0.96-1.01x then and 1.02-1.06x after later kernel
// changes (two runs, ...-fwd-launch-candidates.json), at 4k +0.6..+2.5 % (left out), at 8k -4..-7 %. Compiled
// as a second kernel of that configuration.
constexpr bool fwd_has_short_config(int head_dim, bool masked) { return head_dim <= 64 && masked; }
constexpr FwdTileConfig fwd_short_tile_config(int head_dim) {
  (void)head_dim;
  return {128, 128, 3, 0, true, false};
}
constexpr bool fwd_use_short_config(int head_dim, bool masked, int seqlen_q) {
  return fwd_has_short_config(head_dim, masked) && seqlen_q <= 2048;
}
// The configuration a problem runs with.
constexpr FwdTileConfig fwd_tile_config_for(int head_dim, bool masked, int seqlen_q) {
  return fwd_use_short_config(head_dim, masked, seqlen_q) ? fwd_short_tile_config(head_dim)
                                                          : fwd_tile_config(head_dim, masked);
}

// Persistent CTAs (one per SM, claiming tiles from the dynamic scheduler) or one CTA per tile. Persistent wins
// without a mask (3-10 %: no per-CTA prologue, the epilogue overlaps the next tile's loads) and for masked
// sequences up to 8k at d = 64 / 128 (+5-28 % at seqlen_q <= 2k, where per-CTA setup is a large share of a short
// diagonal tile; since the d = 128 cross-tile overlap, which only a CTA with several tiles uses, +6.5 % at 4k and
// +1.5 % at 8k; d = 64 +5 % at 8k: bench/results/2026-11-29-h200-fwd-launch-candidates.json). Beyond that the
// hardware block scheduler balances the diagonal tiles better than our longest-first claiming (d = 128 causal 16k:
// -6 %), as it does at d = 256 from 4k on (-2.5 %). The grid size is the only difference: a runtime choice.
constexpr bool fwd_launch_persistent(int head_dim, bool masked, int seqlen_q) {
  return !masked || seqlen_q <= (head_dim <= 128 ? 8192 : 2048);
}

// Consumer warpgroups (64 query rows each) and threads (+ one producer warpgroup) of a configuration.
constexpr int fwd_consumer_warpgroups(const FwdTileConfig& c) { return c.block_m / 64; }
constexpr int fwd_threads(const FwdTileConfig& c) { return 128 * (1 + fwd_consumer_warpgroups(c)); }

// Q tiles in shared memory: two for the cross-tile overlap (FwdKernel::kCrossTile: a consumer issues the next
// tile's first S while this tile's last P V runs, so the next Q must already be in place), which needs two P
// buffers: d = 128. Measured there +1..+12 % non-causal, -1..+4 % causal (bench/results/
// 2026-11-29-h200-fwd-cross-tile.json). A second Q buffer alone measured -3..-7 % at d = 64 and +-1 % at d = 128
// (...-fwd-q-double-buffer-rejected.json); d = 256's 64 KB Q does not fit twice.
constexpr int fwd_smem_bytes_with(const FwdTileConfig& c, int head_dim, int q_buffers) {
  const int q = q_buffers * c.block_m * head_dim * 2;
  const int kv = 2 * c.stages * c.block_n * head_dim * 2;
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
static_assert(fwd_smem_bytes(128, false) <= 232448);
static_assert(fwd_smem_bytes(256, false) <= 232448);
static_assert(fwd_smem_bytes(64, true) <= 232448);
static_assert(fwd_smem_bytes(128, true) <= 232448);
static_assert(fwd_smem_bytes(256, true) <= 232448);

}  // namespace flash4::sm90
