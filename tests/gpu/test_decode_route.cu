// The dense forward's decode route (src/kernels/sm90/decode/decode_dense.h): flash4::forward problems with few
// query rows per KV head run on the split-KV decode kernel. Against the fp64 reference (out and LSE, causal
// bottom-right with seqlen_q < seqlen_k, window, softcap, sink, GQA / MQA), and the backward run on the LSE and
// output the route wrote.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "api/backends.h"
#include "common/attention_case.h"
#include "common/problem_builder.h"
#include "device_mirror.h"
#include "flash4/api.h"
#include "kernels/sm90/decode/decode_dense.h"

namespace flash4::test {
namespace {

#define FLASH4_REQUIRE_GPU() \
  if (!cuda_available(0)) GTEST_SKIP() << "no sm_90 GPU"

// Forward on the GPU (asserting that it takes the decode route), checked; then, with `backward`, the GPU backward
// on that out and LSE, checked against the reference gradients.
void run_route(const CaseSpec& spec, bool backward = false) {
  SCOPED_TRACE(spec.name());
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(spec, rng, backward);
  DeviceMirror q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse);
  ASSERT_TRUE(q.ok() && k.ok() && v.ok() && out.ok() && lse.ok());
  ForwardArgs args = t.forward_args(spec);
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.out = out.view();
  args.lse = lse.view();
  std::unique_ptr<DeviceMirror> sink;
  if (spec.sink) {
    sink = std::make_unique<DeviceMirror>(*t.sink);
    args.learnable_sink = sink->view();
  }
  const Support support = can_implement(args);
  // A slice build (FLASH4_DTYPES / FLASH4_HEAD_DIMS) lacks some kernels: those cases say so and are skipped.
  if (!support.ok && support.reason.find("not compiled") != std::string::npos) return;
  ASSERT_TRUE(support.ok) << support.reason;
  ASSERT_TRUE(detail::dense_decode_route(args, detail::validate(args)));
  forward(args);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(out.download());
  FLASH4_TEST_CUDA(lse.download());
  EXPECT_TRUE(check_forward(spec, t, rng));
  if (!backward) return;
  DeviceMirror dout(*t.dout), dq(*t.dq), dk(*t.dk), dv(*t.dv);
  ASSERT_TRUE(dout.ok() && dq.ok() && dk.ok() && dv.ok());
  BackwardArgs b = t.backward_args(spec);
  b.q = q.view();
  b.k = k.view();
  b.v = v.view();
  b.out = out.view();
  b.lse = lse.view();
  b.dout = dout.view();
  b.dq = dq.view();
  b.dk = dk.view();
  b.dv = dv.view();
  if (spec.sink) b.learnable_sink = sink->view();
  const Support bs = can_implement(b);
  ASSERT_TRUE(bs.ok) << bs.reason;
  flash4::backward(b);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dq.download());
  FLASH4_TEST_CUDA(dk.download());
  FLASH4_TEST_CUDA(dv.download());
  EXPECT_TRUE(check_backward(spec, t));
}

TEST(DecodeRoute, MatchesReference) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256}) {
    const DType dtype = d == 128 ? DType::kBFloat16 : DType::kFloat16;
    run_route(make_spec(2, 1, 4097, 32, 8, d, dtype, false));
    run_route(make_spec(1, 1, 1000, 8, 1, d, dtype, true));            // GQA 8:1
    run_route(make_spec(3, 4, 777, 16, 2, d, dtype, true));            // 32 rows: the 64-row shape
    run_route(make_spec(1, 16, 300, 4, 1, d, dtype, true));            // 64 rows, seqlen_q < seqlen_k (bottom-right)
    run_route(make_spec(2, 3, 3, 2, 2, d, dtype, true));               // seqlen_q == seqlen_k
  }
  run_route(make_spec(1, 1, 100003, 4, 1, 128, DType::kBFloat16, false));  // many splits
  run_route(with(make_spec(2, 2, 2000, 8, 2, 128, DType::kBFloat16, false), [](CaseSpec& s) {
    s.window_left = 300;
    s.window_right = 0;
    s.softcap = 15.0f;
  }));
  run_route(with(make_spec(2, 1, 600, 8, 8, 64, DType::kBFloat16, false), [](CaseSpec& s) { s.sink = true; }));
  run_route(with(make_spec(1, 5, 70, 4, 4, 128, DType::kFloat16, true), [](CaseSpec& s) {
    s.layout = Layout::kStrided;
  }));
}

// Head dims between the decode kernel's widths run on the next wider one, zero-padded (decode_load.cuh): the
// strided layout's columns past d hold NaN, so a read past d poisons the output.
TEST(DecodeRoute, PaddedHeadDims) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {8, 40, 96, 136, 192, 200}) {
    const DType dtype = d % 16 == 0 ? DType::kBFloat16 : DType::kFloat16;
    run_route(make_spec(2, 1, 4097, 8, 2, d, dtype, false));           // automatic splits
    run_route(make_spec(3, 4, 777, 16, 2, d, dtype, true));            // 32 rows: the 64-row shape
    run_route(with(make_spec(1, 3, 300, 4, 4, d, dtype, true), [](CaseSpec& s) { s.layout = Layout::kStrided; }));
  }
  run_route(make_spec(1, 1, 600, 8, 1, 96, DType::kBFloat16, true), /*backward=*/true);
}

TEST(DecodeRoute, BackwardOnItsLse) {
  FLASH4_REQUIRE_GPU();
  run_route(make_spec(2, 1, 500, 8, 2, 128, DType::kBFloat16, false), /*backward=*/true);
  run_route(make_spec(1, 8, 300, 4, 1, 64, DType::kBFloat16, true), /*backward=*/true);
}

}  // namespace
}  // namespace flash4::test
