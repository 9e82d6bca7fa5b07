#include "api/sequence_split.h"

#include <string>

#include "flash4/error.h"

namespace flash4::detail {
namespace {

// Rows [row0, row0 + rows) of an attention tensor as a dense (1, rows, heads, head_dim) view: a packed
// (total, heads, head_dim) tensor by its row offset, a dense one by its batch entry b.
TensorView sequence_rows(const TensorView& t, bool packed, int64_t b, int64_t row0, int64_t rows) {
  TensorView v = t;
  const int64_t elem = dtype_size(t.dtype);
  if (packed) {
    v.rank = 4;
    v.shape[0] = 1, v.shape[1] = rows, v.shape[2] = t.shape[1], v.shape[3] = t.shape[2];
    v.stride[0] = rows * t.stride[0], v.stride[1] = t.stride[0], v.stride[2] = t.stride[1], v.stride[3] = 1;
    if (t.data != nullptr) v.data = static_cast<char*>(t.data) + row0 * t.stride[0] * elem;
  } else {
    v.shape[0] = 1, v.shape[1] = rows;
    if (t.data != nullptr) v.data = static_cast<char*>(t.data) + (b * t.stride[0] + row0 * t.stride[1]) * elem;
  }
  return v;  // an empty tensor may have no data: its view keeps the null pointer
}

// The LSE rows of a sequence as a (1, heads, rows) view: packed (heads, total_q) by its row offset, dense
// (batch, heads, seqlen_q) by its batch entry.
TensorView sequence_lse(const TensorView& lse, bool packed, int64_t b, int64_t row0, int64_t rows) {
  TensorView v = lse;
  v.rank = 3;
  if (packed) {
    v.shape[0] = 1, v.shape[1] = lse.shape[0], v.shape[2] = rows;
    v.stride[0] = lse.shape[0] * lse.stride[0], v.stride[1] = lse.stride[0], v.stride[2] = 1;
    if (lse.data != nullptr) v.data = static_cast<float*>(lse.data) + row0;
  } else {
    v.shape[0] = 1, v.shape[2] = rows;
    if (lse.data != nullptr) v.data = static_cast<float*>(lse.data) + b * lse.stride[0] + row0;
  }
  return v;
}

}  // namespace

SequenceCall sequence_backward_args(const BackwardArgs& args, const Problem& p, const SequenceLayout& host_layout,
                                    int64_t b) {
  SequenceCall call;
  const SequenceInfo si = host_layout.info(b);
  if (si.seqlen_q == 0 || si.seqlen_k == 0) return call;
  const bool packed_q = host_layout.cu_seqlens_q != nullptr, packed_k = host_layout.cu_seqlens_k != nullptr;
  BackwardArgs& a = call.args;
  a.softmax_scale = p.softmax_scale;
  a.causal = false;  // the window below already holds causal (the band is per sequence, bottom-right)
  a.window_left = static_cast<int>(p.window_left);
  a.window_right = static_cast<int>(p.window_right);
  a.softcap = p.softcap;
  a.deterministic = args.deterministic;
  a.q = sequence_rows(args.q, packed_q, b, si.q_offset, si.seqlen_q);
  a.out = sequence_rows(args.out, packed_q, b, si.q_offset, si.seqlen_q);
  a.dout = sequence_rows(args.dout, packed_q, b, si.q_offset, si.seqlen_q);
  a.dq = sequence_rows(args.dq, packed_q, b, si.q_offset, si.seqlen_q);
  a.lse = sequence_lse(args.lse, packed_q, b, si.q_offset, si.seqlen_q);
  a.k = sequence_rows(args.k, packed_k, b, si.k_offset, si.seqlen_k);
  a.v = sequence_rows(args.v, packed_k, b, si.k_offset, si.seqlen_k);
  a.dk = sequence_rows(args.dk, packed_k, b, si.k_offset, si.seqlen_k);
  a.dv = sequence_rows(args.dv, packed_k, b, si.k_offset, si.seqlen_k);
  call.empty = false;
  return call;
}

void backward_per_sequence(const BackwardArgs& args, const Problem& p, const SequenceLayout& host_layout,
                           const SequenceSplitBackend& backend) {
  std::vector<BackwardArgs> calls;
  calls.reserve(static_cast<size_t>(p.batch));
  for (int64_t b = 0; b < p.batch; ++b) {
    SequenceCall call = sequence_backward_args(args, p, host_layout, b);
    if (call.empty) continue;
    const Support s = backend.can_run(call.args);
    if (!s.ok) throw Error(Status::kNotSupported, "flash4::backward: sequence " + std::to_string(b) + ": " + s.reason);
    calls.push_back(call.args);
  }
  for (const TensorView* t : {&args.dq, &args.dk, &args.dv}) backend.zero(*t);  // rows in no sequence stay 0
  for (const BackwardArgs& a : calls) backend.run(a);
}

}  // namespace flash4::detail
