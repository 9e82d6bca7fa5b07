#include "kernels/sm90/bwd/bwd_sequences.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "api/backends.h"
#include "api/sequence_split.h"
#include "common/score_transform.h"
#include "common/sequence.h"
#include "kernels/cuda_check.h"
#include "kernels/device_guard.h"
#include "kernels/sm90/fwd/fwd_empty.h"
#include "kernels/sm90/pack.cuh"

namespace flash4::detail {
namespace {

// An attention tensor's element strides seen as (batch, rows, heads, head_dim): a packed (total, heads,
// head_dim) one is one batch entry; head_dim contiguous.
struct RowsView {
  int64_t head_dim, stride_b, stride_s, stride_h;
};
RowsView rows_view(const TensorView& t) {
  if (t.rank == 3) return {t.shape[2], 0, t.stride[0], t.stride[1]};
  return {t.shape[3], t.stride[0], t.stride[1], t.stride[2]};
}

// dsink[h] = -sum over the rows i of each sequence (head h) of exp(sink[h] - LSE_i) * rowsum(dO_i * O_i): one CTA
// per head, each thread's rows in a fixed order and a fixed reduction tree (the same result every run).
constexpr int kDsinkThreads = 256;
template <class Element>
__global__ void __launch_bounds__(kDsinkThreads) packed_dsink_kernel(const Element* out, RowsView ov,
                                                                    const Element* dout, RowsView dv,
                                                                    const float* lse, int64_t lse_stride_b,
                                                                    int64_t lse_stride_h, const float* sink,
                                                                    float* dsink, SequenceLayout seq, int64_t batch) {
  __shared__ float partial[kDsinkThreads];
  const int64_t h = blockIdx.x;
  const bool packed = seq.cu_seqlens_q != nullptr;
  float acc = 0.0f;
  for (int64_t b = 0; b < batch; ++b) {
    const SequenceInfo si = seq.info(b);
    const int64_t vb = packed ? 0 : b;
    for (int64_t i = threadIdx.x; i < si.seqlen_q; i += kDsinkThreads) {
      const int64_t row = si.q_offset + i;
      const Element* o = out + vb * ov.stride_b + row * ov.stride_s + h * ov.stride_h;
      const Element* g = dout + vb * dv.stride_b + row * dv.stride_s + h * dv.stride_h;
      float d = 0.0f;
      for (int64_t c = 0; c < ov.head_dim; c += 2) {  // head_dim is even and rows 4-byte aligned
        const float2 x = sm90::unpack2<Element>(*reinterpret_cast<const uint32_t*>(o + c));
        const float2 y = sm90::unpack2<Element>(*reinterpret_cast<const uint32_t*>(g + c));
        d = fmaf(x.x, y.x, fmaf(x.y, y.y, d));
      }
      acc += expf(sink[h] - lse[vb * lse_stride_b + h * lse_stride_h + row]) * d;  // LSE >= sink: finite
    }
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kDsinkThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsink[h] = -partial[0];
}

template <class Element>
void launch_packed_dsink(const BackwardArgs& args, const Problem& p, cudaStream_t stream) {
  const TensorView& lse = args.lse;
  const int64_t lse_stride_b = lse.rank == 2 ? 0 : lse.stride[0], lse_stride_h = lse.rank == 2 ? lse.stride[0] : lse.stride[1];
  packed_dsink_kernel<Element><<<static_cast<unsigned>(p.heads), kDsinkThreads, 0, stream>>>(
      static_cast<const Element*>(args.out.data), rows_view(args.out), static_cast<const Element*>(args.dout.data),
      rows_view(args.dout), static_cast<const float*>(lse.data), lse_stride_b, lse_stride_h, p.learnable_sink,
      static_cast<float*>(args.dsink.data), p.layout(), p.batch);
  FLASH4_CUDA_CHECK_LAUNCH();
}

// A layout whose one sequence has the maximal lengths at offset 0: the dense views every real sequence's views
// are row slices of (same strides, same alignment), for checking what the kernels accept without reading offsets.
struct ProbeLayout {
  int cu_q[2], cu_k[2];
  SequenceLayout layout;
  explicit ProbeLayout(const Problem& p)
      : cu_q{0, static_cast<int>(p.seqlen_q)}, cu_k{0, static_cast<int>(p.seqlen_k)},
        layout(dense_layout(p.seqlen_q, p.seqlen_k)) {
    layout.total_q = p.total_q;
    layout.total_k = p.total_k;
    if (p.varlen()) {
      layout.cu_seqlens_q = cu_q;
      layout.cu_seqlens_k = cu_k;
    }
  }
};

// The offsets as host arrays (a synchronizing copy), in a layout that points at them.
struct HostLayout {
  std::vector<int> cu_q, cu_k, used_q, used_k;
  SequenceLayout layout;
};
std::vector<int> copy_to_host(const int* device, int64_t n, cudaStream_t stream) {
  std::vector<int> host(static_cast<size_t>(n));
  if (n > 0) FLASH4_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
  return host;
}
HostLayout host_layout(const Problem& p, cudaStream_t stream) {
  HostLayout h;
  h.layout = p.layout();
  if (p.cu_seqlens_q != nullptr) h.cu_q = copy_to_host(p.cu_seqlens_q, p.batch + 1, stream);
  if (p.cu_seqlens_k != nullptr) h.cu_k = copy_to_host(p.cu_seqlens_k, p.batch + 1, stream);
  if (p.seqused_q != nullptr) h.used_q = copy_to_host(p.seqused_q, p.batch, stream);
  if (p.seqused_k != nullptr) h.used_k = copy_to_host(p.seqused_k, p.batch, stream);
  FLASH4_CUDA_CHECK(cudaStreamSynchronize(stream));
  h.layout.cu_seqlens_q = p.cu_seqlens_q != nullptr ? h.cu_q.data() : nullptr;
  h.layout.cu_seqlens_k = p.cu_seqlens_k != nullptr ? h.cu_k.data() : nullptr;
  h.layout.seqused_q = p.seqused_q != nullptr ? h.used_q.data() : nullptr;
  h.layout.seqused_k = p.seqused_k != nullptr ? h.used_k.data() : nullptr;
  return h;
}

}  // namespace

bool backward_needs_sequences(const Problem& p) {
  return p.varlen() || p.seqused_q != nullptr || p.seqused_k != nullptr;
}

Support cuda_can_backward_sequences(const BackwardArgs& args, const Problem& p) {
  const ProbeLayout probe(p);
  const SequenceCall call = sequence_backward_args(args, p, probe.layout, 0);
  if (call.empty) return {true, ""};
  return cuda_can_backward(call.args, validate(call.args));
}

void cuda_backward_sequences(const BackwardArgs& args, const Problem& p, Stream stream) {
  DeviceGuard guard(args.q.device.index);
  const auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASH4_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(Status::kNotSupported, "flash4::backward: the GPU backward of packed or seqused batches reads the "
                                       "sequence offsets on the host and cannot be captured in a CUDA graph");
  const HostLayout host = host_layout(p, s);
  SequenceSplitBackend backend;
  backend.can_run = [](const BackwardArgs& a) { return cuda_can_backward(a, validate(a)); };
  backend.run = [&](const BackwardArgs& a) { cuda_backward(a, validate(a), stream); };
  backend.zero = [&](const TensorView& t) { sm90::launch_zero_rows(t, s); };
  backward_per_sequence(args, p, host.layout, backend);
  if (args.dsink.data != nullptr && p.learnable_sink != nullptr) {
    if (args.q.dtype == DType::kBFloat16) launch_packed_dsink<__nv_bfloat16>(args, p, s);
    else launch_packed_dsink<__half>(args, p, s);
  }
}

}  // namespace flash4::detail
