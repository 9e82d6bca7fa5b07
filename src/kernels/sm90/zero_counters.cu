// The per-device pool of zero counters (zero_counters.h).
#include "kernels/sm90/zero_counters.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "kernels/cuda_check.h"
#include "kernels/sm90/counter_slices.h"

namespace flash4::sm90 {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kPoolInts = size_t{kCountersPerSlice} * (kEagerSlices + kCapturedSlices);

struct CounterPool {
  std::mutex mutex;                 // guards the allocation
  std::atomic<int*> base{nullptr};  // kPoolInts zeroed ints: eager slices, then captured ones
  StreamSlices eager{kEagerSlices};
  std::atomic<uint32_t> next_captured{0};
};

CounterPool& pool_of(int device) {
  static CounterPool pools[kMaxDevices];
  return pools[device];
}

// The pool's memory, allocated and zeroed (then waited for, so that launches on other streams find it zero) on
// first use; the pool lives as long as the process. nullptr where the runtime refuses (another thread capturing a
// CUDA graph in global mode forbids the allocation): the caller falls back, and a later call tries again.
int* allocate(CounterPool& pool, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(pool.mutex);
  if (int* base = pool.base.load()) return base;
  int* base = nullptr;
  if (cudaMalloc(&base, kPoolInts * sizeof(int)) != cudaSuccess) {
    (void)cudaGetLastError();  // the refusal is answered by the fallback, not left for the next call to find
    return nullptr;
  }
  if (cudaMemsetAsync(base, 0, kPoolInts * sizeof(int), stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaFree(base);
    return nullptr;
  }
  pool.base.store(base);
  return base;
}

}  // namespace

int* pooled_zero_counters(int64_t count, cudaStream_t stream) {
  int device = 0;
  FLASH4_CUDA_CHECK(cudaGetDevice(&device));
  if (count > kCountersPerSlice || device < 0 || device >= kMaxDevices) return nullptr;
  CounterPool& pool = pool_of(device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASH4_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    int* base = pool.base.load();
    if (base == nullptr) return nullptr;  // allocating here would invalidate the capture
    const uint32_t slice = pool.next_captured.fetch_add(1);
    if (slice >= static_cast<uint32_t>(kCapturedSlices)) return nullptr;
    return base + size_t{kCountersPerSlice} * (kEagerSlices + slice);
  }
  int* base = pool.base.load();
  if (base == nullptr) base = allocate(pool, stream);
  if (base == nullptr) return nullptr;
  // The per-thread default stream is a different stream in each host thread behind one handle.
  const uint64_t thread_key =
      stream == cudaStreamPerThread ? std::hash<std::thread::id>{}(std::this_thread::get_id()) | 1u : 0u;
  const int slice = pool.eager.slice_of(reinterpret_cast<uintptr_t>(stream), thread_key);
  if (slice < 0) return nullptr;
  return base + size_t{kCountersPerSlice} * static_cast<size_t>(slice);
}

}  // namespace flash4::sm90
