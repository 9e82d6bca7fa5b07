// One attention test case end to end, independent of the backend: the spec, random host inputs with poisoned
// outputs, the matching ForwardArgs / BackwardArgs, and the check of the outputs against the fp64 reference
// with the tolerance rule. CPU tests run the CPU backend on these host tensors; GPU tests copy them to the
// device, run, copy the outputs back into the same HostTensors and call the same checks.
#pragma once

#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "common/host_tensor.h"
#include "common/problem.h"
#include "common/test_rng.h"
#include "flash4/api.h"

namespace flash4::test {

struct CaseSpec {
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads = 1, heads_kv = 1, head_dim = 64;
  int64_t head_dim_v = 0;  // v's and out's head dim; 0 = head_dim
  DType dtype = DType::kBFloat16;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  float softmax_scale = 0.0f;  // 0 = default
  Layout layout = Layout::kContiguous;
  bool broadcast_kv = false;  // k and v in Layout::kBroadcast (one batch, one head, stride 0), the rest in `layout`
  Tuning tuning{};
  int64_t checked_rows = 0;    // forward: check this many sampled query rows (0 = all)
  double input_stddev = 1.0;
  bool sink = false;         // random learnable_sink (fp32 (heads)); dsink in the backward
  double sink_offset = 0.0;  // added to every sink value

  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  std::string name() const;  // for test names and messages
};

// A case of these sizes, every other field at its default.
CaseSpec make_spec(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads, int64_t heads_kv,
                   int64_t head_dim, DType dtype, bool causal = false);

// `s` after `change(s)`: with(make_spec(...), [](CaseSpec& s) { s.causal = true; }).
template <class Change>
CaseSpec with(CaseSpec s, Change&& change) {
  change(s);
  return s;
}

struct AttentionTensors {
  HostTensor q, k, v, out, lse;       // forward inputs and outputs
  std::optional<HostTensor> dout, dq, dk, dv;  // backward, when requested
  std::optional<HostTensor> sink, dsink;       // with spec.sink (dsink when backward)

  ForwardArgs forward_args(const CaseSpec& spec) const;
  BackwardArgs backward_args(const CaseSpec& spec) const;
};

// Random N(0, stddev) inputs (and dout when `backward`), outputs poisoned with NaN.
AttentionTensors make_tensors(const CaseSpec& spec, Rng& rng, bool backward);

// Compares out and LSE (on spec.checked_rows sampled rows) with the reference and the naive baseline. With
// tuning.exp2 == kPolynomial the polynomial's error bound is added to atol (GPU tests whose kAuto emulates
// exp2 should check with kPolynomial in the spec).
::testing::AssertionResult check_forward(const CaseSpec& spec, const AttentionTensors& t, Rng& rng);

// Compares dq, dk, dv (and dsink) with the reference and the naive baseline; out/lse in `t` must be the forward's.
::testing::AssertionResult check_backward(const CaseSpec& spec, const AttentionTensors& t);

}  // namespace flash4::test
