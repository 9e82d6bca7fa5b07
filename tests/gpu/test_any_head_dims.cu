// Head dims other than 64, 96, 128, 192 and 256 (every multiple of 8 up to 256) on the GPU: zero-padded on the
// next wider kernel (head_dims.h), so narrower than one 64-column panel (8, 40), inside a panel of the 96, 128,
// 192 and 256 kernels (80, 104, 136, 184, 200, 248). Forward and backward against the fp64 reference,
// odd lengths, GQA, causal, window, softcap, the sink, a long causal forward, the deterministic mode, strided
// tensors (row strides that are not the width).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/attention_case.h"
#include "flash4/api.h"
#include "gpu_case_runs.h"

namespace flash4::test {
namespace {

constexpr int64_t kHeadDims[] = {8, 40, 80, 104, 136, 184, 200, 248};

// A build whose FLASH4_HEAD_DIMS lacks the kernel a head dim runs on refuses it with "not compiled".
bool compiled_for(int64_t d) {
  const Device gpu = Device::cuda(0);
  ForwardArgs a;
  a.q = make_view(nullptr, DType::kBFloat16, gpu, 1, 1, 1, d);
  a.k = a.v = a.q;
  a.out = a.q;
  const Support s = can_implement(a, Validation::kWithoutBuffers);
  return s.ok || s.reason.find("not compiled") == std::string::npos;
}

class GpuAnyHeadDim : public ::testing::TestWithParam<int64_t> {};

TEST_P(GpuAnyHeadDim, ForwardAndBackwardMatchReference) {
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU";
  const int64_t d = GetParam();
  if (!compiled_for(d)) GTEST_SKIP() << "kernel width not compiled in this build";
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const std::vector<CaseSpec> cases = {
        make_spec(1, 1, 1, 1, 1, d, dt),
        make_spec(2, 127, 300, 4, 1, d, dt),
        make_spec(1, 300, 300, 4, 2, d, dt, true),
        with(make_spec(2, 130, 257, 2, 2, d, dt), [](CaseSpec& s) { s.window_left = 40, s.window_right = 9; }),
        with(make_spec(1, 190, 190, 2, 1, d, dt, true), [](CaseSpec& s) { s.softcap = 20.0f, s.input_stddev = 3.0; }),
        with(make_spec(1, 150, 170, 2, 1, d, dt), [](CaseSpec& s) { s.sink = true; }),
        with(make_spec(2, 97, 211, 4, 2, d, dt), [](CaseSpec& s) { s.layout = Layout::kStrided; }),
    };
    for (const CaseSpec& s : cases) {
      run_and_check_forward(s);
      run_and_check_backward(s);
    }
  }
  run_and_check_forward(with(make_spec(1, 2048, 2048, 2, 1, d, DType::kBFloat16, true),
                             [](CaseSpec& s) { s.checked_rows = 64; }));
  check_deterministic_backward(make_spec(1, 330, 270, 4, 2, d, DType::kBFloat16, true), 3);
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuAnyHeadDim, ::testing::ValuesIn(kHeadDims),
                         [](const auto& info) { return "d" + std::to_string(info.param); });

}  // namespace
}  // namespace flash4::test
