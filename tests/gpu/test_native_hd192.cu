// The native d = 192 kernels through flash4::forward and flash4::backward, against the fp64 reference: the forward
// (fwd_tile_config(192): 128 x 96 tiles, three 64-column chunks) and the role-split backward
// (bwd_wgmma_roles_kernel.cuh: 64-key tiles, a 3-stage Q / dO ring, dQ's three chunks split two and one between
// the warpgroups). Odd lengths, GQA / MQA, causal with seqlen_q < seqlen_k, window, softcap,
// the sink, strided tensors with NaN-poisoned padding after every row, bf16 and fp16; deterministic backward.
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

// Q-tile counts that end the 3-stage ring on each of its stages; seqlen_k <= 64 has one key tile (no mma.sync
// kernel at 192).
TEST_P(NativeHd192, BackwardMatchesReference) {
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU";
  run_and_check_backward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, NativeHd192, ::testing::ValuesIn(native_cases()),
                         [](const auto& info) { return info.param.name(); });

// The backward's short cases: one key tile, a single query, and seqlen_k <= 64 in deterministic mode.
TEST(NativeHd192Backward, ShortKeysAndDeterminism) {
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU";
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    run_and_check_backward(make_spec(1, 1, 17, 2, 2, 192, dt));
    run_and_check_backward(make_spec(2, 65, 40, 4, 2, 192, dt, true));
    run_and_check_backward(make_spec(1, 193, 64, 3, 1, 192, dt));
  }
  for (bool causal : {false, true}) {
    check_deterministic_backward(make_spec(1, 330, 270, 4, 2, 192, DType::kBFloat16, causal), 4);
    check_deterministic_backward(make_spec(2, 40, 50, 2, 1, 192, DType::kFloat16, causal), 3);
  }
}

}  // namespace
}  // namespace flash4::test
