// The native d = 96 and d = 192 kernels through flash4::forward and flash4::backward, against the fp64 reference.
// 96: d = 128's forward and wgmma backward with matmuls 96 wide over rows padded to two 64-column chunks in
// shared memory (the backward's second dQ piece half zeros). 192: the forward's 128 x 112 tiles of three
// 64-column chunks and the role-split backward (bwd_wgmma_roles_kernel.cuh: 64-key tiles, a 3-stage Q / dO
// ring, dQ's three chunks split two and one between the warpgroups). Odd lengths, GQA / MQA, causal with
// seqlen_q < seqlen_k, window, softcap, the sink, strided tensors with NaN-poisoned padding after every row,
// bf16 and fp16; deterministic backward.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/attention_case.h"
#include "gpu_case_runs.h"

namespace flash4::test {
namespace {

constexpr int64_t kNativeHeadDims[] = {96, 192};

std::vector<CaseSpec> native_cases() {
  std::vector<CaseSpec> c;
  for (int64_t d : kNativeHeadDims) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      c.push_back(make_spec(1, 1, 1, 1, 1, d, dt));
      c.push_back(make_spec(2, 200, 333, 4, 2, d, dt));  // tails in Q and K/V tiles
      c.push_back(make_spec(1, 300, 300, 6, 2, d, dt, true));
      c.push_back(make_spec(2, 130, 700, 4, 1, d, dt, true));  // MQA, causal with seqlen_q < seqlen_k
      c.push_back(
          with(make_spec(1, 257, 190, 2, 1, d, dt), [](CaseSpec& s) { s.window_left = 40, s.window_right = 7; }));
      c.push_back(with(make_spec(1, 150, 260, 4, 4, d, dt), [](CaseSpec& s) { s.softcap = 15.0f; }));
      c.push_back(with(make_spec(2, 100, 100, 4, 2, d, dt, true), [](CaseSpec& s) { s.sink = true; }));
      c.push_back(with(make_spec(2, 97, 211, 4, 2, d, dt), [](CaseSpec& s) { s.layout = Layout::kStrided; }));
    }
    c.push_back(with(make_spec(1, 2048, 2048, 2, 1, d, DType::kBFloat16, true), [](CaseSpec& s) {
      s.checked_rows = 64;  // ring laps and persistent tiles; sampled rows (the reference is the slow part)
    }));
  }
  return c;
}

class NativeHeadDims : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(NativeHeadDims, ForwardMatchesReference) {
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU";
  run_and_check_forward(GetParam());
}

// Q-tile counts that end the 192 kernel's 3-stage ring on each of its stages; seqlen_k <= 64 has one key tile
// (no mma.sync kernel at 96 or 192).
TEST_P(NativeHeadDims, BackwardMatchesReference) {
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU";
  run_and_check_backward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, NativeHeadDims, ::testing::ValuesIn(native_cases()),
                         [](const auto& info) { return info.param.name(); });

// The backward's short cases: one key tile, a single query, and seqlen_k <= 64 in deterministic mode.
TEST(NativeHeadDimsBackward, ShortKeysAndDeterminism) {
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU";
  for (int64_t d : kNativeHeadDims) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      run_and_check_backward(make_spec(1, 1, 17, 2, 2, d, dt));
      run_and_check_backward(make_spec(2, 65, 40, 4, 2, d, dt, true));
      run_and_check_backward(make_spec(1, 193, 64, 3, 1, d, dt));
    }
    for (bool causal : {false, true}) {
      check_deterministic_backward(make_spec(1, 330, 270, 4, 2, d, DType::kBFloat16, causal), 4);
      check_deterministic_backward(make_spec(2, 40, 50, 2, 1, d, DType::kFloat16, causal), 3);
    }
  }
}

}  // namespace
}  // namespace flash4::test
