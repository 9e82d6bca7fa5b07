// stmatrix (inline PTX: CCCL has no wrapper): a warp stores 8x8 16-bit matrices from its mma fragments to shared
// memory, here transposed, which turns an accumulator's columns into memory rows (the backward's dS^T -> dS).
#pragma once

#include <cstdint>

namespace flash4::sm90 {

// Stores four 8x8 16-bit matrices transposed: register i of lane L holds row L / 4, columns 2 (L % 4), +1 of
// fragment matrix i; it lands in memory row 2 (L % 4) (+1), column L / 4. Lanes 8i .. 8i + 7 give the addresses
// of the 8 memory rows (16 bytes each) of matrix i.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

}  // namespace flash4::sm90
