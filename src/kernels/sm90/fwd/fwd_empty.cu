#include "kernels/sm90/fwd/fwd_empty.h"

#include "kernels/cuda_check.h"
#include "kernels/sm90/clear_rows.cuh"

namespace flash4::sm90 {
namespace {

RowsView rows_view(const TensorView& t) {
  if (t.rank == 3) return {static_cast<uint16_t*>(t.data), 0, t.stride[0], t.stride[1], t.shape[2]};
  return {static_cast<uint16_t*>(t.data), t.stride[0], t.stride[1], t.stride[2], t.shape[3]};
}
LseView lse_view(const TensorView& t) {
  if (t.data == nullptr) return {nullptr, 0, 0};
  if (t.rank == 2) return {static_cast<float*>(t.data), 0, t.stride[0]};
  return {static_cast<float*>(t.data), t.stride[0], t.stride[1]};
}

// Every row of every batch entry: grid-stride over (batch, seqlen) rows.
__global__ void clear_all_rows(RowsView o, LseView l, const float* sink, int64_t batch, int64_t seqlen,
                               int64_t heads) {
  for (int64_t r = blockIdx.x; r < batch * seqlen; r += gridDim.x)
    clear_row(o, l, sink, r / seqlen, r % seqlen, heads, threadIdx.x, blockDim.x);
}

// CTA b < batch: the rows of entry b past its used queries, up to its segment's end; CTA `batch` (packed only):
// the rows after the last segment. Offsets are clamped by the layout, as in the attention kernel.
__global__ void clear_uncovered_rows(RowsView o, LseView l, const float* sink, detail::SequenceLayout seq,
                                     int64_t batch, int64_t heads) {
  const int64_t b = blockIdx.x;
  const bool packed = seq.cu_seqlens_q != nullptr;
  int64_t first, end;  // rows [first, end) of batch entry `packed ? 0 : b`
  if (b < batch) {
    const detail::SequenceInfo si = seq.info(b);
    first = si.q_offset + si.seqlen_q;
    end = packed ? detail::clamped_offset(seq.cu_seqlens_q, b + 1, seq.total_q) : seq.seqlen_q;
  } else {
    first = detail::clamped_offset(seq.cu_seqlens_q, batch, seq.total_q);
    end = seq.total_q;
  }
  for (int64_t row = first; row < end; ++row)
    clear_row(o, l, nullptr, packed ? 0 : b, row, heads, threadIdx.x, blockDim.x);  // LSE -inf: in no sequence
}

}  // namespace

void launch_forward_no_keys(const ForwardArgs& args, const detail::Problem& p, cudaStream_t stream) {
  const int64_t batch = p.varlen() ? 1 : p.batch, seqlen = p.varlen() ? p.total_q : p.seqlen_q;
  if (batch * seqlen == 0) return;
  clear_all_rows<<<1024, 128, 0, stream>>>(rows_view(args.out), lse_view(args.lse), p.learnable_sink, batch,
                                           seqlen, p.heads);
  FLASH4_CUDA_CHECK_LAUNCH();
  if (p.varlen() || p.seqused_q != nullptr) launch_forward_uncovered_rows(args, p, stream);
}

void launch_forward_uncovered_rows(const ForwardArgs& args, const detail::Problem& p, cudaStream_t stream) {
  const int64_t ctas = p.batch + (p.varlen() ? 1 : 0);
  if (ctas == 0) return;
  clear_uncovered_rows<<<static_cast<unsigned>(ctas), 128, 0, stream>>>(
      rows_view(args.out), lse_view(args.lse), p.learnable_sink, p.layout(), p.batch, p.heads);
  FLASH4_CUDA_CHECK_LAUNCH();
}

void launch_zero_uncovered_key_rows(const TensorView& t, const detail::Problem& p, cudaStream_t stream) {
  const int64_t ctas = p.batch + (p.varlen() ? 1 : 0);
  if (ctas == 0 || p.heads_kv == 0) return;
  // The keys' layout in the queries' fields, which clear_uncovered_rows reads.
  const detail::SequenceLayout q = p.layout();
  detail::SequenceLayout keys = q;
  keys.seqlen_q = q.seqlen_k;
  keys.total_q = q.total_k;
  keys.cu_seqlens_q = q.cu_seqlens_k;
  keys.seqused_q = q.seqused_k;
  keys.seqlen_k = q.seqlen_q;
  keys.total_k = q.total_q;
  keys.cu_seqlens_k = q.cu_seqlens_q;
  keys.seqused_k = q.seqused_q;
  clear_uncovered_rows<<<static_cast<unsigned>(ctas), 128, 0, stream>>>(rows_view(t), LseView{nullptr, 0, 0}, nullptr,
                                                                         keys, p.batch, p.heads_kv);
  FLASH4_CUDA_CHECK_LAUNCH();
}

void launch_zero_rows(const TensorView& t, cudaStream_t stream) {
  const int64_t batch = t.rank == 3 ? 1 : t.shape[0], seqlen = t.rank == 3 ? t.shape[0] : t.shape[1];
  const int64_t heads = t.rank == 3 ? t.shape[1] : t.shape[2];
  if (batch * seqlen * heads == 0) return;
  clear_all_rows<<<1024, 128, 0, stream>>>(rows_view(t), LseView{nullptr, 0, 0}, nullptr, batch, seqlen, heads);
  FLASH4_CUDA_CHECK_LAUNCH();
}

}  // namespace flash4::sm90
