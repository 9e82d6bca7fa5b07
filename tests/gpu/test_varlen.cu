// Packed (variable-length) batches and the learnable sink on the Hopper GPU, mirroring tests/cpu/test_varlen.cpp:
// forward (out, lse) and backward (dq, dk, dv, dsink) of every row against the fp64 reference with the tolerance rule;
// the issue's length list (0, 1, 17, 127, 128, 129, 1000, 4097), more than 65536 tokens, >= 1000 short segments, ragged
// q vs k, GQA 8:1, window, softcap, sink, seqused, rows in no segment, NaN in the rows no sequence uses (forward; keys: backward); a
// packed call equal to per-sequence dense calls bit for bit in deterministic mode; corrupt device offsets clamped (no
// access outside the tensors: guard rows stay poisoned; run under compute-sanitizer too). Outputs NaN-poisoned before
// launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"
#include "common/varlen_case.h"
#include "device_mirror.h"
#include "flash4/api.h"
#include "varlen_device.h"

namespace flash4::test {
namespace {

constexpr DType kF16 = DType::kFloat16, kBF16 = DType::kBFloat16;

// The cases every head dim and dtype runs (small enough for the fp64 reference on all rows).
std::vector<VarlenSpec> cases(int64_t d, DType t) {
  const std::vector<int> mixed = {0, 1, 17, 127, 128, 129, 3};
  const std::vector<int> ragged = {5, 0, 300, 127, 64, 200, 1};
  return {
      varlen(mixed, mixed, 2, 2, d, t),
      varlen(mixed, ragged, 8, 1, d, t, [](VarlenSpec& s) { s.causal = true; }),  // GQA 8:1, bottom-right
      varlen(mixed, ragged, 4, 2, d, t, [](VarlenSpec& s) { s.sink = true; }),
      varlen({300, 9, 77}, {260, 90, 2}, 4, 2, d, t, [](VarlenSpec& s) { s.window_left = 40, s.window_right = 7; }),
      varlen({100, 40}, {60, 140}, 2, 2, d, t, [](VarlenSpec& s) { s.causal = true, s.window_left = 15, s.sink = true; }),
      varlen({90, 31, 1}, {120, 31, 64}, 2, 1, d, t, [](VarlenSpec& s) {
        s.softcap = 10.0f, s.input_stddev = 3.0, s.sink = true, s.causal = true;
      }),
      varlen({150, 7, 66}, {180, 7, 66}, 2, 1, d, t, [](VarlenSpec& s) {
        s.seqused_q = {70, 7, 0}, s.seqused_k = {180, 3, 10}, s.causal = true;
      }),
      varlen({40, 130}, {25, 170}, 4, 2, d, t, [](VarlenSpec& s) { s.pad_q = 9, s.pad_k = 70, s.sink = true; }),
      varlen({130, 65}, {130, 65}, 2, 1, d, t, [](VarlenSpec& s) { s.sink = true, s.sink_offset = 6.0; }),
  };
}

class VarlenGpu : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(VarlenGpu, ForwardMatchesReference) {
  FLASH4_REQUIRE_GPU();
  for (const VarlenSpec& s : cases(std::get<0>(GetParam()), std::get<1>(GetParam()))) run_forward(s);
}

TEST_P(VarlenGpu, BackwardMatchesReference) {
  FLASH4_REQUIRE_GPU();
  for (const VarlenSpec& s : cases(std::get<0>(GetParam()), std::get<1>(GetParam()))) run_backward(s);
}

std::string head_dim_dtype_name(const ::testing::TestParamInfo<std::tuple<int, DType>>& info) {
  return "d" + std::to_string(std::get<0>(info.param)) + (std::get<1>(info.param) == kBF16 ? "_bf16" : "_fp16");
}

INSTANTIATE_TEST_SUITE_P(Gpu, VarlenGpu,
                         ::testing::Combine(::testing::Values(64, 128, 256), ::testing::Values(kBF16, kF16)),
                         head_dim_dtype_name);
// Head dim 96 runs zero-padded on the 128 kernels, 192 on its own (src/kernels/sm90/head_dims.h); one dtype each.
INSTANTIATE_TEST_SUITE_P(PaddedHeadDims, VarlenGpu,
                         ::testing::Values(std::tuple<int, DType>{96, kBF16}, std::tuple<int, DType>{192, kF16}),
                         head_dim_dtype_name);

// v's head dim 128 with q and k's 192 (DeepSeek's split, on the 192 kernels with v's panels zero-padded): the same
// cases.
TEST(VarlenGpuSplitHeadDims, ForwardAndBackwardMatchReference) {
  FLASH4_REQUIRE_GPU();
  for (VarlenSpec s : cases(192, kBF16)) {
    s.head_dim_v = 128;
    run_forward(s);
    run_backward(s);
  }
}

// The issue's lengths (1000 and 4097 included) and more than 65536 tokens in total (one head, head dim 64, so
// the fp64 reference of every row stays within seconds).
TEST(VarlenGpuLarge, LongMixedLengths) {
  FLASH4_REQUIRE_GPU();
  std::vector<int> lengths = {0, 1, 17, 127, 128, 129, 1000, 4097};
  for (int i = 0; i < 64; ++i) lengths.push_back(1000 + 7 * i);  // 70k+ tokens in total
  std::vector<int> keys = lengths;
  for (size_t i = 0; i < keys.size(); i += 3) keys[i] = keys[i] / 2 + 1;  // ragged q vs k
  const VarlenSpec s = varlen(lengths, keys, 1, 1, 64, kBF16, [](VarlenSpec& x) { x.causal = true, x.sink = true; });
  ASSERT_GT(s.total_q(), 65536);
  run_forward(s);
  run_backward(s);
}

// Rows no sequence uses may hold any bits (a buffer larger than its sequences, never written): NaN in keys and
// values past seqused_k or after the last segment, and in queries past seqused_q, must not reach the forward's
// outputs (its last key tile of a sequence reads those key rows; its last query tile those query rows).
TEST(VarlenGpuUnusedRows, NanRowsDoNotReachTheForward) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256}) {
    run_forward(varlen({150, 7, 66}, {180, 7, 66}, 2, 1, d, kBF16, [](VarlenSpec& s) {
      s.seqused_q = {70, 5, 0}, s.seqused_k = {131, 3, 10}, s.pad_q = 5, s.pad_k = 6, s.causal = true;
      s.nan_unused_keys = s.nan_unused_queries = true;
    }));
  }
  // A batch of no sequence (cu_seqlens = [0]) over tensors with rows: every row is in none (out 0, lse -inf, zero
  // gradients), with a sink too (the forward returns before any kernel's grid would be empty).
  const VarlenSpec none = varlen({}, {}, 4, 2, 128, kBF16, [](VarlenSpec& s) {
    s.pad_q = 5, s.pad_k = 7, s.sink = true, s.nan_unused_keys = s.nan_unused_queries = true;
  });
  run_forward(none);
  run_backward(none);
}

