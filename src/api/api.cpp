// The public entry points: validate, pick the backend from the tensors' device, run.
//
// Degenerate shapes are settled here so backends only see real work: no output elements -> nothing to do;
// forward with seqlen_k == 0 -> every row is fully masked (out = 0, lse = -inf); backward where no (query, key)
// pair exists (seqlen_q, seqlen_k or heads is 0) -> zero gradients. On the CPU the API layer writes those
// itself; CUDA tensors go to the CUDA backend, which must handle them (it owns device memory). Packed batches,
// seqused and the learnable sink always reach the CPU backend, which handles their empty segments itself.
#include <cstring>
#include <limits>
#include <string>

#include "api/backends.h"

namespace flash4 {
namespace {

constexpr const char* kVersion = "0.1.0";  // keep in sync with project(VERSION) in CMakeLists.txt

// Calls fn(pointer to row) for every contiguous last-dimension row of a host view.
template <typename Fn>
void for_each_row(const TensorView& t, Fn fn) {
  const int outer = t.rank - 1;
  int64_t index[3] = {0, 0, 0};
  int64_t rows = 1;
  for (int i = 0; i < outer; ++i) rows *= t.shape[i];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rest = r, offset = 0;
    for (int i = outer - 1; i >= 0; --i) {
      index[i] = rest % t.shape[i];
      rest /= t.shape[i];
      offset += index[i] * t.stride[i];
    }
    fn(static_cast<char*>(t.data) + offset * dtype_size(t.dtype));
  }
}

// Zero is all-zero bits in fp32, fp16 and bf16 alike.
void zero_host(const TensorView& t) {
  if (t.numel() == 0) return;
  const size_t row_bytes = static_cast<size_t>(t.shape[t.rank - 1]) * dtype_size(t.dtype);
  for_each_row(t, [&](char* row) { std::memset(row, 0, row_bytes); });
}

void fill_lse_host(const TensorView& lse, float value) {
  if (lse.data == nullptr || lse.numel() == 0) return;
  for_each_row(lse, [&](char* row) {
    float* r = reinterpret_cast<float*>(row);
    for (int64_t i = 0; i < lse.shape[2]; ++i) r[i] = value;
  });
}

bool is_cpu(const TensorView& t) { return t.device.kind == DeviceKind::kCpu; }

Support unsupported_on_cuda(Support s, const char* entry_point) {
  if (!s.ok) throw Error(Status::kNotSupported, std::string(entry_point) + ": " + s.reason);
  return s;
}

// What the CUDA backend can run.
Support cuda_can(const ForwardArgs& args, const detail::Problem& p) { return detail::cuda_can_forward(args, p); }
Support cuda_can(const BackwardArgs& args, const detail::Problem& p) { return detail::cuda_can_backward(args, p); }

// Whether the CPU backend must see the call even when it has no (query, key) pair: only the backend knows which
// rows of a packed or seqused batch are covered, and a sink gives key-less rows a finite LSE.
bool cpu_needs_backend(const detail::Problem& p) {
  return p.varlen() || p.seqused_q != nullptr || p.seqused_k != nullptr || p.learnable_sink != nullptr;
}

}  // namespace

Support can_implement(const ForwardArgs& args) {
  const detail::Problem p = detail::validate(args);
  if (is_cpu(args.q)) return {};  // the CPU path runs every valid configuration
  return cuda_can(args, p);
}

Support can_implement(const BackwardArgs& args) {
  const detail::Problem p = detail::validate(args);
  if (is_cpu(args.q)) return {};
  return cuda_can(args, p);
}

void forward(const ForwardArgs& args, Stream stream) {
  const detail::Problem p = detail::validate(args);
  if (!is_cpu(args.q)) {
    unsupported_on_cuda(cuda_can(args, p), "flash4::forward");
    if (args.out.numel() == 0) return;
    detail::cuda_forward(args, p, stream);
    return;
  }
  if (args.out.numel() == 0) return;
  if (cpu_needs_backend(p)) {
    detail::cpu_forward(args, p);
    return;
  }
  if (p.seqlen_k == 0) {  // no keys: every row is fully masked
    zero_host(args.out);
    fill_lse_host(args.lse, -std::numeric_limits<float>::infinity());
    return;
  }
  detail::cpu_forward(args, p);
}

void backward(const BackwardArgs& args, Stream stream) {
  const detail::Problem p = detail::validate(args);
  const bool no_outputs =
      args.dq.numel() == 0 && args.dk.numel() == 0 && args.dv.numel() == 0 && args.dsink.numel() == 0;
  if (!is_cpu(args.q)) {
    unsupported_on_cuda(cuda_can(args, p), "flash4::backward");
    if (no_outputs) return;
    detail::cuda_backward(args, p, stream);
    return;
  }
  if (no_outputs) return;
  if (cpu_needs_backend(p)) {
    detail::cpu_backward(args, p);
    return;
  }
  if (p.seqlen_q == 0 || p.seqlen_k == 0 || p.heads == 0) {  // no (query, key) pair: all gradients are zero
    zero_host(args.dq);
    zero_host(args.dk);
    zero_host(args.dv);
    return;
  }
  detail::cpu_backward(args, p);
}

bool cuda_available(int device_index) { return device_index >= 0 && detail::cuda_device_supported(device_index); }

const char* version() { return kVersion; }

}  // namespace flash4
