// wgmma: Hopper's warpgroup matrix multiply (128 threads issue one asynchronous m64nNk16 MMA).
//
// Shared-memory operands are described by a 64-bit descriptor. flash4 keeps every operand tile in the layout
// TMA writes with 128-byte swizzle: chunks of 64 columns (128 bytes) by R rows, 8-row groups of 1024 bytes.
//  * K-major operand (Q as A, K as B: the reduction dim is contiguous): SBO = 1024 (next 8-row group); LBO
//    unused. A k-step of 16 elements inside a 64-column chunk advances the start address by 32 bytes; the
//    hardware applies the swizzle to the final addresses, so this stays consistent with TMA's layout.
//  * MN-major operand (V as B: N = head_dim is contiguous, transposed): LBO = bytes between 64-column chunks
//    along N, SBO = 1024 (next 8 rows along K). A k-step of 16 rows advances the start address by 2048 bytes.
// FP8 operands are K-major only (wgmma has no transposed FP8 form): V is stored transposed, (head_dim, keys).
// Descriptor bits: [0,14) address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [62,64) swizzle (1 = 128B).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flash4::sm90::wgmma {

// The calling thread's warpgroup, threadIdx.x / 128: uniform across a warp by construction, and through the
// shuffle from lane 0 uniform to the compiler too, so that what derives from it (a warpgroup's tile addresses,
// its descriptors) lives in uniform registers instead of being rebuilt in vector registers for every wgmma.
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

__device__ __forceinline__ uint64_t make_desc_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;  // 128-byte swizzle
  return desc;
}

// The descriptor of the same operand `bytes` further on (a multiple of 16): the address field holds addr >> 4 and
// shared-memory addresses stay below 2^18, so the add never carries out of it.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
// The same as a 32-bit add to the low word (the address field never carries out of it): one add per k-step where the
// 64-bit add took an add with carry and two moves (the forward's k-step loops, which issue their wgmmas back to back).
__device__ __forceinline__ uint64_t desc_advance_lo(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// Hides a descriptor's value from the compiler's loop-invariant code motion: the k-step descriptors derived from
// it with desc_advance are recomputed where they are used (one add each) instead of all being hoisted out of the
// tile loop into registers, where they get spilled.
__device__ __forceinline__ void desc_opaque(uint64_t& desc) { asm volatile("" : "+l"(desc)); }

// Order this warpgroup's register/shared-memory accesses before the next wgmma reads its operands.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit_group() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Wait until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of accumulator registers across a wgmma issue or wait: the
// hardware writes them asynchronously, which the compiler cannot see.
template <int kN>
__device__ __forceinline__ void fence_operand(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_operand(uint32_t (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#include "hw/sm90/wgmma_ops.inc"
#include "hw/sm90/wgmma_fp8_ops.inc"

// D (64 x kN, f32, registers) (+)= A (64 x 16, smem, K-major) * B (16 x kN, smem).
template <int kN, int kTransB, class Element>
__device__ __forceinline__ void mma_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  if constexpr (kN == 64) mma_ss_m64n64k16<kTransB>(d, desc_a, desc_b, accumulate, Element{});
  else if constexpr (kN == 80) mma_ss_m64n80k16<kTransB>(d, desc_a, desc_b, accumulate, Element{});
  else if constexpr (kN == 96) mma_ss_m64n96k16<kTransB>(d, desc_a, desc_b, accumulate, Element{});
  else if constexpr (kN == 112) mma_ss_m64n112k16<kTransB>(d, desc_a, desc_b, accumulate, Element{});
  else if constexpr (kN == 128) mma_ss_m64n128k16<kTransB>(d, desc_a, desc_b, accumulate, Element{});
  else if constexpr (kN == 176) mma_ss_m64n176k16<kTransB>(d, desc_a, desc_b, accumulate, Element{});
  else static_assert(kN == 64, "no wgmma SS wrapper generated for this N (scripts/gen_wgmma.py)");
}

// D (64 x kN, f32, registers) (+)= A (64 x 16, registers, mma.m16n8k16 A layout) * B (16 x kN, smem).
template <int kN, int kTransB, class Element>
__device__ __forceinline__ void mma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  if constexpr (kN == 64) mma_rs_m64n64k16<kTransB>(d, a, desc_b, accumulate, Element{});
  else if constexpr (kN == 96) mma_rs_m64n96k16<kTransB>(d, a, desc_b, accumulate, Element{});
  else if constexpr (kN == 128) mma_rs_m64n128k16<kTransB>(d, a, desc_b, accumulate, Element{});
  else if constexpr (kN == 192) mma_rs_m64n192k16<kTransB>(d, a, desc_b, accumulate, Element{});
  else if constexpr (kN == 256) mma_rs_m64n256k16<kTransB>(d, a, desc_b, accumulate, Element{});
  else static_assert(kN == 64, "no wgmma RS wrapper generated for this N (scripts/gen_wgmma.py)");
}

// FP8 (e4m3): D (64 x kN, f32) (+)= A (64 x 32, smem, K-major) * B (32 x kN, smem, K-major).
template <int kN>
__device__ __forceinline__ void mma_ss_e4m3(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  if constexpr (kN == 128) mma_ss_m64n128k32_e4m3(d, desc_a, desc_b, accumulate);
  else static_assert(kN == 128, "no FP8 wgmma SS wrapper generated for this N (scripts/gen_wgmma.py --fp8)");
}

// FP8 (e4m3): D (64 x kN, f32) (+)= A (64 x 32, registers, mma.m16n8k32 A layout) * B (32 x kN, smem, K-major).
template <int kN>
__device__ __forceinline__ void mma_rs_e4m3(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                            bool accumulate) {
  if constexpr (kN == 128) mma_rs_m64n128k32_e4m3(d, a, desc_b, accumulate);
  else if constexpr (kN == 256) mma_rs_m64n256k32_e4m3(d, a, desc_b, accumulate);
  else static_assert(kN == 128, "no FP8 wgmma RS wrapper generated for this N (scripts/gen_wgmma.py --fp8)");
}

}  // namespace flash4::sm90::wgmma
