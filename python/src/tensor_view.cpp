// DLPack array -> flash4::TensorView: element type, device, rank, shape and strides.
#include "tensor_view.h"

#include <string>

namespace nb = nanobind;

namespace flash4::python {
namespace {

// DLPack's type code of OCP FP8 E4M3 ("fn": no infinities), as torch exports float8_e4m3fn; nanobind names no
// FP8 codes.
constexpr uint8_t kDLFloat8E4M3fn = 10;

// "float64", "int32", "bfloat16", ... for messages.
std::string describe_dtype(nb::dlpack::dtype t) {
  std::string kind;
  if (t.code == kDLFloat8E4M3fn && t.bits == 8 && t.lanes == 1) return "float8_e4m3fn";
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: kind = "dlpack-type-code-" + std::to_string(t.code) + "-bits-"; break;
  }
  std::string s = kind + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

// int32 only for the rank-1 index tensors (cu_seqlens, seqused): an int32 attention tensor keeps the message
// that lists the attention dtypes.
DType to_dtype(nb::dlpack::dtype t, const char* name, bool index_tensor) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat8E4M3fn && t.bits == 8) return DType::kFloat8E4M3;
    if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 32) return DType::kFloat32;
    if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 16) return DType::kFloat16;
    if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return DType::kBFloat16;
    if (index_tensor && t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int) && t.bits == 32)
      return DType::kInt32;
  }
  const std::string message = std::string(name) + " has dtype " + describe_dtype(t) +
                              "; flash4 takes float32, float16 or bfloat16 (q, k, v of the forward also "
                              "float8_e4m3fn; lse, learnable_sink, q/k/v_descale: float32; "
                              "cu_seqlens, seqused, block_table, cache_seqlens, cache_batch_idx: int32)";
  throw nb::type_error(message.c_str());
}

Device to_device(int device_type, int device_id, const char* name) {
  if (device_type == nb::device::cpu::value) return Device::cpu();
  if (device_type == nb::device::cuda::value) return Device::cuda(device_id);
  const std::string message = std::string(name) + " lives on DLPack device type " + std::to_string(device_type) +
                              "; flash4 runs on the CPU and on CUDA GPUs";
  throw nb::value_error(message.c_str());
}

const char* layout_of(int rank) {
  switch (rank) {
    case kAttentionRank: return "(batch, seqlen, heads, head_dim)";
    case kLseRank: return "(batch, heads, seqlen_q), or (total, heads, head_dim) for a packed batch";
    case kPackedLseRank: return "(heads, total_q)";
    default: return "(n,)";
  }
}

template <typename Array>
TensorView convert(const Array& a, const char* name, int rank, bool index_tensor, const char* layout) {
  const DType dtype = to_dtype(a.dtype(), name, index_tensor);
  const Device device = to_device(a.device_type(), a.device_id(), name);
  if (static_cast<int>(a.ndim()) != rank) {
    const std::string message = std::string(name) + " must have " + std::to_string(rank) + " dimensions " +
                                layout + ", got " + std::to_string(a.ndim());
    throw nb::value_error(message.c_str());
  }
  TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(a.data()));
  view.dtype = dtype;
  view.device = device;
  view.rank = rank;
  // Row-major strides stand in where the producer gave none (DLPack's rule) and for empty arrays, whose
  // exported strides carry no meaning (numpy exports 0 for them).
  const int64_t* strides = a.size() == 0 ? nullptr : a.stride_ptr();
  int64_t row_major = 1;
  for (int i = rank - 1; i >= 0; --i) {
    view.shape[i] = static_cast<int64_t>(a.shape(i));
    view.stride[i] = strides != nullptr ? strides[i] : row_major;
    row_major *= view.shape[i];
  }
  return view;
}

}  // namespace

TensorView to_view(const nb::ndarray<nb::ro>& a, const char* name, int rank) {
  return convert(a, name, rank, rank == kVectorRank, layout_of(rank));
}
TensorView to_view(const nb::ndarray<>& a, const char* name, int rank) {
  return convert(a, name, rank, rank == kVectorRank, layout_of(rank));
}
TensorView to_descale_view(const nb::ndarray<nb::ro>& a, const char* name) {
  return convert(a, name, kDescaleRank, false, "(batch, heads_kv)");
}
TensorView to_matrix_view(const nb::ndarray<nb::ro>& a, const char* name, const char* layout, bool index) {
  return convert(a, name, 2, index, layout);
}

}  // namespace flash4::python
