// CUDA error checking for host code of the kernels: every runtime call's status becomes a flash4::Error.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flash4/error.h"

namespace flash4::detail {

inline void cuda_check(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess) {
    throw Error(Status::kCudaError, std::string(what) + " failed: " + cudaGetErrorString(status) + " (" + file +
                                        ":" + std::to_string(line) + ")");
  }
}

}  // namespace flash4::detail

#define FLASH4_CUDA_CHECK(expr) ::flash4::detail::cuda_check((expr), #expr, __FILE__, __LINE__)
// After a launch: reports launch-configuration errors without synchronizing.
#define FLASH4_CUDA_CHECK_LAUNCH() ::flash4::detail::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
