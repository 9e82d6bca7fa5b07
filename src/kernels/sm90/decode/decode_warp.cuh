// One warp's share of a decode block: 16 rows (one m16 fragment) against kKeysPerWarp keys of the stage.
//   S = Q K^T      (16, kKeysPerWarp) fp32 registers, mma.sync m16n8k16; Q and K by ldmatrix from shared memory
//                  (Q once, kept in registers up to d = 128)
//   online softmax over S in log2 units (exp2), masked where the block needs it; running max m and sum l per row
//   O += P V       (16, kHeadDim) fp32 registers; P converted to 16 bits in registers (the C fragments of S are the
//                  A fragments of P), V by ldmatrix.trans
// Each thread holds rows g = lane / 4 and g + 8 (index 0 and 1 below) and columns 2t, 2t + 1 of every n8 fragment
// (t = lane % 4), so row reductions are two shuffles within the quad.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/mask.h"
#include "common/score_transform.h"
#include "hw/sm90/mma_sync.cuh"
#include "kernels/sm90/device_math.cuh"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::decode {

// One lane's ldmatrix addresses in a swizzled tile (DecodeTile::offset): row `row` (kept modulo 8 by every row
// step the callers add: multiples of 16), starting at 16-byte chunk `chunk` (0 or 1) of each 16-column step kc.
// The swizzle permutes chunks only within a 128-byte group and the row's own bits sit above that group, so in a
// tile placed at a 128-byte aligned shared address, step kc is step 0's address with bits 5-6 XORed by kc % 4,
// plus kc / 4 groups: one register per operand, and nothing for the compiler to keep across blocks.
template <class Tile>
struct SwizzledLane {
  uint32_t first;  // step 0: a byte offset in the tile, or (at) a shared address
  __device__ __forceinline__ SwizzledLane(int row, int chunk) : first(Tile::offset(row, chunk)) {}
  // This lane's addresses in the tile at shared address `tile` (128-byte aligned).
  __device__ __forceinline__ SwizzledLane in(uint32_t tile) const {
    SwizzledLane at = *this;
    at.first += tile;
    return at;
  }
  __device__ __forceinline__ uint32_t at(int kc) const { return (first ^ ((kc % 4) << 5)) + (kc / 4) * 128; }
};

template <class Element, class Tile>
struct DecodeWarp {
  static constexpr int kDimFrags = Tile::kHeadDim / 8;  // n8 fragments of O
  static constexpr int kKeyFrags = Tile::kKeyFrags;     // n8 fragments of S
  static constexpr int kRowBytes = Tile::kRowBytes;

  // Q's A fragments stay in registers for the whole key loop up to d = 128 (32 registers; at d = 256 they would
  // not fit beside O), so a block's S starts without waiting for shared-memory loads of Q.
  static constexpr bool kQInRegisters = Tile::kHeadDim <= 128;

  float o[kDimFrags][4];  // unnormalized output, rows g and g + 8
  float m[2];             // running row max of the scores (log2 units), -inf before any visible key
  float l[2];             // this thread's part of the row sums of exp2(s - m) (reduced over the quad at the end)
  uint32_t q[Tile::kHeadDim / 16][4];  // Q's A fragments (kQInRegisters), loaded once by load_q

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int f = 0; f < kDimFrags; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  // Q's fragments into registers (kQInRegisters), once Q has landed in shared memory.
  __device__ __forceinline__ void load_q(const SwizzledLane<Tile>& q_lane) {
    if constexpr (kQInRegisters) {
#pragma unroll
      for (int kc = 0; kc < Tile::kHeadDim / 16; ++kc) ldsm_x4(q_lane.at(kc), q[kc]);
    }
  }

