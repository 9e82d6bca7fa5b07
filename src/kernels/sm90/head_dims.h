// Which head dims the Hopper kernels take, which compiled kernel width runs each, and the refusal text for the
// others. Host-only, so that forward and backward dispatch say the same thing and CPU tests can check it without
// a GPU.
//
// The kernels are compiled for widths 64, 128 and 256 (rows of 64-element, 128-byte swizzled panels). The
// forward and the backward's wgmma kernel also have 96 (built with 128: two panels in shared memory, half of the
// second one used, matmuls 96 wide) and 192 (three panels, built with 256); the decode kernel and the backward's
// mma.sync kernel have neither. Narrower head dims run on the next wider kernel, zero-padded without any memory
// (the decode kernel's cp.async copies zero-fill the 16-byte chunks past d and its stores stop at d):
// the TMA tensor maps keep the tensors' true widths, so TMA fills the panels' columns past them with zeros on
// loads (QK^T and PV stay exact, padded V columns give zero output columns) and clips them on stores; every
// store the kernels make themselves is bounded by the true width (FwdParams::head_dim_v, BwdParams::head_dim /
// head_dim_v).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/problem.h"

namespace flash4::sm90 {

// Widths the kernels are compiled for (FLASH4_HEAD_DIMS); the forward's and the backward's add their native 96
// and 192 (cmake/kernels.cmake, cmake/bwd_kernels.cmake).
inline constexpr int64_t kKernelHeadDims[] = {64, 128, 256};
inline constexpr int64_t kFwdKernelHeadDims[] = {64, 96, 128, 192, 256};
inline constexpr int64_t kBwdKernelHeadDims[] = {64, 96, 128, 192, 256};

// Head dims the GPU takes for q, k and v alike: every multiple of 8 up to 256, on the compiled widths and
// zero-padded on the next wider one (tests/gpu/test_padded_head_dims.cu, test_any_head_dims.cu).
inline constexpr const char* kGpuHeadDimsText = "multiples of 8 from 8 to 256";

// (q/k head dim, v/out head dim) pairs the GPU takes where the two differ: DeepSeek's MLA (192, 128), which the
// forward and the backward run on kernels of their own (fwd_has_split_kernel, bwd_has_split_kernel), and
// (128, 64), on the 128 kernels with v's panels zero-padded.
struct SplitHeadDims {
  int64_t head_dim, head_dim_v;
};
inline constexpr SplitHeadDims kGpuSplitHeadDims[] = {{192, 128}, {128, 64}};
inline constexpr const char* kGpuSplitHeadDimsText = "(192, 128) or (128, 64)";

constexpr bool gpu_takes_head_dim(int64_t d) { return d >= 8 && d <= 256 && d % 8 == 0; }

constexpr bool gpu_split_head_dims(int64_t d, int64_t dv) {
  for (const SplitHeadDims& s : kGpuSplitHeadDims)
    if (s.head_dim == d && s.head_dim_v == dv) return true;
  return false;
}

// The narrowest of `widths` (ascending) that holds head dims (d, dv); 0 if none does.
template <size_t N>
constexpr int narrowest_width(const int64_t (&widths)[N], int64_t d, int64_t dv) {
  const int64_t widest = d > dv ? d : dv;
  for (int64_t k : widths)
    if (widest <= k) return static_cast<int>(k);
  return 0;
}

// The compiled width that runs head dims (d, dv) in the decode kernel (d = dv, zero-padded: decode_load.cuh) and
// the backward's mma.sync kernel (full widths only: padded_head_dims).
constexpr int kernel_head_dim(int64_t d, int64_t dv) { return narrowest_width(kKernelHeadDims, d, dv); }

// The compiled width that runs head dims (d, dv) in the backward: 72 .. 96 on the wgmma kernel of width 96, 192
// and (192, 128) on role-split kernels of width 192 ((192, 128) on its own, bwd_has_split_kernel).
constexpr int bwd_kernel_head_dim(int64_t d, int64_t dv) { return narrowest_width(kBwdKernelHeadDims, d, dv); }

// The same for the forward, which has 96 and 192 kernels: 72 .. 96, 192 and (192, 128) run unpadded or on fewer
// padded columns ((192, 128) on its own kernel of this q / k width: fwd_api.cu, kernel_head_dim_v).
constexpr int fwd_kernel_head_dim(int64_t d, int64_t dv) { return narrowest_width(kFwdKernelHeadDims, d, dv); }

// Whether (d, dv) has no kernel of exactly its width among kKernelHeadDims (narrower than the width, v narrower
// than q and k, 96 or 192): such problems need the TMA kernels, since the backward's mma.sync fallback exists only
// for the full widths 64, 128 and 256 (it loads full-width rows itself).
constexpr bool padded_head_dims(int64_t d, int64_t dv) { return d != dv || kernel_head_dim(d, dv) != d; }

// Why the GPU `pass` ("forward" or "backward") cannot run p's head dims; empty when it can.
inline std::string head_dim_refusal(const detail::Problem& p, const char* pass) {
  if (p.split_head_dims()) {
    if (gpu_split_head_dims(p.head_dim, p.head_dim_v)) return {};
    return "v's head_dim (" + std::to_string(p.head_dim_v) + ") differs from q and k's (" +
           std::to_string(p.head_dim) + "); the GPU " + pass + " takes the split head dims (q/k, v) " +
           kGpuSplitHeadDimsText + " only (the CPU runs every split)";
  }
  if (!gpu_takes_head_dim(p.head_dim))
    return "head_dim " + std::to_string(p.head_dim) + " is not supported by the GPU " + pass + " (supported: " +
           kGpuHeadDimsText + ")";
  return {};
}

}  // namespace flash4::sm90