// The backward's last key tile of a sequence reads key rows no sequence uses (past seqused_k, after the last
// segment) and zeroes them in shared memory: NaN there must not reach the gradients. Every head dim's kernel,
// key counts that leave each warpgroup's half of the tile partly used, wholly used and unused.
TEST(VarlenGpuUnusedRows, NanKeysDoNotReachTheBackward) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 96, 128, 192, 256}) {
    for (bool deterministic : {false, true}) {
      run_backward(varlen({150, 7, 66, 40}, {180, 70, 66, 200}, 4, 2, d, kBF16, [&](VarlenSpec& s) {
        s.seqused_k = {131, 3, 64, 190}, s.pad_k = 6, s.causal = d != 128, s.sink = d == 64;
        s.deterministic = deterministic, s.nan_unused_keys = true;
      }));
    }
  }
}

// The backward's last Q tile of a sequence reads query and output-gradient rows of the next sequence or of none
// (past seqused_q, after the last segment) and zeroes them in shared memory: NaN there must not reach dK, dV
// (P = dS = 0 for those rows, but 0 * NaN is NaN in the matmuls) nor dQ. Every head dim's kernel; used counts
// that end inside a tile, on its last row, and at 0; both summation modes.
TEST(VarlenGpuUnusedRows, NanQueriesDoNotReachTheBackward) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 96, 128, 192, 256}) {
    for (bool deterministic : {false, true}) {
      run_backward(varlen({150, 7, 66, 200}, {180, 70, 66, 130}, 4, 2, d, kBF16, [&](VarlenSpec& s) {
        s.seqused_q = {131, 3, 64, 0}, s.pad_q = 9, s.causal = d != 128, s.sink = d == 64;
        s.deterministic = deterministic, s.nan_unused_queries = true;
      }));
    }
  }
  // A dense-layout packed batch without seqused: only the rows after the last segment are unused.
  run_backward(varlen({100, 37}, {100, 37}, 4, 4, 128, kF16, [](VarlenSpec& s) {
    s.pad_q = 40, s.nan_unused_queries = true;
  }));
}

