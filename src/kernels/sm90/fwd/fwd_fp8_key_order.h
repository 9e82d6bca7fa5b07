// The FP8 forward's key renumbering, shared by the P fragments (FwdMma::convert_p), the V^T copy (fwd_fp8.cu) and
// a CPU test of their agreement (tests/cpu/test_fp8_key_order.cpp). Host and device, no CUDA headers.
//
// Per 32-key k-step of P V, a thread (lane, t = lane % 4) holds S's accumulator elements 0..15 of the k-step:
// element e is key 8 (e / 4) + 2 t + e % 2 of row g + 8 ((e / 2) % 2). An e4m3 A register r instead holds the
// four consecutive A columns 4 t + 16 (r / 2) + {0..3} of row g + 8 (r % 2). Register r byte i takes element
// p_fragment_element(r, i), and V^T's column c holds the V row of key key_of_column(c): the products summed are
// those of the keys themselves.
#pragma once

#include "common/host_device.h"

namespace flash4::sm90::fp8 {

// The accumulator element (0..15 of the k-step) that byte i of P's A register r carries: row r % 2's key pairs
// of column blocks 2 (r / 2) and 2 (r / 2) + 1.
FLASH4_HD constexpr int p_fragment_element(int r, int i) { return 8 * (r / 2) + 2 * (r % 2) + (i & 1) + 4 * (i >> 1); }

// The key (within its 16) whose V row lands in V^T's column c: column 4 t + i holds key 2 t + (i & 1) + 8 (i >> 1).
FLASH4_HD constexpr int key_of_column(int c) {
  const int r = c & 15;
  return (c - r) + 2 * (r >> 2) + (r & 1) + 8 * ((r >> 1) & 1);
}

}  // namespace flash4::sm90::fp8
