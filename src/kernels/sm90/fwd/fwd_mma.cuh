// The forward's matmuls on one consumer warpgroup's 64 query rows, and the register-only conversions between
// them: S = Q K^T (both operands in shared memory), O += P V (P from registers), P to 16-bit A fragments, and
// the conditional rescale of O. Each issue is asynchronous; the mainloop commits and waits.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "hw/sm90/wgmma.cuh"
#include "kernels/sm90/fwd/fwd_fp8_key_order.h"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90 {

template <class Traits>
struct FwdMma {
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  static constexpr int kHeadDimV = Traits::kHeadDimV;  // O's and V's columns
  static constexpr int kWgRows = Traits::kWgRows, kKStep = Traits::kKStep;
  static constexpr bool kFp8 = Traits::kFp8;
  using PFrag = uint32_t[kBlockN / kKStep][4];  // P as wgmma A fragments, registers, one row of 4 per k-step

  // One k-step of S: both operands K-major in shared memory.
  static __device__ __forceinline__ void mma_qk(float (&acc_s)[kBlockN / 2], uint64_t desc_q, uint64_t desc_k,
                                                bool accumulate) {
    if constexpr (kFp8) wgmma::mma_ss_e4m3<kBlockN>(acc_s, desc_q, desc_k, accumulate);
    else wgmma::mma_ss<kBlockN, 0, Element>(acc_s, desc_q, desc_k, accumulate);
  }

  // S (64 x kBlockN, registers) = this warpgroup's Q rows (buffer qb) x K(stage)^T. A k-step is 32 bytes of each
  // row (16 columns of 16 bits, 32 of FP8), four per 128-byte chunk.
  static __device__ __forceinline__ void issue_qk(SharedStorage& s, int wg, int qb, int stage,
                                                  float (&acc_s)[kBlockN / 2]) {
    if constexpr (Traits::kKStepsFromBase) {
      // One descriptor per operand, each k-step an offset from it (a chunk is rows * 128 bytes on, a k-step 32
      // bytes).
      const uint64_t q_base = wgmma::make_desc_sw128(&s.q[qb][0][wg * kWgRows][0], 16, 1024);
      const uint64_t k_base = wgmma::make_desc_sw128(&s.k[stage][0][0][0], 16, 1024);
#pragma unroll
      for (int ks = 0; ks < kHeadDim / kKStep; ++ks) {
        const uint32_t step = (ks % 4) * 32;
        mma_qk(acc_s, wgmma::desc_advance_lo(q_base, (ks / 4) * kBlockM * 128 + step),
               wgmma::desc_advance_lo(k_base, (ks / 4) * kBlockN * 128 + step), ks > 0);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kHeadDim / kKStep; ++ks) {
        const uint64_t desc_q = wgmma::make_desc_sw128(&s.q[qb][ks / 4][wg * kWgRows][(ks % 4) * kKStep], 16, 1024);
        const uint64_t desc_k = wgmma::make_desc_sw128(&s.k[stage][ks / 4][0][(ks % 4) * kKStep], 16, 1024);
        mma_qk(acc_s, desc_q, desc_k, ks > 0);
      }
    }
  }

  // O (64 x kHeadDimV, registers) += P (64 x kBlockN, registers) x V(stage) (kBlockN x kHeadDimV, MN-major).
  // FP8: O += P V with V^T(stage) (kHeadDim rows of 128 keys per chunk) as the K-major B; a k-step of 32 keys
  // is 32 bytes of each row.
  static __device__ __forceinline__ void issue_pv(SharedStorage& s, int stage, const PFrag& p_frag,
                                                  float (&acc_o)[kHeadDimV / 2]) {
    if constexpr (kFp8) {
#pragma unroll
      for (int ks = 0; ks < kBlockN / kKStep; ++ks) {
        const uint64_t desc_v = wgmma::make_desc_sw128(&s.v[stage][ks / 4][0][(ks % 4) * kKStep], 16, 1024);
        wgmma::mma_rs_e4m3<kHeadDimV>(acc_o, p_frag[ks], desc_v, true);
      }
    } else if constexpr (Traits::kKStepsFromBase) {
      const uint64_t v_base = wgmma::make_desc_sw128(&s.v[stage][0][0][0], kBlockN * 128, 1024);
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks)  // a k-step is 16 rows of 128 bytes
        wgmma::mma_rs<kHeadDimV, 1, Element>(acc_o, p_frag[ks], wgmma::desc_advance_lo(v_base, ks * 16 * 128), true);
    } else {
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        const uint64_t desc_v = wgmma::make_desc_sw128(&s.v[stage][0][ks * 16][0], kBlockN * 128, 1024);
        wgmma::mma_rs<kHeadDimV, 1, Element>(acc_o, p_frag[ks], desc_v, true);
      }
    }
  }

  // P in fp32 accumulator layout -> 16-bit A fragments: k-step j takes accumulator elements 8j .. 8j+7 in order
  // (the f32 accumulator layout of wgmma equals the A-fragment layout for 16-bit inputs).
  // FP8: k-step j (32 keys) takes accumulator elements 16j .. 16j+15, whose keys are not the four consecutive
  // columns an e4m3 A register holds; instead of moving bytes between threads the keys are renumbered
  // (fwd_fp8_key_order.h: register r byte i carries element p_fragment_element(r, i), and V^T's columns are
  // stored in the matching order), so P V sums the same products.
  static __device__ __forceinline__ void convert_p(const float (&acc_s)[kBlockN / 2], PFrag& p_frag) {
    if constexpr (kFp8) {
#pragma unroll
      for (int j = 0; j < kBlockN / kKStep; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int e = 16 * j;
          p_frag[j][r] = pack4_e4m3(acc_s[e + fp8::p_fragment_element(r, 0)], acc_s[e + fp8::p_fragment_element(r, 1)],
                                    acc_s[e + fp8::p_fragment_element(r, 2)], acc_s[e + fp8::p_fragment_element(r, 3)]);
        }
    } else {
#pragma unroll
      for (int j = 0; j < kBlockN / 16; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) p_frag[j][r] = pack2<Element>(acc_s[8 * j + 2 * r], acc_s[8 * j + 2 * r + 1]);
    }
  }

  // Four fp32 values -> one register of four e4m3 (saturating, round to nearest), the first in the low byte.
  static __device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
  }

  static __device__ __forceinline__ void rescale_o(float (&acc_o)[kHeadDimV / 2], const float (&factor)[2]) {
#pragma unroll
    for (int i = 0; i < kHeadDimV / 2; ++i) acc_o[i] *= factor[(i / 2) % 2];
  }

  static __device__ __forceinline__ void zero_o(float (&acc_o)[kHeadDimV / 2]) {
#pragma unroll
    for (int i = 0; i < kHeadDimV / 2; ++i) acc_o[i] = 0.0f;
  }
};

}  // namespace flash4::sm90
