// Small helpers of the public types: names for messages and contiguous views.
#include <string>

#include "flash4/error.h"
#include "flash4/types.h"

namespace flash4 {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kInt32: return "int32";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
  }
  return "invalid dtype";
}

std::string device_name(Device d) {
  switch (d.kind) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda:" + std::to_string(d.index);
  }
  return "invalid device";
}

const char* status_name(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kNotSupported: return "not supported";
    case Status::kCudaError: return "CUDA error";
    case Status::kInternal: return "internal error";
  }
  return "invalid status";
}

TensorView make_view(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = 4;
  const int64_t shape[4] = {d0, d1, d2, d3};
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = stride;
    stride *= shape[i];
  }
  return t;
}

TensorView make_view(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2) {
  // A trailing size-1 dimension gives the 3-D strides (d1*d2, d2, 1); then drop it.
  TensorView t = make_view(data, dtype, device, d0, d1, d2, 1);
  t.rank = 3;
  t.shape[3] = 0;
  t.stride[3] = 0;
  return t;
}

// Lower ranks by the same trick: contiguous strides of a trailing size-1 dimension, which is then dropped.
TensorView make_view(void* data, DType dtype, Device device, int64_t d0, int64_t d1) {
  TensorView t = make_view(data, dtype, device, d0, d1, 1);
  t.rank = 2;
  t.shape[2] = 0;
  t.stride[2] = 0;
  return t;
}

TensorView make_view(void* data, DType dtype, Device device, int64_t d0) {
  TensorView t = make_view(data, dtype, device, d0, 1);
  t.rank = 1;
  t.shape[1] = 0;
  t.stride[1] = 0;
  return t;
}

}  // namespace flash4
