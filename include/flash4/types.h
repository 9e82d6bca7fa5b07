// flash4 public types: element types, devices and the strided tensor view every entry point takes.
// Host-only C++: no CUDA headers, so the CPU build and its tests compile anywhere.
#pragma once

#include <cstdint>
#include <string>

namespace flash4 {

// kInt32 is for index tensors only (cu_seqlens, seqused); attention tensors are fp32 / fp16 / bf16, and the
// forward's q, k, v may be kFloat8E4M3 (OCP FP8 E4M3, "float8_e4m3fn": 4 exponent bits, 3 mantissa bits, no
// infinities, largest finite 448) with per-(batch, kv head) descale factors (flash4/api.h).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kInt32 = 3, kFloat8E4M3 = 4 };

// Size of one element in bytes.
constexpr int dtype_size(DType t) {
  return t == DType::kFloat32 || t == DType::kInt32 ? 4 : t == DType::kFloat8E4M3 ? 1 : 2;
}
const char* dtype_name(DType t);

enum class DeviceKind : int { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  // CUDA ordinal; ignored for the CPU
  static Device cpu() { return {DeviceKind::kCpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceKind::kCuda, i}; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};
std::string device_name(Device d);  // "cpu", "cuda:0"

// A non-owning view of a 4-D attention tensor (batch, seqlen, heads, head_dim) or, with rank 3, of the
// LSE tensor (batch, heads, seqlen). Variable-length calls use rank 3 for packed attention tensors
// (total, heads, head_dim), rank 2 for their LSE (heads, total_q); rank 2 also for the FP8 descales
// (batch, heads_kv), rank 1 for index and per-head tensors.
// Strides are in elements; the last dimension must be contiguous.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  Device device{};
  int rank = 4;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};

  int64_t numel() const {
    int64_t n = 1;
    // At most the four sizes: an absent optional tensor's rank is not validated and may be anything.
    for (int i = 0; i < rank && i < 4; ++i) n *= shape[i];
    return n;
  }
  bool defined() const { return data != nullptr || numel() == 0; }
};

// A contiguous (row-major) view of `shape`, for the common case.
TensorView make_view(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2, int64_t d3);
TensorView make_view(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2);
TensorView make_view(void* data, DType dtype, Device device, int64_t d0, int64_t d1);
TensorView make_view(void* data, DType dtype, Device device, int64_t d0);

// Opaque CUDA stream (a cudaStream_t cast to void*); nullptr is the default stream. Ignored on the CPU.
using Stream = void*;

}  // namespace flash4
