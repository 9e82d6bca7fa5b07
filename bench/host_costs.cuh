// flash4_bench --host: where the host time of one flash4 call goes, in microseconds per call. Each item is issued
// in batches of 50 calls, timed on the host (std::chrono) while it only enqueues, then the GPU is drained untimed,
// so a tiny problem measures the host path and never the GPU. With "sync" after the name, every batch ends with a
// cudaDeviceSynchronize (as a training step does when it reads its loss), which lets the default memory pool return
// freed memory to the OS (release threshold 0) so that the next cudaMallocAsync maps it again.
// Compare the full calls (flash4::forward / backward) with their parts: validation, tensor maps, allocation,
// memsets, launches, device queries.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "flash4/api.h"
#include "hw/sm90/tma_map.h"

namespace host_costs {

__global__ void empty_kernel(int) {}

// Median over 20 batches of the host microseconds per call of fn(), 50 calls per batch.
template <class Fn>
double host_us_per_call(Fn fn, bool sync_each_batch) {
  constexpr int kBatches = 20, kCalls = 50;
  for (int i = 0; i < kCalls; ++i) fn();
  cudaDeviceSynchronize();
  std::vector<double> us;
  for (int b = 0; b < kBatches; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) fn();
    const auto stop = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / kCalls);
    if (sync_each_batch) cudaDeviceSynchronize();
    else cudaStreamSynchronize(nullptr);  // drain (untimed) so the launch queue never fills and blocks
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

inline void print(const char* item, double no_sync, double sync) {
  std::printf("{\"impl\": \"host\", \"item\": \"%s\", \"us_per_call\": %.2f, \"us_per_call_sync\": %.2f}\n", item,
              no_sync, sync);
  std::fflush(stdout);
}

template <class Fn>
void measure(const char* item, Fn fn) {
  print(item, host_us_per_call(fn, false), host_us_per_call(fn, true));
}

// fwd, bwd: the arguments of a tiny problem (b = 1, s = 128, 2 heads, d = 64) whose out / lse exist.
inline void run(const flash4::ForwardArgs& fwd, const flash4::BackwardArgs& bwd) {
  measure("flash4::forward", [&] { flash4::forward(fwd); });
  measure("flash4::backward", [&] { flash4::backward(bwd); });
  measure("flash4::can_implement(backward)", [&] { (void)flash4::can_implement(bwd); });
  measure("make_tensor_map_bshd", [&] {
    const CUtensorMap map = flash4::sm90::make_tensor_map_bshd(fwd.q.data, 1, 128, 2, 64, 128 * 2 * 64, 2 * 64, 64, 64);
    (void)map;
  });
  measure("cudaMallocAsync + cudaFreeAsync (1 MB)", [] {
    void* p = nullptr;
    cudaMallocAsync(&p, 1 << 20, nullptr);
    cudaFreeAsync(p, nullptr);
  });
  static void* block = nullptr;
  if (block == nullptr) cudaMalloc(&block, 1 << 20);
  measure("cudaMemsetAsync (1 MB)", [] { cudaMemsetAsync(block, 0, 1 << 20, nullptr); });
  measure("empty kernel launch", [] { empty_kernel<<<1, 32>>>(0); });
  measure("cudaGetDevice + cudaSetDevice (same)", [] {
    int device = 0;
    cudaGetDevice(&device);
    cudaSetDevice(device);
  });
  measure("cudaFuncSetAttribute", [] {
    cudaFuncSetAttribute(&empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 0);
  });
  measure("cudaDeviceGetAttribute (SM count)", [] {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  });
}

}  // namespace host_costs
