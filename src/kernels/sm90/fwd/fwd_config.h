// Tile configuration of the Hopper forward kernel per (head dim, masked). Plain constexpr data, shared by the
// host dispatch (shared-memory size, grid) and the kernel, and checked on the CPU by tests.
//
// Budget per CTA (one CTA per SM): 227 KB of shared memory, 64K registers. Two consumer warpgroups of 64 query
// rows each (kBlockM = 128) plus one producer warpgroup; setmaxnreg gives the consumers 232-240 registers.
//  * d = 64:  K/V tiles are small (16 KB each), so 128 keys per tile and a 3-deep ring keep TMA well ahead.
//             The exp is ~70 % of the matmul time here, so the FMA-pipe polynomial takes a share of the exps.
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
  bool persistent;        // one CTA per SM claiming tiles (else one CTA per tile)
};

// Pipeline choices are measured on the H200 (bench/flash4_bench --ablation --rounds 3 at seqlen 8k; table in
// docs/performance.md). Intra-warpgroup overlap wins everywhere (+3-19 %). Ping-pong pays only at d = 64 causal
// (+11 %); elsewhere the two consumer warpgroups interleave well without it and the turn-taking costs 3-13 %.
// The FMA-pipe polynomial pays at most at d = 64 causal (+5 % for 1-2 of 8 exps, near the run-to-run noise);
// elsewhere even 1 of 8 costs 2-15 %: the softmax is issue-latency bound (the polynomial is ~9 instructions where
// MUFU is 1), not MUFU-throughput bound. Persistent CTAs win 3-10 % without a mask (no per-CTA prologue, the
// epilogue overlaps the next tile's loads) but lose 0-5 % with one (two runs): there the hardware block
// scheduler balances the short diagonal tiles better than our longest-first claiming.
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool masked) {
  const bool persistent = !masked;
  if (head_dim <= 64) return masked ? FwdTileConfig{128, 128, 3, 2, true, true, persistent} : FwdTileConfig{128, 128, 3, 0, true, false, persistent};
  if (head_dim <= 128) return {128, 128, 2, 0, true, false, persistent};
  return {128, 64, 2, 0, true, false, persistent};
}

constexpr int kFwdConsumerWarpgroups = 2;
constexpr int kFwdThreads = 128 * (1 + kFwdConsumerWarpgroups);

// Shared memory a configuration needs (16-bit elements), plus 1 KB to align the base for 128B swizzle.
constexpr int fwd_smem_bytes(int head_dim, bool masked) {
  const FwdTileConfig c = fwd_tile_config(head_dim, masked);
  const int q = c.block_m * head_dim * 2;
  const int kv = 2 * c.stages * c.block_n * head_dim * 2;
  const int barriers = (1 + 4 * c.stages) * 8;
  return q + kv + barriers + 1024;
}

static_assert(fwd_smem_bytes(64, false) <= 232448);
static_assert(fwd_smem_bytes(128, false) <= 232448);
static_assert(fwd_smem_bytes(256, false) <= 232448);

}  // namespace flash4::sm90
