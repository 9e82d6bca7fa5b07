// Hopper backward kernels vs the fp64 reference, with the tolerance rule of src/check/tolerance.h. Inputs are
// fresh random values every run (seed printed on failure); out and LSE come from the fp64 reference forward
// (rounded to the dtype / fp32) so the backward is tested on its own; dq, dk, dv are NaN-poisoned before each
// launch (padding included, so writes outside the tensor or missing writes show up).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"
#include "flash4/api.h"
#include "gpu_case_runs.h"

namespace flash4::test {
namespace {

bool gpu_present() { return cuda_available(0); }

#define FLASH4_REQUIRE_GPU() \
  if (!gpu_present()) GTEST_SKIP() << "no sm_90 GPU"

struct Shape {
  int64_t b, sq, sk, h, hkv, d;
};

// Small and odd shapes: one query, one key (every row but the last fully masked under causal), tails on both
// sides of a 64-row tile, GQA 4:1 and MHA. Kernel selection (bwd_params_builder.cu, use_wgmma_kernel):
// seqlen_k <= 64 runs the mma.sync kernel, seqlen_k > 64 (contiguous or TMA-describable layouts) the wgmma
// kernel, so this list covers both: {1, 17}, {17, 1} mma.sync; the others wgmma.
const Shape kSmallShapes[] = {
    {1, 128, 128, 4, 4, 64}, {1, 1, 17, 2, 2, 64}, {1, 17, 1, 2, 2, 128}, {2, 257, 129, 8, 2, 64},
    {1, 65, 200, 2, 1, 128},
};

using MaskDtype = std::tuple<bool, DType>;  // (causal, dtype)

std::string mask_dtype_name(const ::testing::TestParamInfo<MaskDtype>& info) {
  return std::string(std::get<0>(info.param) ? "causal" : "full") +
         (std::get<1>(info.param) == DType::kBFloat16 ? "_bf16" : "_fp16");
}

template <size_t kN>
void run_shapes(const Shape (&shapes)[kN], MaskDtype mask_dtype) {
  const auto [causal, dtype] = mask_dtype;
  for (const Shape& s : shapes) run_and_check_backward(make_spec(s.b, s.sq, s.sk, s.h, s.hkv, s.d, dtype, causal));
}

class BackwardShapes : public ::testing::TestWithParam<MaskDtype> {};

TEST_P(BackwardShapes, MatchesReference) {
  FLASH4_REQUIRE_GPU();
  run_shapes(kSmallShapes, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Gpu, BackwardShapes,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         mask_dtype_name);

// The wgmma kernel (seqlen_k > 64) on shapes that stress its tiling: 128-key CTAs with a key tail inside the
// second consumer warpgroup (sk = 100, 190) or exactly one warpgroup (sk = 65), Q tiles of 64 (d = 128) or 128
// (d = 64) rows with tails, seqlen_q = 1, several Q tiles per CTA and several CTAs per dQ row (dQ atomics from
// both warpgroups), GQA 2:1 and MQA, and seqlen_q > seqlen_k / seqlen_q < seqlen_k under causal (bottom-right).
// {1, 1000, 777, 2, 1, 128}: 7 CTAs per head whose Q loops start at different tiles and wrap (the non-causal
// rotation of bwd_wgmma_kernel.cuh), the last Q tile cut at row 1000.
// Also the mma.sync kernel on the same head dims with seqlen_k <= 64.
const Shape kWgmmaShapes[] = {
    {1, 64, 65, 2, 2, 128},   {1, 1, 300, 2, 1, 64},    {1, 130, 100, 2, 2, 64},  {2, 200, 190, 4, 2, 128},
    {1, 383, 257, 3, 1, 128}, {1, 257, 520, 2, 2, 64},  {1, 600, 128, 2, 1, 128}, {1, 129, 40, 2, 1, 128},
    {1, 1000, 777, 2, 1, 128},
};

class BackwardWgmmaShapes : public ::testing::TestWithParam<MaskDtype> {};

TEST_P(BackwardWgmmaShapes, MatchesReference) {
  FLASH4_REQUIRE_GPU();
  run_shapes(kWgmmaShapes, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Gpu, BackwardWgmmaShapes,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         mask_dtype_name);

// head_dim 256 (the d = 256 wgmma kernel for these contiguous tensors: 64-key CTAs whose two warpgroups split the
// output columns; the mma.sync kernel's column halves only run for layouts TMA cannot describe): one query, one key, tails on both sides of a 64-row tile (129), seqlen_q > seqlen_k and seqlen_q < seqlen_k
// under causal (bottom-right), GQA 4:1 and 2:1 with batch 2, several K/V tiles adding into the same dQ rows.
const Shape kHd256Shapes[] = {
    {1, 1, 17, 2, 2, 256},  {1, 17, 1, 2, 2, 256},  {1, 129, 129, 4, 1, 256},
    {2, 65, 200, 4, 2, 256}, {1, 300, 77, 2, 2, 256},
};

class BackwardHd256Shapes : public ::testing::TestWithParam<MaskDtype> {};

TEST_P(BackwardHd256Shapes, MatchesReference) {
  FLASH4_REQUIRE_GPU();
  run_shapes(kHd256Shapes, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Gpu, BackwardHd256Shapes,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         mask_dtype_name);

// The long ragged MQA shape: many K/V tiles contend for the same dQ rows. One dtype per mask to bound the
// fp64 reference's CPU time.
TEST(Backward, LongRaggedMqa) {
  FLASH4_REQUIRE_GPU();
  run_and_check_backward(make_spec(2, 1000, 1013, 4, 1, 128, DType::kBFloat16, false));
  run_and_check_backward(make_spec(2, 1000, 1013, 4, 1, 128, DType::kFloat16, true));
}

// GQA groups split across work items (bwd_item_plan.h, bwd_group_parts): with one or two kv heads and one or two
// sequences the (key tile, kv head, batch) items are far fewer than the SMs, so each item takes a part of its
// group's query heads and dK, dV are summed from fp32 partials (bwd_group_reduce.cuh). Every head dim's kernel,
// groups of 3 to 16, masks, softcap, the sink, the split head dims and the strided layout (the sum's output
// strides); the deterministic mode keeps whole groups and must still be bit-identical.
TEST(Backward, GroupSplitAcrossWorkItems) {
  FLASH4_REQUIRE_GPU();
  run_and_check_backward(make_spec(1, 700, 700, 16, 1, 128, DType::kBFloat16, true));
  run_and_check_backward(make_spec(1, 900, 1000, 12, 1, 64, DType::kFloat16, false));
  run_and_check_backward(make_spec(2, 513, 513, 6, 2, 96, DType::kBFloat16, true));
  run_and_check_backward(make_spec(1, 300, 333, 9, 3, 192, DType::kBFloat16, true));
  run_and_check_backward(with(make_spec(2, 257, 300, 8, 2, 256, DType::kFloat16, false), [](CaseSpec& s) {
    s.window_left = 40;
    s.window_right = 3;
  }));
  run_and_check_backward(with(make_spec(1, 400, 400, 8, 1, 192, DType::kBFloat16, true),
                              [](CaseSpec& s) { s.head_dim_v = 128; }));
  run_and_check_backward(with(make_spec(1, 401, 401, 8, 1, 128, DType::kBFloat16, true), [](CaseSpec& s) {
    s.softcap = 20.0f;
    s.input_stddev = 3.0;
    s.sink = true;
  }));
  run_and_check_backward(with(make_spec(2, 333, 290, 8, 2, 128, DType::kFloat16, false),
                              [](CaseSpec& s) { s.layout = Layout::kStrided; }));
  check_deterministic_backward(make_spec(1, 700, 700, 16, 1, 128, DType::kBFloat16, true), 2);
}

TEST(Backward, SlidingWindow) {
  FLASH4_REQUIRE_GPU();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    CaseSpec s = make_spec(2, 257, 129, 8, 2, 64, dtype, false);
    s.window_left = 32;
    s.window_right = 0;
    run_and_check_backward(s);
    s = make_spec(1, 300, 300, 4, 2, 128, dtype, true);
    s.window_left = 32;
    run_and_check_backward(s);
    s = make_spec(1, 200, 333, 2, 2, 64, dtype, false);  // two-sided window, ragged
    s.window_left = 70;
    s.window_right = 5;
    run_and_check_backward(s);
    s = make_spec(1, 190, 250, 2, 1, 256, dtype, true);  // d = 256: a 41-key band, few Q tiles per K/V tile
    s.window_left = 40;
    run_and_check_backward(s);
  }
}

// Outside deterministic mode the d = 64 / 128 kernel runs one persistent CTA per SM where bwd_persistent_pays (d = 64
// always, d = 128 for short items), each claiming work items from a counter (bwd_schedule.h). The shapes above have
// fewer items than an H200 has SMs; these have more (192, 400, 384 items), so CTAs carry the Q ring, the dS / dQ buffers and the K, V barriers from item to item: GQA 3:1 causal,
// a two-sided window under which key tile 0 is invisible (items without Q tiles between items with them), and
// softcap.
TEST(Backward, PersistentCtasRunManyItems) {
  FLASH4_REQUIRE_GPU();
  run_and_check_backward(make_spec(4, 300, 300, 48, 16, 128, DType::kBFloat16, true));
  CaseSpec s = make_spec(2, 257, 520, 40, 40, 64, DType::kFloat16, false);
  s.window_left = 70;
  s.window_right = 5;
  run_and_check_backward(s);
  s = make_spec(2, 200, 300, 64, 64, 64, DType::kBFloat16, true);
  s.softcap = 30.0f;
  s.input_stddev = 3.0;
  run_and_check_backward(s);
}

TEST(Backward, Softcap) {
  FLASH4_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    CaseSpec s = make_spec(2, 257, 129, 8, 2, 64, causal ? DType::kFloat16 : DType::kBFloat16, causal);
    s.softcap = 30.0f;
    s.input_stddev = 3.0;  // scores large enough that the cap bends them
    run_and_check_backward(s);
    s = make_spec(1, 190, 190, 2, 1, 128, DType::kBFloat16, causal);
    s.softcap = 30.0f;
    s.input_stddev = 3.0;
    run_and_check_backward(s);
    s = make_spec(1, 100, 130, 2, 2, 256, DType::kFloat16, causal);
    s.softcap = 30.0f;
    s.input_stddev = 3.0;
    run_and_check_backward(s);
  }
}

// head_dim 256 on the mma.sync kernel's column halves: batch 1 and MQA with stride 1 on those extent-1
// dimensions, which the GPU accepts and TMA cannot describe (contiguous d = 256 runs the wgmma kernel).
TEST(Backward, Hd256MmaSyncColumnHalves) {
  FLASH4_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    CaseSpec s = make_spec(1, 200, 170, 4, 1, 256, DType::kBFloat16, causal);
    s.layout = Layout::kUnitDimStride1;
    run_and_check_backward(s);
  }
}

TEST(Backward, StridedLayoutAndScale) {
  FLASH4_REQUIRE_GPU();
  CaseSpec s = make_spec(2, 150, 211, 4, 2, 128, DType::kBFloat16, true);
  s.layout = Layout::kStrided;
  s.softmax_scale = 0.05f;
  run_and_check_backward(s);
  s = make_spec(2, 257, 129, 8, 2, 64, DType::kFloat16, false);
  s.layout = Layout::kStrided;
  run_and_check_backward(s);
  s = make_spec(2, 100, 150, 4, 2, 256, DType::kBFloat16, true);  // column halves at strided row starts
  s.layout = Layout::kStrided;
  run_and_check_backward(s);
}

// k and v broadcast over the batch and the kv heads (stride 0, as torch's expand makes; TMA cannot describe them,
// so the backward takes its other path), every head dim.
TEST(Backward, BroadcastKeysAndValues) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256}) {
    run_and_check_backward(with(make_spec(3, 130, 150, 4, 2, d, DType::kBFloat16, d != 128), [](CaseSpec& s) {
      s.broadcast_kv = true;
    }));
  }
}

