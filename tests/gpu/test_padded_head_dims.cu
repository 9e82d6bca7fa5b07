// Head dims 96 and 192 and split head dims ((192, 128), (128, 64)) on the GPU, forward and backward, against the
// fp64 reference. 96 and 192 run on their own kernels (the 96 ones with half of their second panel zero-filled),
// the (192, 128) forward on its own kernel, the other splits zero-padded on the 128 and 192 kernels
// (src/kernels/sm90/head_dims.h): the TMA maps keep the true widths, so these tests also check that nothing is
// read or written past a row: the strided cases keep 8 elements of NaN-poisoned padding after every row, which
// must stay untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common/attention_case.h"
#include "flash4/api.h"
#include "gpu_case_runs.h"

namespace flash4::test {
namespace {

#define FLASH4_REQUIRE_GPU() \
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU"

struct HeadDims {
  int64_t d, dv;
};
const HeadDims kPaddedHeadDims[] = {{96, 96}, {192, 192}, {192, 128}, {128, 64}};

// The case at these sizes and head dims; long sequences check sampled rows (the fp64 reference is the slow part).
CaseSpec padded_case(int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hkv, HeadDims hd, DType dtype,
                     bool causal) {
  CaseSpec s = make_spec(b, sq, sk, h, hkv, hd.d, dtype, causal);
  s.head_dim_v = hd.dv;
  s.checked_rows = sq > 512 ? 64 : 0;
  return s;
}

// A build whose FLASH4_HEAD_DIMS leaves out the kernel a pair runs on (e.g. the dev preset: 128 only) refuses it
// with "not compiled"; those cases are skipped rather than failed.
bool compiled_for(const CaseSpec& spec) {
  const Device gpu = Device::cuda(0);
  ForwardArgs a;
  a.q = make_view(nullptr, spec.dtype, gpu, 1, 1, spec.heads, spec.head_dim);
  a.k = make_view(nullptr, spec.dtype, gpu, 1, 1, spec.heads_kv, spec.head_dim);
  a.v = make_view(nullptr, spec.dtype, gpu, 1, 1, spec.heads_kv, spec.value_dim());
  a.out = make_view(nullptr, spec.dtype, gpu, 1, 1, spec.heads, spec.value_dim());
  const Support s = can_implement(a, Validation::kWithoutBuffers);
  return s.ok || s.reason.find("not compiled") == std::string::npos;
}

using Param = std::tuple<int, bool, DType>;  // (index into kPaddedHeadDims, causal, dtype)

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const HeadDims hd = kPaddedHeadDims[std::get<0>(info.param)];
  return "d" + std::to_string(hd.d) + (hd.dv != hd.d ? "_dv" + std::to_string(hd.dv) : "") +
         (std::get<1>(info.param) ? "_causal" : "") + (std::get<2>(info.param) == DType::kBFloat16 ? "_bf16" : "_fp16");
}

class PaddedHeadDims : public ::testing::TestWithParam<Param> {
 protected:
  CaseSpec spec(int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hkv) const {
    const auto [i, causal, dtype] = GetParam();
    return padded_case(b, sq, sk, h, hkv, kPaddedHeadDims[i], dtype, causal);
  }
};

// Lengths 1, 17, 1000 and 4097, ragged both ways, GQA 4:1 and MQA, more tiles than SMs.
TEST_P(PaddedHeadDims, ForwardMatchesReference) {
  FLASH4_REQUIRE_GPU();
  if (!compiled_for(spec(1, 1, 1, 1, 1))) GTEST_SKIP() << "kernel width not compiled in this build";
  for (const CaseSpec& s : {spec(1, 1, 1, 1, 1), spec(1, 17, 17, 2, 2), spec(2, 127, 300, 4, 1),
                            spec(2, 300, 127, 4, 2), spec(1, 1000, 1000, 2, 1), spec(1, 4097, 4097, 1, 1),
                            spec(2, 700, 600, 16, 4)})
    run_and_check_forward(s);
}

// The Q-tile and key-tile edges of the padded kernels: one query, one key, seqlen_k <= 64 (on the d = 128
// kernel these run the wgmma kernel too: there is no mma.sync fallback for padded head dims), key tails inside
// either consumer warpgroup, GQA, several K/V tiles adding into the same dQ rows.
TEST_P(PaddedHeadDims, BackwardMatchesReference) {
  FLASH4_REQUIRE_GPU();
  if (!compiled_for(spec(1, 1, 1, 1, 1))) GTEST_SKIP() << "kernel width not compiled in this build";
  for (const CaseSpec& s : {spec(1, 1, 17, 2, 2), spec(1, 17, 1, 2, 2), spec(1, 40, 64, 2, 1),
                            spec(2, 129, 65, 4, 2), spec(1, 300, 190, 2, 1), spec(1, 200, 333, 3, 3)})
    run_and_check_backward(s);
}

INSTANTIATE_TEST_SUITE_P(Gpu, PaddedHeadDims,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kPaddedHeadDims))),
                                            ::testing::Bool(),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         param_name);

// Window, softcap, the learnable sink, and a long MQA backward, once per head-dim pair.
TEST(PaddedHeadDimsFeatures, WindowSoftcapSinkAndLongBackward) {
  FLASH4_REQUIRE_GPU();
  for (const HeadDims hd : kPaddedHeadDims) {
    if (!compiled_for(padded_case(1, 1, 1, 1, 1, hd, DType::kBFloat16, false))) continue;
    CaseSpec win = padded_case(2, 300, 400, 4, 2, hd, DType::kBFloat16, false);
    win.window_left = 70;
    win.window_right = 5;
    run_and_check_forward(win);
    run_and_check_backward(win);
    CaseSpec cap = padded_case(1, 257, 190, 2, 2, hd, DType::kFloat16, true);
    cap.softcap = 20.0f;
    cap.input_stddev = 3.0;
    run_and_check_forward(cap);
    run_and_check_backward(cap);
    CaseSpec sink = padded_case(1, 150, 150, 2, 1, hd, DType::kBFloat16, false);
    sink.sink = true;
    run_and_check_forward(sink);
    run_and_check_backward(sink);
    run_and_check_backward(padded_case(1, 1000, 1000, 2, 1, hd, DType::kBFloat16, true));
  }
}

