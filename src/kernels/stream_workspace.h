// A stream-ordered device allocation (cudaMallocAsync) released stream-ordered (cudaFreeAsync) when the scope ends,
// also on an exception: kernels' scratch memory without a host synchronisation, capturable in a CUDA graph (as
// memory nodes); the device's default memory pool caches the blocks between calls.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda_check.h"

namespace flash4::detail {

class StreamWorkspace {
 public:
  StreamWorkspace(size_t bytes, cudaStream_t stream) : stream_(stream) {
    FLASH4_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
  }
  ~StreamWorkspace() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  }
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace flash4::detail
