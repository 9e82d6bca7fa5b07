// A stream-ordered device allocation (cudaMallocAsync) released stream-ordered (cudaFreeAsync) when the scope ends,
// also on an exception: kernels' scratch memory without a host synchronisation, capturable in a CUDA graph (as
// memory nodes). The blocks come from the device's default memory pool, which caches them between calls.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda_check.h"

namespace flash4::detail {

// Bytes of freed blocks the device's default pool keeps across synchronizations. Its default (0) hands every
// freed block back to the driver at the next stream, event or device synchronize, so each call after one maps
// fresh memory again; this keeps the workspaces of calls up to about 16k tokens of a 2048-wide model (the
// backward's fp32 dQ accumulator is the largest) and the forward's counter. A higher threshold set by the
// application is left as it is.
inline constexpr uint64_t kPoolKeepBytes = uint64_t{256} << 20;

// Raises the current device's default pool's release threshold to kPoolKeepBytes, once per device (best effort:
// a device or driver without memory pools is left alone). Not while `stream` is being captured into a CUDA graph:
// a call the capture does not allow would invalidate it (graph allocations come from the graph's own pool).
inline void keep_pool_blocks(cudaStream_t stream) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices] = {};
  // A failed query resets the error it set (and only then: an error pending from other work stays reported).
  const auto ok = [](cudaError_t e) {
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e == cudaSuccess;
  };
  int device = 0;
  if (!ok(cudaGetDevice(&device)) || device < 0 || device >= kMaxDevices) return;
  if (done[device].load(std::memory_order_relaxed)) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (!ok(cudaStreamIsCapturing(stream, &capture)) || capture != cudaStreamCaptureStatusNone) return;
  cudaMemPool_t pool;
  uint64_t threshold = 0;
  if (ok(cudaDeviceGetDefaultMemPool(&pool, device)) &&
      ok(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold)) && threshold < kPoolKeepBytes) {
    uint64_t keep = kPoolKeepBytes;
    (void)ok(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  done[device].store(true, std::memory_order_relaxed);
}

class StreamWorkspace {
 public:
  StreamWorkspace(size_t bytes, cudaStream_t stream) : stream_(stream) {
    keep_pool_blocks(stream);
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
