// The native d = 192 forward kernel (fwd_tile_config(192): 128 x 96 tiles, three 64-column chunks), through
// flash4::forward, against the fp64 reference: odd lengths, GQA / MQA, causal with seqlen_q < seqlen_k, window,
// softcap, the sink, strided tensors with NaN-poisoned padding after every row, bf16 and fp16.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/attention_case.h"
#include "gpu_case_runs.h"

namespace flash4::test {
namespace {

std::vector<CaseSpec> native_cases() {
  std::vector<CaseSpec> c;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    c.push_back(make_spec(1, 1, 1, 1, 1, 192, dt));
    c.push_back(make_spec(2, 200, 333, 4, 2, 192, dt));  // tails in Q and K/V tiles
    c.push_back(make_spec(1, 300, 300, 6, 2, 192, dt, true));
    c.push_back(make_spec(2, 130, 700, 4, 1, 192, dt, true));  // MQA, causal with seqlen_q < seqlen_k
    c.push_back(
        with(make_spec(1, 257, 190, 2, 1, 192, dt), [](CaseSpec& s) { s.window_left = 40, s.window_right = 7; }));
    c.push_back(with(make_spec(1, 150, 260, 4, 4, 192, dt), [](CaseSpec& s) { s.softcap = 15.0f; }));
    c.push_back(with(make_spec(2, 100, 100, 4, 2, 192, dt, true), [](CaseSpec& s) { s.sink = true; }));
    c.push_back(with(make_spec(2, 97, 211, 4, 2, 192, dt), [](CaseSpec& s) { s.layout = Layout::kStrided; }));
  }
  c.push_back(with(make_spec(1, 2048, 2048, 2, 1, 192, DType::kBFloat16, true), [](CaseSpec& s) {
    s.checked_rows = 64;  // ring laps and persistent tiles; sampled rows (the reference is the slow part)
  }));
  return c;
}

class NativeHd192 : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(NativeHd192, ForwardMatchesReference) {
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU";
  run_and_check_forward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, NativeHd192, ::testing::ValuesIn(native_cases()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace flash4::test