// At least 1000 short segments (1..64 tokens).
TEST(VarlenGpuLarge, ManyShortSegments) {
  FLASH4_REQUIRE_GPU();
  VarlenSpec s = varlen({}, {}, 4, 2, 64, kBF16, [](VarlenSpec& x) { x.causal = true; });
  for (int b = 0; b < 1200; ++b) {
    s.seqlens_q.push_back(1 + (b * 37) % 64);
    s.seqlens_k.push_back(1 + (b * 53) % 64);
  }
  run_forward(s);
  run_backward(s);
}

// Deterministic mode: a packed call equals the per-sequence dense calls bit for bit (out, dq, dk, dv). Every
// segment has more than 16 queries: a dense call with fewer runs the split-KV decode kernel (another summation
// order), which the KV-cache tests judge.
TEST(VarlenGpuDeterminism, EqualsPerSequenceDenseCalls) {
  FLASH4_REQUIRE_GPU();
  const VarlenSpec s = varlen({300, 17, 129, 64}, {350, 33, 129, 700}, 4, 2, 128, kBF16, [](VarlenSpec& x) {
    x.causal = true, x.deterministic = true, x.sink = true;
  });
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  DeviceVarlen dev(t);
  ASSERT_TRUE(dev.ok());
  const ForwardArgs fa = dev.forward_args(s, t);
  ASSERT_TRUE(can_implement(fa).ok) << can_implement(fa).reason;
  forward(fa);
  backward(dev.backward_args(s, t));
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  for (HostTensor* h : {&t.out, &*t.dq, &*t.dk}) FLASH4_TEST_CUDA(dev.download(*h));
  const std::vector<uint16_t> out = t.out.bits16(), dq = t.dq->bits16(), dk = t.dk->bits16();
  const int64_t d = s.head_dim;
  int64_t q0 = 0, k0 = 0;
  for (int64_t b = 0; b < s.batch(); ++b) {
    const int64_t sq = s.seqlens_q[b], sk = s.seqlens_k[b];
    VarlenSpec one = s;
    one.seqlens_q = {static_cast<int>(sq)};
    one.seqlens_k = {static_cast<int>(sk)};
    VarlenTensors u = make_varlen_tensors(one, rng, true);  // same packed layout, one sequence, this one's data
    auto copy_rows = [&](const HostTensor& from, HostTensor& to, int64_t row0, int64_t rows, int64_t heads) {
      std::memcpy(to.data(), static_cast<const char*>(from.view().data) + row0 * heads * d * 2, rows * heads * d * 2);
    };
    copy_rows(t.q, u.q, q0, sq, s.heads);
    copy_rows(t.k, u.k, k0, sk, s.heads_kv);
    copy_rows(t.v, u.v, k0, sk, s.heads_kv);
    copy_rows(*t.dout, *u.dout, q0, sq, s.heads);
    std::memcpy(u.sink->data(), t.sink->data(), s.heads * 4);
    // A dense batch of one over the same memory: (1, seqlen, heads, d).
    DeviceVarlen udev(u);
    ASSERT_TRUE(udev.ok());
    auto dense = [&](const HostTensor& h, int64_t rows, int64_t heads) {
      TensorView v = udev.view(h);
      return make_view(v.data, v.dtype, v.device, 1, rows, heads, d);
    };
    ForwardArgs f;
    f.q = dense(u.q, sq, s.heads), f.k = dense(u.k, sk, s.heads_kv), f.v = dense(u.v, sk, s.heads_kv);
    f.out = dense(u.out, sq, s.heads);
    TensorView lse = udev.view(u.lse);
    f.lse = make_view(lse.data, DType::kFloat32, lse.device, 1, s.heads, sq);
    f.causal = true;
    f.learnable_sink = udev.view(*u.sink);
    forward(f);
    BackwardArgs g;
    g.q = f.q, g.k = f.k, g.v = f.v, g.out = f.out, g.lse = f.lse, g.causal = true, g.deterministic = true;
    g.dout = dense(*u.dout, sq, s.heads), g.dq = dense(*u.dq, sq, s.heads);
    g.dk = dense(*u.dk, sk, s.heads_kv), g.dv = dense(*u.dv, sk, s.heads_kv);
    g.learnable_sink = f.learnable_sink;
    backward(g);
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    for (HostTensor* h : {&u.out, &*u.dq, &*u.dk}) FLASH4_TEST_CUDA(udev.download(*h));
    const std::vector<uint16_t> uo = u.out.bits16(), udq = u.dq->bits16(), udk = u.dk->bits16();
    for (size_t i = 0; i < uo.size(); ++i) ASSERT_EQ(uo[i], out[q0 * s.heads * d + i]) << "out, segment " << b;
    for (size_t i = 0; i < udq.size(); ++i) ASSERT_EQ(udq[i], dq[q0 * s.heads * d + i]) << "dq, segment " << b;
    for (size_t i = 0; i < udk.size(); ++i) ASSERT_EQ(udk[i], dk[k0 * s.heads_kv * d + i]) << "dk, segment " << b;
    q0 += sq;
    k0 += sk;
  }
}

