// GPU memory and timing for the CLI behind a host-only interface, so the CLI compiles without CUDA headers.
// In a build without CUDA every function throws std::runtime_error.
#pragma once

#include <cstddef>
#include <functional>

namespace flash4_cli {

// Owns one cudaMalloc'ed allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

void copy_to_device(void* device_dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, size_t bytes);

// Free memory of CUDA device 0 in bytes (cudaMemGetInfo).
size_t device_memory_free();

// Runs fn (which enqueues work on the default stream) between two CUDA events; returns the elapsed ms.
double time_on_device(const std::function<void()>& fn);

}  // namespace flash4_cli
