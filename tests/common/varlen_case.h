// One packed (variable-length) attention test case end to end, as attention_case.h is for dense ones: the spec
// (segment lengths, seqused, mask, sink), random host inputs with poisoned outputs, the matching ForwardArgs /
// BackwardArgs, and the checks against the fp64 reference with the tolerance rule. Every row of the packed
// tensors is checked, rows in no segment included (out 0, lse -inf, zero gradients). GPU tests copy these host
// tensors to the device, run, copy the outputs back and call the same checks.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/host_tensor.h"
#include "common/test_rng.h"
#include "flash4/api.h"

namespace flash4::test {

struct VarlenSpec {
  std::vector<int> seqlens_q, seqlens_k;  // per segment; the batch is their count
  std::vector<int> seqused_q, seqused_k;  // per segment; empty = not passed
  int64_t heads = 1, heads_kv = 1, head_dim = 64;
  int64_t head_dim_v = 0;  // v's and out's head dim; 0 = head_dim
  DType dtype = DType::kBFloat16;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool sink = false;           // random learnable_sink (and dsink in the backward)
  double sink_offset = 0.0;    // added to every sink value (large: the sink dominates the rows)
  bool deterministic = false;
  Layout layout = Layout::kContiguous;
  int64_t pad_q = 0, pad_k = 0;  // rows after the last segment (cu_seqlens[batch] < total)
  double input_stddev = 1.0;
  // Rows no sequence uses hold NaN (the bits of uninitialised memory a caller may leave there): keys and values
  // past seqused_k or after the last segment; queries and output gradients past seqused_q or after the last one.
  bool nan_unused_keys = false, nan_unused_queries = false;

  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  int64_t batch() const { return static_cast<int64_t>(seqlens_q.size()); }
  int64_t total_q() const;
  int64_t total_k() const;
  int64_t max_seqlen_q() const;  // the longest segment, at least 1
  int64_t max_seqlen_k() const;
  std::string name() const;
};

// gtest prints a parameter with this (its name) instead of a byte dump.
void PrintTo(const VarlenSpec& spec, std::ostream* os);

struct VarlenTensors {
  HostTensor q, k, v, out, lse;                   // packed: (total, heads, head_dim), lse (heads, total_q)
  HostTensor cu_seqlens_q, cu_seqlens_k;          // int32 (batch + 1)
  std::optional<HostTensor> seqused_q, seqused_k;  // int32 (batch)
  std::optional<HostTensor> sink, dsink;          // fp32 (heads)
  std::optional<HostTensor> dout, dq, dk, dv;     // backward, when requested

  ForwardArgs forward_args(const VarlenSpec& spec) const;
  BackwardArgs backward_args(const VarlenSpec& spec) const;
};

// Random N(0, stddev) inputs (dout when `backward`), sink ~ N(0, 1) + sink_offset, outputs poisoned with NaN.
VarlenTensors make_varlen_tensors(const VarlenSpec& spec, Rng& rng, bool backward);

// out and lse of every row against the reference and the naive baseline.
::testing::AssertionResult check_varlen_forward(const VarlenSpec& spec, const VarlenTensors& t);

// dq, dk, dv (and dsink with a sink) against the reference and the naive baseline.
::testing::AssertionResult check_varlen_backward(const VarlenSpec& spec, const VarlenTensors& t);

}  // namespace flash4::test