  // S = Q K^T through this lane's addresses in the Q tile (the warp's rows) and the stage's K tile (the warp's key
  // slice). Even and odd k-steps accumulate separately and are added at the end: two dependent mma chains of half
  // the length.
  __device__ __forceinline__ void scores(const SwizzledLane<Tile>& q_lane, const SwizzledLane<Tile>& k_lane,
                                         float (&s)[kKeyFrags][4]) const {
    float odd[kKeyFrags][4];
#pragma unroll
    for (int f = 0; f < kKeyFrags; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[f][e] = odd[f][e] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < Tile::kHeadDim / 16; ++kc) {
      uint32_t a[4];
      if constexpr (kQInRegisters) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = q[kc][r];
      } else {
        ldsm_x4(q_lane.at(kc), a);
      }
      float (&acc)[kKeyFrags][4] = kc % 2 == 0 ? s : odd;
#pragma unroll
      for (int kp = 0; kp < kKeyFrags / 2; ++kp) {
        uint32_t b[4];  // keys 16 kp .. +7: b[0], b[1]; keys +8 .. +15: b[2], b[3]
        ldsm_x4(k_lane.at(kc) + kp * 16 * kRowBytes, b);
        mma_16816<Element>(acc[2 * kp], a, b[0], b[1]);
        mma_16816<Element>(acc[2 * kp + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int f = 0; f < kKeyFrags; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[f][e] += odd[f][e];
  }

  // Scores -> log2 units (common/score_transform.h); with `masked`, keys past `last` or outside row i's band are
  // -inf. `j_lane`: the key of this thread's first column; i_row: the query of rows g and g + 8.
  __device__ __forceinline__ void transform(float (&s)[kKeyFrags][4], const detail::ScoreTransform& st, bool masked,
                                            const detail::SequenceMask& mask, const int64_t (&i_row)[2],
                                            int64_t j_lane, int64_t last) const {
#pragma unroll
    for (int f = 0; f < kKeyFrags; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[f][e];
        x = st.has_softcap() ? tanh_accurate(x * st.tanh_scale) * st.log2_scale : x * st.log2_scale;
        if (masked) {
          const int64_t j = j_lane + f * 8 + (e & 1);
          if (j > last || !mask.visible(i_row[e >> 1], j)) x = -INFINITY;
        }
        s[f][e] = x;
      }
  }

  // The online softmax step: new row max, O and l rescaled to it, s replaced by P = exp2(s - m). The rescale is
  // skipped when no row of the warp has a larger max (its factor would be exactly 1), which after the first
  // blocks is nearly every block; the test is warp-uniform, so the skip does not diverge.
  __device__ __forceinline__ void softmax(float (&s)[kKeyFrags][4]) {
    float m_new[2];
    bool grew = false;
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      float mx = -INFINITY;
#pragma unroll
      for (int f = 0; f < kKeyFrags; ++f) mx = fmaxf(mx, fmaxf(s[f][2 * row], s[f][2 * row + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      m_new[row] = fmaxf(m[row], mx);
      grew = grew || m_new[row] > m[row];
    }
    // A row with no visible key yet keeps m = -inf; exp2 against 0 then gives P = 0 instead of NaN.
    const float m_ref[2] = {m_new[0] == -INFINITY ? 0.0f : m_new[0], m_new[1] == -INFINITY ? 0.0f : m_new[1]};
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int row = 0; row < 2; ++row) {
        const float scale = exp2f(m[row] - m_ref[row]);  // 0 on the first visible key (m = -inf): O, l are 0
        l[row] *= scale;
#pragma unroll
        for (int f = 0; f < kDimFrags; ++f) {
          o[f][2 * row] *= scale;
          o[f][2 * row + 1] *= scale;
        }
      }
    }
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      m[row] = m_new[row];
#pragma unroll
      for (int f = 0; f < kKeyFrags; ++f) {
        const float p0 = exp2f(s[f][2 * row] - m_ref[row]), p1 = exp2f(s[f][2 * row + 1] - m_ref[row]);
        s[f][2 * row] = p0;
        s[f][2 * row + 1] = p1;
        l[row] += p0 + p1;
      }
    }
  }

  // O += P V through this lane's ldmatrix.trans addresses in the stage's V tile (the warp's key slice).
  __device__ __forceinline__ void accumulate(const float (&p)[kKeyFrags][4], const SwizzledLane<Tile>& v_lane) {
#pragma unroll
    for (int kk = 0; kk < kKeyFrags / 2; ++kk) {
      const uint32_t a[4] = {pack2<Element>(p[2 * kk][0], p[2 * kk][1]), pack2<Element>(p[2 * kk][2], p[2 * kk][3]),
                             pack2<Element>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                             pack2<Element>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < Tile::kHeadDim / 16; ++dp) {
        uint32_t b[4];  // dims 16 dp .. +7: b[0], b[1]; dims +8 .. +15: b[2], b[3]
        ldsm_x4_trans(v_lane.at(dp) + kk * 16 * kRowBytes, b);
        mma_16816<Element>(o[2 * dp], a, b[0], b[1]);
        mma_16816<Element>(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }

  // The row sums over the quad (each thread summed its own columns).
  __device__ __forceinline__ void finish_sums() {
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      l[row] += __shfl_xor_sync(0xffffffffu, l[row], 1);
      l[row] += __shfl_xor_sync(0xffffffffu, l[row], 2);
    }
  }
};

// This lane's ldmatrix addresses (byte offsets into a swizzled (rows, kHeadDim) tile), for the layouts of
// mma_sync.cuh.
template <class Tile>
struct LaneAddresses {
  // Q as the A operand: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in a0..a3 order.
  static __device__ __forceinline__ SwizzledLane<Tile> q(int lane, int row0) {
    return SwizzledLane<Tile>(row0 + (lane & 15), lane >> 4);
  }
  // K as the B operand of S = Q K^T: (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, ...).
  static __device__ __forceinline__ SwizzledLane<Tile> k(int lane, int key0) {
    return SwizzledLane<Tile>(key0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  }
  // V as the B operand of O += P V (transposed): (keys 0-7, dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, 8-15), ...
  static __device__ __forceinline__ SwizzledLane<Tile> v(int lane, int key0) {
    return SwizzledLane<Tile>(key0 + (lane & 15), lane >> 4);
  }
};

}  // namespace flash4::sm90::decode
