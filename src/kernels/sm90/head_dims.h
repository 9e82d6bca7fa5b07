// Which head dims the Hopper kernels are written for, and the refusal text for the others. Host-only, so that
// forward and backward dispatch say the same thing and CPU tests can check it without a GPU.
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.h"

namespace flash4::sm90 {

// The Hopper forward and backward take one head_dim for q, k and v, from this list; the CPU takes the rest.
inline constexpr int64_t kKernelHeadDims[] = {64, 128, 256};
inline constexpr const char* kKernelHeadDimsText = "64, 128 or 256";

constexpr bool kernel_head_dim(int64_t d) {
  for (int64_t k : kKernelHeadDims)
    if (d == k) return true;
  return false;
}

// Why the GPU `pass` ("forward" or "backward") cannot run p's head dims; empty when it can.
inline std::string head_dim_refusal(const detail::Problem& p, const char* pass) {
  if (p.split_head_dims())
    return "v's head_dim (" + std::to_string(p.head_dim_v) + ") differs from q and k's (" +
           std::to_string(p.head_dim) + "); the GPU " + pass + " needs one head_dim for q, k and v, " +
           kKernelHeadDimsText + " (the CPU runs split head dims)";
  if (!kernel_head_dim(p.head_dim))
    return "head_dim " + std::to_string(p.head_dim) + " is not supported by the GPU " + pass + " (supported: " +
           kKernelHeadDimsText + "; the CPU runs every multiple of 8 up to 256)";
  return {};
}

}  // namespace flash4::sm90
