// A device copy of a HostTensor with the same layout (strides, padding), for GPU tests: upload inputs and
// poisoned outputs, run on the device, download the outputs into the same HostTensor and check them with the
// CPU tests' machinery (tests/common).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/host_tensor.h"

namespace flash4::test {

#define FLASH4_TEST_CUDA(expr)                                                          \
  do {                                                                                  \
    const cudaError_t status_ = (expr);                                                 \
    ASSERT_EQ(status_, cudaSuccess) << #expr << ": " << cudaGetErrorString(status_);  \
  } while (0)

class DeviceMirror {
 public:
  explicit DeviceMirror(HostTensor& host) : host_(&host) {
    bytes_ = host.storage_bytes();
    if (cudaMalloc(&data_, bytes_ == 0 ? 16 : bytes_) != cudaSuccess) data_ = nullptr;
    if (data_ != nullptr) cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice);
    view_ = host.view();
    view_.data = data_;
    view_.device = Device::cuda(0);
  }
  ~DeviceMirror() { cudaFree(data_); }
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  bool ok() const { return data_ != nullptr; }
  const TensorView& view() const { return view_; }
  // Copies the device contents back into the host tensor (padding included).
  cudaError_t download() { return cudaMemcpy(host_->data(), data_, bytes_, cudaMemcpyDeviceToHost); }

 private:
  HostTensor* host_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  TensorView view_{};
};

}  // namespace flash4::test
