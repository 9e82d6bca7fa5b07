// The dQ additions of the role-split wgmma backward kernel (bwd_wgmma_roles_kernel.cuh, d = 192 and 256): each
// consumer warpgroup computes dQ = dS K for its share of a Q tile's 64-column chunks and adds it into the fp32
// (b, h, sq, d) accumulator with 16-byte red.global.adds of whole 128-byte lines, in the deterministic order when
// asked.
#pragma once

#include <cstdint>

#include "hw/sm90/fence.cuh"
#include "hw/sm90/named_barrier.cuh"
#include "hw/sm90/wgmma.cuh"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_warp_ops.cuh"
#include "kernels/sm90/device_math.cuh"

namespace flash4::sm90::bwd {

// Red (no return) of four consecutive floats into global memory, one instruction (sm_90; dst 16-byte aligned).
__device__ __forceinline__ void red_add_v4(float* dst, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

// `Kernel` (BwdWgmmaRolesKernel) gives the tile constants and its SharedStorage the ds and k tiles.
template <class Kernel, class Element, bool kMasked>
struct BwdRolesDqAdder {
  using Tile = typename Kernel::Tile;
  using SharedStorage = typename Kernel::SharedStorage;
  static constexpr int kBlockM = Kernel::kBlockM, kBlockN = Kernel::kBlockN;
  static constexpr int kConsumers = Kernel::kConsumers;
  static constexpr uint32_t kBarWg0 = Kernel::kBarWg0;

  // Deterministic mode: a warpgroup releases its additions into a Q tile's semaphore at its next add_dq (before
  // it waits for its own turn there, so no wait depends on a release behind it) or after its loop. By then a
  // whole tile of work has passed since the red.global.adds were issued, so the fence that must precede the
  // release no longer stalls the warpgroup on their trip to L2. `pending` = the tile's semaphore index, -1 = none
  // (32 bits: there are b * heads * m_blocks semaphores, far fewer than 2^31 for any Q that fits in memory).
  static __device__ __forceinline__ void release_dq(const BwdParams& p, int wg, int& pending) {
    __threadfence();                        // this thread's additions are performed
    named_barrier_sync(kBarWg0 + wg, 128);  // ... and every thread's
    if (threadIdx.x % 128 == 0) red_release_gpu_add(p.semaphores + pending, 1);
    pending = -1;
  }

  // dQ[:, 64 chunk0 .. 64 (chunk0 + kDqChunks) - 1] of one tile (dS in s.ds[buf]) into the fp32 accumulator, in
  // the deterministic order when asked. Runs in both consumer warpgroups (wg = their role index), on disjoint
  // chunks of the same tile.
  template <int kDqChunks, class Entry>
  static __device__ __forceinline__ void add_dq(const BwdParams& p, const Entry& e, SharedStorage& s, int wg,
                                                int chunk0, int buf, int n_block, int h, int b, int m_block, int m0,
                                                int& pending) {
    constexpr int kCols = 64 * kDqChunks;
    const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int col0 = 64 * chunk0;
    // ---- dQ[:, cols] = dS K[:, cols]: 64 queries x kCols columns, k = 64 keys; A K-major, B (K) MN-major ----
    float acc_dq[kCols / 2];
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      const uint64_t desc_ds = wgmma::make_desc_sw128(&s.ds[buf][0][ks * 16], 16, 1024);
      const uint64_t desc_kt = wgmma::make_desc_sw128(&s.k[chunk0][ks * 16][0], kBlockN * 128, 1024);
      wgmma::mma_ss<kCols, 1, Element>(acc_dq, desc_ds, desc_kt, ks > 0);
    }
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::fence_operand(acc_dq);

    // ---- dQ accumulator (fp32, (b, h, sq, d)) += dQ[:, cols]: rows 16 warp + g (+8), columns 8 (i / 4) + 2t ----
    int semaphore = -1;
    if (p.deterministic) {
      // Warpgroups add into this (b, h, Q tile) in the order of releases_before; each visible (tile, earlier key
      // tile) contributes one release per consumer warpgroup. Wait for "at least": the other warpgroup of this CTA
      // (disjoint columns, so its order against ours does not change any sum) may already have released, while
      // no later key tile can add before both of ours have.
      if (pending >= 0) release_dq(p, wg, pending);
      semaphore = (b * p.heads + h) * p.m_blocks + m_block;
      if (tid == 0) {
        const int expected = releases_before<Tile, kMasked>(e, m_block, n_block, kConsumers);
        while (ld_acquire_gpu(p.semaphores + semaphore) < expected) __nanosleep(64);
      }
      named_barrier_sync(kBarWg0 + wg, 128);  // our turn
    }
    // Two exchanges turn the accumulator layout into full 128-byte lines per pair of quads:
    //  1. A thread holds row r's columns 8j + 2t, +1 of every 8-column block j (r = g, then g + 8). Partners t,
    //     t ^ 1 swap one pair per two blocks (j0 = 2c, j1 = 2c + 1): the even thread then holds columns 16c +
    //     4 (t / 2) .. + 3, the odd one 16c + 8 + 4 (t / 2) .. + 3, so a quad holds 64 contiguous bytes of its
    //     row per segment c.
    //  2. Quads g and g ^ 1 (lanes 4 apart) swap four floats per two segments (2k, 2k + 1): the even quad keeps
    //     its row's segment 2k and takes the odd quad's row's segment 2k, the odd quad keeps its row's segment
    //     2k + 1 and takes the even quad's. Then one 16-byte atomic per thread writes the even row's 128-byte
    //     line (columns 32k .. 32k + 31) from both quads, and a second the odd row's.
    // The role-split backward is bound by L2 traffic, mostly these additions (Nsight Compute, 16k non-causal):
    // 8-byte atomics made 32-byte pieces of lines, 16-byte ones after step 1 64-byte pieces; full lines halve the
    // L2 requests again.
    // The accumulator's rows are q's true head dim wide (p.head_dim: narrower than the kernel when it runs
    // zero-padded, head_dims.h); this thread's 4 columns of line k start at col + 32 k, and those past the width
    // (zeros: K's padded columns) are not added. The width is a multiple of 8: 4-column groups are whole.
    const bool odd = (t & 1) != 0, odd_quad = (g & 1) != 0;
    const int col = col0 + 4 * (t / 2) + (odd ? 8 : 0) + (odd_quad ? 16 : 0);
    const int64_t row_stride = p.dq_accum_cols;  // = p.head_dim: row-major
    float* g_dq = p.dq_accum + workspace_row0(p, e, b, h) * row_stride + col;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // Step 1, in place: afterwards segment c of this thread's row is acc_dq[a], [a + 1], [a + 4], [a + 5] with
      // a = 8c + 2 half.
#pragma unroll
      for (int c = 0; c < kCols / 16; ++c) {
        const int a = 8 * c + 2 * half, bb = a + 4;
        const float lo = __shfl_xor_sync(0xffffffffu, odd ? acc_dq[a] : acc_dq[bb], 1);
        const float hi = __shfl_xor_sync(0xffffffffu, odd ? acc_dq[a + 1] : acc_dq[bb + 1], 1);
        acc_dq[a] = odd ? lo : acc_dq[a];
        acc_dq[a + 1] = odd ? hi : acc_dq[a + 1];
        acc_dq[bb] = odd ? acc_dq[bb] : lo;
        acc_dq[bb + 1] = odd ? acc_dq[bb + 1] : hi;
      }
      // Step 2 and the atomics: rows 16 warp + (g & ~1) + 8 half (even quad's) and + 1 (odd quad's).
      const int row_even = m0 + warp * 16 + (g & ~1) + 8 * half;
      float* g_row = g_dq + static_cast<int64_t>(row_even) * row_stride;
#pragma unroll
      for (int k = 0; k < kCols / 32; ++k) {
        const int a0 = 16 * k + 2 * half, a1 = a0 + 8;  // segments 2k and 2k + 1
        const int idx[4] = {0, 1, 4, 5};
        float mine[4], sent[4], recv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          mine[i] = odd_quad ? acc_dq[a1 + idx[i]] : acc_dq[a0 + idx[i]];  // kept: own row's segment
          sent[i] = odd_quad ? acc_dq[a0 + idx[i]] : acc_dq[a1 + idx[i]];  // the partner row's line needs it
          recv[i] = __shfl_xor_sync(0xffffffffu, sent[i], 4);
        }
        // Even quad: mine = even row, segment 2k; recv = odd row, segment 2k. Odd quad: mine = odd row, segment
        // 2k + 1; recv = even row, segment 2k + 1 (g_dq already points 16 columns on for the odd quad).
        float even_row[4], odd_row[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          even_row[i] = odd_quad ? recv[i] : mine[i];
          odd_row[i] = odd_quad ? mine[i] : recv[i];
        }
        if (col + 32 * k >= p.head_dim) continue;
        if (row_even < e.seqlen_q)
          red_add_v4(g_row + 32 * k, even_row[0], even_row[1], even_row[2], even_row[3]);
        if (row_even + 1 < e.seqlen_q)
          red_add_v4(g_row + row_stride + 32 * k, odd_row[0], odd_row[1], odd_row[2], odd_row[3]);
      }
    }
    pending = semaphore;  // released at the next add_dq or after the loop (release_dq) ...
    if (p.deterministic && !p.det_defer_release) release_dq(p, wg, pending);  // ... or now (bwd_params.h)
  }

};

}  // namespace flash4::sm90::bwd