// The learnable sink on dense batches (dsink included), mirroring the CPU forward/backward sink cases: GQA with
// key-less rows under causal (lse = sink there), softcap + window, a dominant sink; every head dim.
TEST(DenseSinkGpu, ForwardAndBackwardMatchReference) {
  FLASH4_REQUIRE_GPU();
  std::vector<CaseSpec> specs;
  for (int64_t d : {64, 128, 256}) {
    specs.push_back(with(make_spec(2, 150, 60, 8, 2, d, kBF16, true), [](CaseSpec& s) { s.sink = true; }));
    specs.push_back(with(make_spec(1, 300, 300, 4, 1, d, kF16), [](CaseSpec& s) {
      s.sink = true, s.softcap = 10.0f, s.input_stddev = 3.0, s.window_left = 40, s.window_right = 0;
    }));
    specs.push_back(with(make_spec(1, 200, 200, 2, 2, d, kBF16), [](CaseSpec& s) { s.sink = true, s.sink_offset = 8.0; }));
  }
  for (const CaseSpec& s : specs) {
    SCOPED_TRACE(s.name());
    FLASH4_TEST_RNG(rng);
    AttentionTensors t = make_tensors(s, rng, true);
    DeviceMirror q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse), sink(*t.sink), dsink(*t.dsink);
    DeviceMirror dout(*t.dout), dq(*t.dq), dk(*t.dk), dv(*t.dv);
    ForwardArgs f = t.forward_args(s);
    f.q = q.view(), f.k = k.view(), f.v = v.view(), f.out = out.view(), f.lse = lse.view();
    f.learnable_sink = sink.view();
    ASSERT_TRUE(can_implement(f).ok) << can_implement(f).reason;
    forward(f);
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    FLASH4_TEST_CUDA(out.download());
    FLASH4_TEST_CUDA(lse.download());
    EXPECT_TRUE(check_forward(s, t, rng));
    BackwardArgs b = t.backward_args(s);  // on the GPU forward's out and lse
    b.q = f.q, b.k = f.k, b.v = f.v, b.out = f.out, b.lse = f.lse, b.learnable_sink = f.learnable_sink;
    b.dout = dout.view(), b.dq = dq.view(), b.dk = dk.view(), b.dv = dv.view(), b.dsink = dsink.view();
    backward(b);
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    for (DeviceMirror* m : {&dq, &dk, &dv, &dsink}) FLASH4_TEST_CUDA(m->download());
    EXPECT_TRUE(check_backward(s, t));
  }
}