// deterministic = true: ten runs give bit-identical dq, dk, dv (and pass the tolerance rule).
TEST(Backward, DeterministicIsBitIdentical) {
  FLASH4_REQUIRE_GPU();
  // (700, 650, d 64) and (300, 400, d 128) run the wgmma kernel, (150, 60, d 128) the mma.sync kernel, and
  // (330, 270, d 256) the d = 256 wgmma kernel (5 K/V tiles per dQ row, both warpgroups on one semaphore).
  const Shape shapes[] = {
      {2, 700, 650, 4, 2, 64}, {1, 300, 400, 4, 1, 128}, {1, 150, 60, 2, 2, 128}, {2, 330, 270, 4, 2, 256}};
  for (int c = 0; c < 2 * static_cast<int>(std::size(shapes)); ++c) {
    const Shape& shape = shapes[c / 2];
    check_deterministic_backward(
        make_spec(shape.b, shape.sq, shape.sk, shape.h, shape.hkv, shape.d, DType::kBFloat16, c % 2 == 1), 10);
  }
}

// Deterministic mode at a scale where the grid spans several waves of CTAs (the shapes above fit in one; a
// deadlock between waves hung the d = 256 kernel only at bench size): two runs bit-identical, and every gradient
// within one bf16 rounding of the non-deterministic result (the two differ only in the fp32 order of the dQ and
// dK / dV sums). No fp64 reference at this size: out and LSE come from the GPU forward.
TEST(Backward, DeterministicAcrossWaves) {
  FLASH4_REQUIRE_GPU();
  // CTAs: 1024 (d 64), 256 (d 128, GQA 4:1), 512 (d 256, 64-key tiles); 132 fit in one wave on an H200.
  const Shape shapes[] = {{2, 4096, 4096, 16, 16, 64}, {2, 4096, 4096, 16, 4, 128}, {2, 2048, 2048, 8, 8, 256}};
  for (int c = 0; c < 2 * static_cast<int>(std::size(shapes)); ++c) {
    const Shape& shape = shapes[c / 2];
    const CaseSpec spec =
        make_spec(shape.b, shape.sq, shape.sk, shape.h, shape.hkv, shape.d, DType::kBFloat16, c % 2 == 1);
    SCOPED_TRACE(spec.name());
    FLASH4_TEST_RNG(rng);
    AttentionTensors t = make_tensors(spec, rng, /*backward=*/true);
    DeviceCase dev(t);
    ASSERT_TRUE(dev.ok());
    ForwardArgs fwd = t.forward_args(spec);
    fwd.q = dev.q.view();
    fwd.k = dev.k.view();
    fwd.v = dev.v.view();
    fwd.out = dev.out.view();
    fwd.lse = dev.lse.view();
    ASSERT_TRUE(can_implement(fwd).ok);
    forward(fwd);
    BackwardArgs args = dev.args(spec, t);
    ASSERT_TRUE(can_implement(args).ok) << can_implement(args).reason;
    // Runs the backward and returns dq, dk, dv as fp64 values plus their raw bytes.
    auto run = [&](bool deterministic, std::vector<std::vector<double>>& values, std::vector<std::vector<char>>& bytes) {
      args.deterministic = deterministic;
      backward(args);
      FLASH4_TEST_CUDA(cudaDeviceSynchronize());
      values.clear();
      bytes.clear();
      for (auto [mirror, host] : {std::pair{&dev.dq, &*t.dq}, std::pair{&dev.dk, &*t.dk}, std::pair{&dev.dv, &*t.dv}}) {
        FLASH4_TEST_CUDA(mirror->download());
        values.push_back(host->to_double());
        const char* raw = static_cast<const char*>(host->data());
        bytes.emplace_back(raw, raw + host->storage_bytes());
      }
    };
    std::vector<std::vector<double>> free_values, det_values, det2_values;
    std::vector<std::vector<char>> free_bytes, det_bytes, det2_bytes;
    run(false, free_values, free_bytes);
    run(true, det_values, det_bytes);
    run(true, det2_values, det2_bytes);
    const char* names[] = {"dq", "dk", "dv"};
    for (int g = 0; g < 3; ++g) {
      EXPECT_EQ(det_bytes[g], det2_bytes[g]) << names[g] << " differs between two deterministic runs";
      const double scale = max_abs(free_values[g]);
      ASSERT_GT(scale, 0.0) << names[g] << " is all zero";
      double worst = 0.0;  // largest difference in units of the allowed one
      for (size_t i = 0; i < free_values[g].size(); ++i) {
        const double a = free_values[g][i], b = det_values[g][i];
        const double allowed = 0x1p-7 * std::max(std::abs(a), std::abs(b)) + 0x1p-16 * scale;
        worst = std::max(worst, std::isfinite(a) && std::isfinite(b) ? std::abs(a - b) / allowed : HUGE_VAL);
      }
      EXPECT_LE(worst, 1.0) << names[g] << ": deterministic vs non-deterministic beyond one bf16 rounding";
    }
  }
}

