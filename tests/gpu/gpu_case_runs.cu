#include "gpu_case_runs.h"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"

namespace flash4::test {

ForwardArgs DeviceForward::args(const CaseSpec& spec, const AttentionTensors& t) const {
  ForwardArgs a = t.forward_args(spec);
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  if (sink) a.learnable_sink = sink->view();
  return a;
}

void run_and_check_forward(const CaseSpec& spec, Launcher launch) {
  SCOPED_TRACE(spec.name());
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(spec, rng, /*backward=*/false);
  DeviceForward dev(t);
  ASSERT_TRUE(dev.ok());
  const ForwardArgs args = dev.args(spec, t);
  const Support support = can_implement(args);
  ASSERT_TRUE(support.ok) << support.reason;
  if (launch != nullptr) {
    launch(args);
  } else {
    forward(args);
  }
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dev.out.download());
  FLASH4_TEST_CUDA(dev.lse.download());
  EXPECT_TRUE(check_forward(spec, t, rng));
}

void reference_out_lse(const CaseSpec& spec, AttentionTensors& t) {
  const detail::Problem p = make_problem(t.forward_args(spec));
  const ForwardResult ref = reference_forward(p, t.q.to_double(), t.k.to_double(), t.v.to_double());
  t.out.assign(ref.out);
  t.lse.assign(ref.lse);
}

BackwardArgs DeviceCase::args(const CaseSpec& spec, const AttentionTensors& t) const {
  BackwardArgs a = t.backward_args(spec);
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.dout = dout.view();
  a.dq = dq.view();
  a.dk = dk.view();
  a.dv = dv.view();
  if (sink) a.learnable_sink = sink->view();
  if (dsink) a.dsink = dsink->view();
  return a;
}

cudaError_t DeviceCase::download_gradients() {
  for (DeviceMirror* m : {&dq, &dk, &dv, dsink ? &*dsink : nullptr})
    if (m != nullptr)
      if (const cudaError_t e = m->download(); e != cudaSuccess) return e;
  return cudaSuccess;
}

void run_and_check_backward(const CaseSpec& spec) {
  SCOPED_TRACE(spec.name());
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(spec, rng, /*backward=*/true);
  reference_out_lse(spec, t);
  DeviceCase dev(t);
  ASSERT_TRUE(dev.ok());
  const BackwardArgs args = dev.args(spec, t);
  const Support support = can_implement(args);
  ASSERT_TRUE(support.ok) << support.reason;
  backward(args);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dev.download_gradients());
  EXPECT_TRUE(check_backward(spec, t));
}

void check_deterministic_backward(const CaseSpec& spec, int runs) {
  SCOPED_TRACE(spec.name());
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(spec, rng, /*backward=*/true);
  reference_out_lse(spec, t);
  DeviceCase dev(t);
  ASSERT_TRUE(dev.ok());
  BackwardArgs args = dev.args(spec, t);
  args.deterministic = true;
  const Support support = can_implement(args);
  ASSERT_TRUE(support.ok) << support.reason;
  std::vector<std::vector<char>> first;
  for (int run = 0; run < runs; ++run) {
    backward(args);
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    FLASH4_TEST_CUDA(dev.download_gradients());
    int index = 0;
    for (HostTensor* h : {&*t.dq, &*t.dk, &*t.dv}) {
      const char* bytes = static_cast<const char*>(h->data());
      if (run == 0) {
        first.emplace_back(bytes, bytes + h->storage_bytes());
      } else {
        EXPECT_EQ(std::memcmp(first[index].data(), bytes, h->storage_bytes()), 0)
            << "run " << run << " differs from run 0 in " << (index == 0 ? "dq" : index == 1 ? "dk" : "dv");
      }
      ++index;
    }
  }
  EXPECT_TRUE(check_backward(spec, t));
}

}  // namespace flash4::test