// Corrupt device-resident offsets (decreasing, negative, past the tensors, longer than max_seqlen) cannot be
// checked without a synchronisation; the kernels clamp them: the call completes and nothing outside the
// tensors changes (guard rows after each packed tensor stay NaN-poisoned).
TEST(VarlenGpuClamping, CorruptDeviceOffsetsStayInBounds) {
  FLASH4_REQUIRE_GPU();
  const int64_t total = 300, guard = 64, heads = 2, d = 64;
  VarlenSpec s = varlen({100, 100, 100}, {100, 100, 100}, heads, heads, d, kBF16, [&](VarlenSpec& x) {
    x.pad_q = guard, x.pad_k = guard, x.sink = true;  // the packed tensors get `guard` extra rows ...
  });
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  const std::vector<int> bad = {-7, 250, 120, 9999};  // negative, decreasing, past total, segment > max
  std::memcpy(t.cu_seqlens_q.data(), bad.data(), bad.size() * 4);
  std::memcpy(t.cu_seqlens_k.data(), bad.data(), bad.size() * 4);
  DeviceVarlen dev(t);
  ASSERT_TRUE(dev.ok());
  ForwardArgs fa = dev.forward_args(s, t);
  BackwardArgs ba = dev.backward_args(s, t);
  for (TensorView* v : {&fa.q, &fa.k, &fa.v, &fa.out, &ba.q, &ba.k, &ba.v, &ba.out, &ba.dout, &ba.dq, &ba.dk, &ba.dv})
    v->shape[0] = total;  // ... which the call does not see
  for (TensorView* v : {&fa.lse, &ba.lse}) v->shape[1] = total;  // (heads, total_q) with row stride total + guard
  ASSERT_TRUE(can_implement(fa).ok) << can_implement(fa).reason;
  forward(fa);
  backward(ba);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  for (HostTensor* h : {&t.out, &*t.dq, &*t.dk, &*t.dv}) {
    FLASH4_TEST_CUDA(dev.download(*h));
    ASSERT_NO_FATAL_FAILURE(expect_guard_rows_untouched(*h, total, guard, heads * d));
  }
  FLASH4_TEST_CUDA(dev.download(t.lse));
  ASSERT_NO_FATAL_FAILURE(expect_guard_lse_untouched(t.lse, heads, total, guard));
}

// The packed forward and backward read the sequence offsets on the device (no host synchronisation), so a
// training step's attention can be captured in a CUDA graph: the replay writes the same bits as the eager calls
// (deterministic mode; GQA, causal, a sink, segments of 0 and 1 token, seqused).
TEST(VarlenGpuGraph, ForwardAndBackwardReplayTheEagerCalls) {
  FLASH4_REQUIRE_GPU();
  const VarlenSpec s = varlen({300, 0, 1, 129, 64}, {350, 20, 1, 129, 700}, 4, 2, 128, kBF16, [](VarlenSpec& x) {
    x.causal = true, x.deterministic = true, x.sink = true;
  });
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  DeviceVarlen dev(t);
  ASSERT_TRUE(dev.ok());
  const ForwardArgs fa = dev.forward_args(s, t);
  const BackwardArgs ba = dev.backward_args(s, t);
  ASSERT_TRUE(can_implement(fa).ok) << can_implement(fa).reason;
  cudaStream_t stream = nullptr;
  FLASH4_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  forward(fa, stream);
  backward(ba, stream);
  FLASH4_TEST_CUDA(cudaStreamSynchronize(stream));
  std::vector<HostTensor*> outputs = {&t.out, &t.lse, &*t.dq, &*t.dk, &*t.dv, &*t.dsink};
  auto bytes_of = [](const HostTensor& h) { return static_cast<size_t>(h.numel()) * dtype_size(h.view().dtype); };
  auto contents = [&](const HostTensor& h) {
    const char* p = static_cast<const char*>(h.view().data);
    return std::vector<char>(p, p + bytes_of(h));
  };
  std::vector<std::vector<char>> eager;
  for (HostTensor* h : outputs) {
    FLASH4_TEST_CUDA(dev.download(*h));
    eager.push_back(contents(*h));
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FLASH4_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  forward(fa, stream);
  backward(ba, stream);
  FLASH4_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  FLASH4_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (HostTensor* h : outputs) FLASH4_TEST_CUDA(cudaMemset(dev.view(*h).data, 0xff, bytes_of(*h)));  // poison
  FLASH4_TEST_CUDA(cudaGraphLaunch(exec, stream));
  FLASH4_TEST_CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < outputs.size(); ++i) {
    FLASH4_TEST_CUDA(dev.download(*outputs[i]));
    EXPECT_TRUE(contents(*outputs[i]) == eager[i]) << "output " << i << " differs after the replay";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace flash4::test
