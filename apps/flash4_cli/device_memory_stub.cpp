// device_memory.h in a build without CUDA: the CLI runs on the CPU only.
#include <stdexcept>
#include <utility>

#include "device_memory.h"

namespace flash4_cli {
namespace {

[[noreturn]] void no_cuda() { throw std::runtime_error("the flash4 CLI was built without CUDA"); }

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes > 0) no_cuda();
}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  data_ = std::exchange(other.data_, nullptr);
  return *this;
}

void copy_to_device(void*, const void*, size_t bytes) {
  if (bytes > 0) no_cuda();
}
void copy_to_host(void*, const void*, size_t bytes) {
  if (bytes > 0) no_cuda();
}
size_t device_memory_free() { no_cuda(); }
double time_on_device(const std::function<void()>&) { no_cuda(); }

}  // namespace flash4_cli