// Deterministic mode: bit-identical gradients run to run (the d = 96 kernel's skipped dQ half, the d = 192
// kernel's dQ chunks split between its warpgroups, the (192, 128) kernels' narrower V and dO tiles).
TEST(PaddedHeadDimsFeatures, DeterministicIsBitIdentical) {
  FLASH4_REQUIRE_GPU();
  for (const HeadDims hd : kPaddedHeadDims) {
    for (bool causal : {false, true}) {
      const CaseSpec s = padded_case(1, 330, 270, 4, 2, hd, DType::kBFloat16, causal);
      if (compiled_for(s)) check_deterministic_backward(s, 4);
    }
  }
}

// Every storage byte of `after` that is not an element of its view (the row padding of Layout::kStrided) equals
// `before`'s: the kernels wrote nothing past a row.
::testing::AssertionResult padding_untouched(const std::vector<char>& before, HostTensor& after) {
  const TensorView& v = after.view();
  std::vector<bool> element(before.size(), false);
  const int64_t elem = dtype_size(v.dtype);
  for (int64_t b = 0; b < v.shape[0]; ++b)
    for (int64_t s = 0; s < v.shape[1]; ++s)
      for (int64_t h = 0; h < v.shape[2]; ++h)
        for (int64_t c = 0; c < v.shape[3]; ++c) {
          const int64_t at = (b * v.stride[0] + s * v.stride[1] + h * v.stride[2] + c * v.stride[3]) * elem;
          for (int64_t i = 0; i < elem; ++i) element[static_cast<size_t>(at + i)] = true;
        }
  const char* bytes = static_cast<const char*>(after.data());
  for (size_t i = 0; i < before.size(); ++i)
    if (!element[i] && bytes[i] != before[i])
      return ::testing::AssertionFailure() << "padding byte " << i << " was written";
  return ::testing::AssertionSuccess();
}

std::vector<char> bytes_of(HostTensor& t) {
  const char* p = static_cast<const char*>(t.data());
  return {p, p + t.storage_bytes()};
}

// Strided tensors (memory order (b, h, s, d + 8)): results within the tolerance rule, and the 8 poisoned
// elements after every row of out, dq, dk, dv still poisoned.
TEST(PaddedHeadDimsFeatures, StridedLayoutWritesNothingPastARow) {
  FLASH4_REQUIRE_GPU();
  for (const HeadDims hd : kPaddedHeadDims) {
    CaseSpec s = padded_case(2, 150, 211, 4, 2, hd, DType::kBFloat16, true);
    s.layout = Layout::kStrided;
    if (!compiled_for(s)) continue;
    SCOPED_TRACE(s.name());
    FLASH4_TEST_RNG(rng);
    AttentionTensors t = make_tensors(s, rng, /*backward=*/true);
    const std::vector<char> out_before = bytes_of(t.out);
    {
      DeviceMirror q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse);
      ASSERT_TRUE(q.ok() && k.ok() && v.ok() && out.ok() && lse.ok());
      ForwardArgs f = t.forward_args(s);
      f.q = q.view(), f.k = k.view(), f.v = v.view(), f.out = out.view(), f.lse = lse.view();
      forward(f);
      FLASH4_TEST_CUDA(cudaDeviceSynchronize());
      FLASH4_TEST_CUDA(out.download());
      FLASH4_TEST_CUDA(lse.download());
      EXPECT_TRUE(check_forward(s, t, rng));
      EXPECT_TRUE(padding_untouched(out_before, t.out));
    }
    reference_out_lse(s, t);
    const std::vector<char> dq_before = bytes_of(*t.dq), dk_before = bytes_of(*t.dk), dv_before = bytes_of(*t.dv);
    DeviceCase dev(t);
    ASSERT_TRUE(dev.ok());
    backward(dev.args(s, t));
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    FLASH4_TEST_CUDA(dev.download_gradients());
    EXPECT_TRUE(check_backward(s, t));
    EXPECT_TRUE(padding_untouched(dq_before, *t.dq));
    EXPECT_TRUE(padding_untouched(dk_before, *t.dk));
    EXPECT_TRUE(padding_untouched(dv_before, *t.dv));
  }
}

// The padded backward runs on the TMA kernel only: a layout TMA cannot describe (a size-1 dimension with stride
// 1) is refused with the reason, not run wrong. (The forward refuses it for every head dim.)
TEST(PaddedHeadDimsFeatures, BackwardRefusesLayoutsTmaCannotDescribe) {
  FLASH4_REQUIRE_GPU();
  CaseSpec s = padded_case(1, 100, 100, 2, 2, {96, 96}, DType::kBFloat16, false);
  s.layout = Layout::kUnitDimStride1;
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(s, rng, /*backward=*/true);
  DeviceCase dev(t);
  ASSERT_TRUE(dev.ok());
  const Support support = can_implement(dev.args(s, t));
  EXPECT_FALSE(support.ok);
  EXPECT_NE(support.reason.find("layouts TMA can describe"), std::string::npos) << support.reason;
}

}  // namespace
}  // namespace flash4::test
