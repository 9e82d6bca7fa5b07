// One warp's share of a decode block: 16 rows (one m16 fragment) against kKeysPerWarp keys of the stage.
//   S = Q K^T      (16, kKeysPerWarp) fp32 registers, mma.sync m16n8k16; Q and K by ldmatrix from shared memory
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

template <class Element, class Tile>
struct DecodeWarp {
  static constexpr int kDimFrags = Tile::kHeadDim / 8;  // n8 fragments of O
  static constexpr int kKeyFrags = Tile::kKeyFrags;     // n8 fragments of S
  static constexpr int kRowBytes = Tile::kLd * 2;

  float o[kDimFrags][4];  // unnormalized output, rows g and g + 8
  float m[2];             // running row max of the scores (log2 units), -inf before any visible key
  float l[2];             // this thread's part of the row sums of exp2(s - m) (reduced over the quad at the end)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int f = 0; f < kDimFrags; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  // S = Q K^T. s_q_lane / s_k_lane: this lane's ldmatrix addresses in the warp's Q rows and key slice.
  __device__ __forceinline__ void scores(uint32_t s_q_lane, uint32_t s_k_lane, float (&s)[kKeyFrags][4]) const {
#pragma unroll
    for (int f = 0; f < kKeyFrags; ++f) s[f][0] = s[f][1] = s[f][2] = s[f][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < Tile::kHeadDim / 16; ++kc) {
      uint32_t a[4];
      ldsm_x4(s_q_lane + kc * 32, a);
#pragma unroll
      for (int kp = 0; kp < kKeyFrags / 2; ++kp) {
        uint32_t b[4];  // keys 16 kp .. +7: b[0], b[1]; keys +8 .. +15: b[2], b[3]
        ldsm_x4(s_k_lane + kp * 16 * kRowBytes + kc * 32, b);
        mma_16816<Element>(s[2 * kp], a, b[0], b[1]);
        mma_16816<Element>(s[2 * kp + 1], a, b[2], b[3]);
      }
    }
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

  // The online softmax step: new row max, O and l rescaled to it, s replaced by P = exp2(s - m).
  __device__ __forceinline__ void softmax(float (&s)[kKeyFrags][4]) {
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      float mx = -INFINITY;
#pragma unroll
      for (int f = 0; f < kKeyFrags; ++f) mx = fmaxf(mx, fmaxf(s[f][2 * row], s[f][2 * row + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[row], mx);
      // A row with no visible key yet keeps m = -inf; exp2 against 0 then gives P = 0 instead of NaN.
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      const float scale = exp2f(m[row] - m_ref);  // 0 on the first visible key (m = -inf), where O and l are 0
      m[row] = m_new;
      l[row] *= scale;
#pragma unroll
      for (int f = 0; f < kDimFrags; ++f) {
        o[f][2 * row] *= scale;
        o[f][2 * row + 1] *= scale;
      }
#pragma unroll
      for (int f = 0; f < kKeyFrags; ++f) {
        const float p0 = exp2f(s[f][2 * row] - m_ref), p1 = exp2f(s[f][2 * row + 1] - m_ref);
        s[f][2 * row] = p0;
        s[f][2 * row + 1] = p1;
        l[row] += p0 + p1;
      }
    }
  }

  // O += P V. s_v_lane: this lane's ldmatrix.trans address in the warp's key slice of V.
  __device__ __forceinline__ void accumulate(const float (&p)[kKeyFrags][4], uint32_t s_v_lane) {
#pragma unroll
    for (int kk = 0; kk < kKeyFrags / 2; ++kk) {
      const uint32_t a[4] = {pack2<Element>(p[2 * kk][0], p[2 * kk][1]), pack2<Element>(p[2 * kk][2], p[2 * kk][3]),
                             pack2<Element>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                             pack2<Element>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < Tile::kHeadDim / 16; ++dp) {
        uint32_t b[4];  // dims 16 dp .. +7: b[0], b[1]; dims +8 .. +15: b[2], b[3]
        ldsm_x4_trans(s_v_lane + kk * 16 * kRowBytes + dp * 32, b);
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

// This lane's ldmatrix addresses (byte offsets into a (rows, kLd) 16-bit tile), for the layouts of mma_sync.cuh.
template <class Tile>
struct LaneAddresses {
  // Q as the A operand: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in a0..a3 order.
  static __device__ __forceinline__ uint32_t q(int lane, int row0) {
    return ((row0 + (lane & 15)) * Tile::kLd + (lane >> 4) * 8) * 2;
  }
  // K as the B operand of S = Q K^T: (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, ...).
  static __device__ __forceinline__ uint32_t k(int lane, int key0) {
    return ((key0 + (lane & 7) + ((lane >> 4) << 3)) * Tile::kLd + ((lane >> 3) & 1) * 8) * 2;
  }
  // V as the B operand of O += P V (transposed): (keys 0-7, dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, 8-15), ...
  static __device__ __forceinline__ uint32_t v(int lane, int key0) {
    return ((key0 + (lane & 15)) * Tile::kLd + (lane >> 4) * 8) * 2;
  }
};

}  // namespace flash4::sm90::decode
