#include "common/host_tensor.h"

#include <cstring>
#include <limits>
#include <stdexcept>

#include "reference/reference.h"

namespace flash4::test {

HostTensor::HostTensor(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                       Layout layout) {
  view_.dtype = dtype;
  view_.device = Device::cpu();
  view_.rank = 4;
  const int64_t shape[4] = {batch, seqlen, heads, head_dim};
  for (int i = 0; i < 4; ++i) view_.shape[i] = shape[i];
  int64_t elements = 0;
  if (layout == Layout::kContiguous || layout == Layout::kUnitDimStride1) {
    view_.stride[3] = 1;
    view_.stride[2] = head_dim;
    view_.stride[1] = heads * head_dim;
    view_.stride[0] = seqlen * heads * head_dim;
    elements = batch * seqlen * heads * head_dim;
    if (layout == Layout::kUnitDimStride1)
      for (int i = 0; i < 3; ++i)
        if (shape[i] == 1) view_.stride[i] = 1;
  } else if (layout == Layout::kBroadcast) {
    view_.stride[3] = 1;
    view_.stride[2] = 0;
    view_.stride[1] = head_dim;
    view_.stride[0] = 0;
    elements = seqlen * head_dim;
  } else {
    const int64_t row = head_dim + 8;
    view_.stride[3] = 1;
    view_.stride[1] = row;
    view_.stride[2] = seqlen * row;
    view_.stride[0] = heads * seqlen * row;
    elements = batch * heads * seqlen * row;
  }
  storage_.assign(static_cast<size_t>((elements * dtype_size(dtype) + 3) / 4), 0u);
  view_.data = storage_.data();
}

HostTensor HostTensor::lse(int64_t batch, int64_t heads, int64_t seqlen) {
  HostTensor t;
  t.view_.dtype = DType::kFloat32;
  t.view_.device = Device::cpu();
  t.view_.rank = 3;
  t.view_.shape[0] = batch;
  t.view_.shape[1] = heads;
  t.view_.shape[2] = seqlen;
  t.view_.stride[2] = 1;
  t.view_.stride[1] = seqlen;
  t.view_.stride[0] = heads * seqlen;
  t.storage_.assign(static_cast<size_t>(batch * heads * seqlen), 0u);
  t.view_.data = t.storage_.data();
  return t;
}

HostTensor HostTensor::vector(DType dtype, int64_t n) {
  HostTensor t;
  t.view_ = make_view(nullptr, dtype, Device::cpu(), n);
  t.storage_.assign(static_cast<size_t>((n * dtype_size(dtype) + 3) / 4), 0u);
  t.view_.data = t.storage_.data();
  return t;
}

void HostTensor::drop_leading_dim() {
  if (view_.shape[0] != 1 || view_.rank < 2) throw std::invalid_argument("drop_leading_dim: extent must be 1");
  for (int i = 0; i + 1 < view_.rank; ++i) {
    view_.shape[i] = view_.shape[i + 1];
    view_.stride[i] = view_.stride[i + 1];
  }
  --view_.rank;
  view_.shape[view_.rank] = 0;
  view_.stride[view_.rank] = 0;
}

std::vector<double> HostTensor::to_double() const { return reference::to_double(view_); }

void HostTensor::assign(const std::vector<double>& values) { reference::from_double(values, view_); }

std::vector<uint16_t> HostTensor::bits16() const {
  std::vector<uint16_t> bits(static_cast<size_t>(numel()));
  std::memcpy(bits.data(), view_.data, bits.size() * sizeof(uint16_t));
  return bits;
}

void HostTensor::fill_normal(Rng& rng, double stddev) {
  std::vector<double> values(static_cast<size_t>(numel()));
  for (double& v : values) v = stddev * rng.normal();
  assign(values);
}

void HostTensor::fill(double value) { assign(std::vector<double>(static_cast<size_t>(numel()), value)); }

void HostTensor::poison() {
  // 0x7fc07fc0: a NaN as fp32, and two NaNs as fp16 (0x7fc0) and bf16 (0x7fc0).
  for (uint32_t& w : storage_) w = 0x7fc07fc0u;
}

}  // namespace flash4::test
