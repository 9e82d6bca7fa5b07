// The LSE is optional (flash4/api.h): a forward without it must write the same output, bit for bit, and touch
// nothing else. Inference calls from Python pass none (docs/python.md), so every GPU route runs here both ways:
// the dense kernels (masked or not, every compiled head dim, GQA, window, softcap, sink) and the decode route.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "common/attention_case.h"
#include "common/test_rng.h"
#include "device_mirror.h"
#include "flash4/api.h"
#include "gpu_case_runs.h"

namespace flash4::test {
namespace {

void run_both_ways(const CaseSpec& spec) {
  SCOPED_TRACE(spec.name());
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU";
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(spec, rng, /*backward=*/false);
  HostTensor out_without = t.out;  // NaN-poisoned, as make_tensors leaves out
  DeviceForward dev(t);
  DeviceMirror out_b(out_without);
  ASSERT_TRUE(dev.ok() && out_b.ok());
  const ForwardArgs args = dev.args(spec, t);
  const Support support = can_implement(args);
  if (!support.ok && support.reason.find("not compiled") != std::string::npos) return;  // a slice build
  ASSERT_TRUE(support.ok) << support.reason;
  forward(args);
  ForwardArgs without = args;
  without.out = out_b.view();
  without.lse = TensorView{};
  ASSERT_TRUE(can_implement(without).ok);
  forward(without);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dev.out.download());
  FLASH4_TEST_CUDA(out_b.download());
  ASSERT_EQ(t.out.storage_bytes(), out_without.storage_bytes());
  EXPECT_EQ(std::memcmp(t.out.data(), out_without.data(), t.out.storage_bytes()), 0)
      << "the forward without an LSE wrote a different output";
}

TEST(ForwardWithoutLse, DenseKernels) {
  for (int64_t d : {64, 96, 128, 192, 256}) {
    run_both_ways(make_spec(2, 333, 333, 4, 4, d, DType::kBFloat16, /*causal=*/true));
    run_both_ways(make_spec(1, 1000, 517, 8, 2, d, DType::kFloat16, /*causal=*/false));
  }
  run_both_ways(with(make_spec(1, 700, 900, 8, 1, 128, DType::kBFloat16, true), [](CaseSpec& s) {
    s.window_left = 100;
    s.window_right = 0;
    s.softcap = 30.0f;
    s.sink = true;
  }));
}

TEST(ForwardWithoutLse, DecodeRoute) {
  run_both_ways(make_spec(3, 1, 4100, 32, 8, 128, DType::kBFloat16, /*causal=*/true));
  run_both_ways(with(make_spec(2, 4, 20000, 16, 2, 64, DType::kFloat16, true), [](CaseSpec& s) { s.sink = true; }));
  run_both_ways(make_spec(1, 16, 777, 4, 4, 256, DType::kBFloat16, /*causal=*/false));
}

}  // namespace
}  // namespace flash4::test