// can_implement names what the GPU backward does not run. The views point at fake device addresses: nothing
// is launched and nothing is dereferenced.
TEST(Backward, RefusesUnsupportedWithReason) {
  FLASH4_REQUIRE_GPU();
  auto view = [](uintptr_t address, DType dtype, int64_t s, int64_t h, int64_t d) {
    return make_view(reinterpret_cast<void*>(address), dtype, Device::cuda(0), 1, s, h, d);
  };
  auto args_for = [&](DType dtype, int64_t d) {
    BackwardArgs a;
    uintptr_t base = uintptr_t{1} << 40;
    const uintptr_t step = uintptr_t{1} << 30;
    a.q = view(base += step, dtype, 64, 2, d);
    a.k = view(base += step, dtype, 64, 2, d);
    a.v = view(base += step, dtype, 64, 2, d);
    a.out = view(base += step, dtype, 64, 2, d);
    a.dout = view(base += step, dtype, 64, 2, d);
    a.dq = view(base += step, dtype, 64, 2, d);
    a.dk = view(base += step, dtype, 64, 2, d);
    a.dv = view(base += step, dtype, 64, 2, d);
    a.lse = make_view(reinterpret_cast<void*>(base += step), DType::kFloat32, Device::cuda(0), 1, 2, 64);
    return a;
  };
  const Support fp32 = can_implement(args_for(DType::kFloat32, 64));
  EXPECT_FALSE(fp32.ok);
  EXPECT_NE(fp32.reason.find("fp32"), std::string::npos) << fp32.reason;
  EXPECT_TRUE(can_implement(args_for(DType::kBFloat16, 80)).ok);  // zero-padded on the 128 kernel
  EXPECT_TRUE(can_implement(args_for(DType::kBFloat16, 128)).ok);
  EXPECT_TRUE(can_implement(args_for(DType::kFloat16, 256)).ok);
  BackwardArgs misaligned = args_for(DType::kFloat16, 64);
  misaligned.q.data = static_cast<char*>(misaligned.q.data) + 2;
  const Support mis = can_implement(misaligned);
  EXPECT_FALSE(mis.ok);
  EXPECT_NE(mis.reason.find("aligned"), std::string::npos) << mis.reason;
}

}  // namespace
}  // namespace flash4::test
