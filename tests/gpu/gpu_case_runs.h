// One dense attention case run on the GPU and judged against the fp64 reference (tests/common): the forward, the
// backward on the reference's out / LSE, and the deterministic backward's run-to-run identity. Shared by the GPU
// test files so that each adds only its cases.
#pragma once

#include <gtest/gtest.h>

#include <optional>

#include "common/attention_case.h"
#include "device_mirror.h"
#include "flash4/api.h"

namespace flash4::test {

using Launcher = void (*)(const ForwardArgs&);

// Runs the forward of `spec` on the GPU (through flash4::forward, or `launch` for a kernel variant the library
// does not compile) and checks it against the fp64 reference.
void run_and_check_forward(const CaseSpec& spec, Launcher launch = nullptr);

// Fills out and lse of `t` with the fp64 reference forward (out rounded to the dtype, LSE to fp32), so that the
// backward is tested on its own.
void reference_out_lse(const CaseSpec& spec, AttentionTensors& t);

// The device copies of one case's forward tensors (q, k, v, out, lse, and the sink with spec.sink) and the
// ForwardArgs that point at them.
struct DeviceForward {
  explicit DeviceForward(AttentionTensors& t) : q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse) {
    if (t.sink) sink.emplace(*t.sink);
  }
  bool ok() const { return q.ok() && k.ok() && v.ok() && out.ok() && lse.ok() && (!sink || sink->ok()); }
  ForwardArgs args(const CaseSpec& spec, const AttentionTensors& t) const;
  DeviceMirror q, k, v, out, lse;
  std::optional<DeviceMirror> sink;
};

// The device copies of one case's backward tensors and the BackwardArgs that point at them.
// With spec.sink the learnable sink and its gradient travel too.
struct DeviceCase {
  explicit DeviceCase(AttentionTensors& t)
      : q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse), dout(*t.dout), dq(*t.dq), dk(*t.dk), dv(*t.dv) {
    if (t.sink) sink.emplace(*t.sink);
    if (t.dsink) dsink.emplace(*t.dsink);
  }
  bool ok() const {
    return q.ok() && k.ok() && v.ok() && out.ok() && lse.ok() && dout.ok() && dq.ok() && dk.ok() && dv.ok() &&
           (!sink || sink->ok()) && (!dsink || dsink->ok());
  }
  BackwardArgs args(const CaseSpec& spec, const AttentionTensors& t) const;
  // Downloads dq, dk, dv (and dsink).
  cudaError_t download_gradients();
  DeviceMirror q, k, v, out, lse, dout, dq, dk, dv;
  std::optional<DeviceMirror> sink, dsink;
};

// The backward of `spec` on the GPU against the fp64 reference (on the reference's out and LSE).
void run_and_check_backward(const CaseSpec& spec);

// The deterministic backward of `spec` run `runs` times: bit-identical dq, dk, dv every run, and within the
// tolerance rule.
void check_deterministic_backward(const CaseSpec& spec, int runs);

}  // namespace flash4::test
