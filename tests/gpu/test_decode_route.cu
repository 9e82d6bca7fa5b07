// The forward's decode route (src/kernels/sm90/decode/decode_dense.h): flash4::forward problems with few query
// rows per KV head run on the split-KV decode kernel, dense batches and packed ones of up to max_seqlen_q queries
// a sequence, and the short segments of packed batches that mix them with longer ones. Against the fp64 reference (out and LSE, causal bottom-right with seqlen_q < seqlen_k,
// window, softcap, sink, GQA / MQA, ragged and partly used keys), and the backward run on the LSE and output the
// route wrote.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>
#include <string>

#include "api/backends.h"
#include "common/attention_case.h"
#include "common/problem_builder.h"
#include "common/tolerance_assertion.h"
#include "device_mirror.h"
#include "flash4/api.h"
#include "gpu_case_runs.h"
#include "kernels/sm90/decode/decode_dense.h"
#include "varlen_device.h"

namespace flash4::test {
namespace {

constexpr DType kBF16 = DType::kBFloat16;

// Forward on the GPU (asserting that it takes the decode route), checked; then, with `backward`, the GPU backward
// on that out and LSE, checked against the reference gradients.
void run_route(const CaseSpec& spec, bool backward = false) {
  SCOPED_TRACE(spec.name());
  FLASH4_TEST_RNG(rng);
  AttentionTensors t = make_tensors(spec, rng, backward);
  DeviceForward dev(t);
  ASSERT_TRUE(dev.ok());
  const ForwardArgs args = dev.args(spec, t);
  const Support support = can_implement(args);
  // A slice build (FLASH4_DTYPES / FLASH4_HEAD_DIMS) lacks some kernels: those cases say so and are skipped.
  if (!support.ok && support.reason.find("not compiled") != std::string::npos) return;
  ASSERT_TRUE(support.ok) << support.reason;
  ASSERT_TRUE(detail::dense_decode_route(args, detail::validate(args)));
  forward(args);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dev.out.download());
  FLASH4_TEST_CUDA(dev.lse.download());
  EXPECT_TRUE(check_forward(spec, t, rng));
  if (!backward) return;
  DeviceMirror dout(*t.dout), dq(*t.dq), dk(*t.dk), dv(*t.dv);
  ASSERT_TRUE(dout.ok() && dq.ok() && dk.ok() && dv.ok());
  BackwardArgs b = t.backward_args(spec);
  b.q = dev.q.view();
  b.k = dev.k.view();
  b.v = dev.v.view();
  b.out = dev.out.view();
  b.lse = dev.lse.view();
  b.dout = dout.view();
  b.dq = dq.view();
  b.dk = dk.view();
  b.dv = dv.view();
  if (dev.sink) b.learnable_sink = dev.sink->view();
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
    run_route(make_spec(2, 16, 5000, 16, 2, d, dtype, true));          // 128 rows: two 64-row tiles, GQA 8:1
    run_route(make_spec(1, 11, 900, 11, 1, d, dtype, false));          // 121 rows, MQA
    run_route(make_spec(2, 3, 3, 2, 2, d, dtype, true));               // seqlen_q == seqlen_k
  }
  run_route(make_spec(1, 1, 100003, 4, 1, 128, DType::kBFloat16, false));  // many splits
  // Few CTAs for the dense kernel (batch x heads at most half the SMs) over long caches: up to 64 queries and
  // 256 rows per KV head on the decode kernel (decode_rows_on_few_ctas), causal edge across the row tiles.
  run_route(make_spec(1, 24, 20000, 16, 4, 128, DType::kBFloat16, true));  // 96 rows
  run_route(make_spec(1, 64, 16384, 8, 2, 64, DType::kFloat16, true));     // 256 rows, seqlen_k at the bound
  run_route(make_spec(2, 17, 17000, 8, 1, 128, DType::kBFloat16, false));  // 136 rows, MQA
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

// A dense batch with seqused_k: a contiguous cache that each sequence fills to seqused_k[b] (0 and all included).
TEST(DecodeRoute, DenseSequsedK) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128}) {
    FLASH4_TEST_RNG(rng);
    CaseSpec s = make_spec(3, 2, 500, 8, 2, d, kBF16, true);
    s.sink = true;
    AttentionTensors t = make_tensors(s, rng, false);
    HostTensor used = HostTensor::vector(DType::kInt32, 3);
    const int lengths[3] = {5, 500, 0};
    std::memcpy(used.data(), lengths, sizeof(lengths));
    DeviceMirror q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse), used_dev(used), sink(*t.sink);
    ASSERT_TRUE(q.ok() && k.ok() && v.ok() && out.ok() && lse.ok() && used_dev.ok() && sink.ok());
    ForwardArgs args = t.forward_args(s);
    args.q = q.view(), args.k = k.view(), args.v = v.view(), args.out = out.view(), args.lse = lse.view();
    args.seqused_k = used_dev.view(), args.learnable_sink = sink.view();
    const Support support = can_implement(args);
    if (!support.ok && support.reason.find("not compiled") != std::string::npos) continue;
    ASSERT_TRUE(support.ok) << support.reason;
    ASSERT_TRUE(detail::dense_decode_route(args, detail::validate(args)));
    forward(args);
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    FLASH4_TEST_CUDA(out.download());
    FLASH4_TEST_CUDA(lse.download());
    ForwardArgs host = t.forward_args(s);
    host.seqused_k = used.view();
    const detail::Problem p = make_problem(host);
    const std::vector<double> qd = t.q.to_double(), kd = t.k.to_double(), vd = t.v.to_double();
    const ForwardResult ref = reference_forward(p, qd, kd, vd), naive = naive_forward(p, s.dtype, qd, kd, vd);
    EXPECT_TRUE(within_tolerance("out", t.out.to_double(), ref.out, naive.out, s.dtype)) << d;
    EXPECT_TRUE(within_tolerance("lse", t.lse.to_double(), ref.lse, naive.lse, DType::kFloat32)) << d;
  }
}

// A packed batch through the route (asserted, or asserted not taken with `route` false), judged on every row.
void run_packed(const VarlenSpec& s, bool route = true) {
  run_forward(s, [&](const ForwardArgs& args) {
    const Support support = can_implement(args);
    if (!support.ok && support.reason.find("not compiled") != std::string::npos) return false;
    EXPECT_EQ(detail::dense_decode_route(args, detail::validate(args)), route);
    return true;
  });
}

std::vector<int> repeat(int value, size_t n) { return std::vector<int>(n, value); }

// Packed decode batches (every segment max_seqlen_q queries, keys ragged: the issue's lengths, empty segments,
// seqused_k, keys past the used ones NaN): the keys of sequence b start at cu_seqlens_k[b] of one packed tensor.
TEST(DecodeRoute, PackedBatches) {
  FLASH4_REQUIRE_GPU();
  const std::vector<int> keys = {0, 1, 17, 127, 128, 129, 1000, 4097};
  for (int64_t d : {64, 128, 256}) {
    const DType dtype = d == 128 ? DType::kBFloat16 : DType::kFloat16;
    run_packed(varlen(repeat(1, keys.size()), keys, 32, 8, d, dtype, [](VarlenSpec& s) { s.causal = true; }));
    run_packed(varlen(repeat(4, 4), {5, 300, 64, 4}, 16, 2, d, dtype, [](VarlenSpec& s) {
      s.causal = true, s.sink = true;  // 32 rows per KV head: the 64-row tile
    }));
  }
  run_packed(varlen(repeat(16, 3), {2000, 16, 700}, 8, 2, 128, kBF16, [](VarlenSpec& s) {
    s.causal = true, s.window_left = 300, s.softcap = 15.0f;  // 64 rows
  }));
  run_packed(varlen(repeat(2, 3), {300, 90, 70}, 4, 1, 128, kBF16, [](VarlenSpec& s) {
    s.seqused_k = {180, 0, 10}, s.causal = true, s.pad_k = 7, s.nan_unused_keys = true;
  }));
  run_packed(varlen(repeat(1, 2), {100003, 33}, 4, 1, 128, kBF16, [](VarlenSpec& s) { s.sink = true; }));  // splits
  run_packed(varlen(repeat(3, 2), {250, 9}, 6, 3, 96, kBF16, [](VarlenSpec& s) {
    s.layout = Layout::kStrided, s.causal = true;  // padded head dim, strided rows
  }));
  std::vector<int> many;
  for (int b = 0; b < 1200; ++b) many.push_back(1 + (b * 53) % 64);
  run_packed(varlen(repeat(1, many.size()), many, 8, 8, 64, kBF16, [](VarlenSpec& s) { s.causal = true; }));
}

// Packed decode batches whose sequences hold different numbers of queries (max_seqlen_q at most, some none):
// each CTA finds its sequence's queries at cu_seqlens_q[b], tiles past a sequence's rows do nothing in every
// split, rows after the last segment get out 0 and LSE -inf. Direct stores, the last-CTA merge of 16-row tiles
// (long keys) and the combine kernel of 64-row tiles (16 queries x 4 heads) all meet ragged counts.
TEST(DecodeRoute, PackedBatchesOfRaggedQueryCounts) {
  FLASH4_REQUIRE_GPU();
  run_packed(varlen({1, 2, 1}, {40, 300, 7}, 8, 2, 128, kBF16, [](VarlenSpec& s) { s.causal = true; }));
  run_packed(varlen({2, 1}, {40, 300}, 8, 2, 128, kBF16, [](VarlenSpec& s) {
    s.pad_q = 3, s.nan_unused_queries = true;  // rows after the last segment
  }));
  // total_q = batch * max_seqlen_q, yet a row is in no segment (counts 2 and 1 of 4 rows; and a CUDA-graph batch
  // padded with an empty sequence): the offsets alone say which rows are over.
  run_packed(varlen({2, 1}, {40, 300}, 8, 2, 128, kBF16, [](VarlenSpec& s) {
    s.pad_q = 1, s.nan_unused_queries = true;
  }));
  run_packed(varlen({1, 1, 1, 0}, {40, 300, 7, 0}, 8, 2, 128, kBF16, [](VarlenSpec& s) {
    s.pad_q = 1, s.causal = true;
  }));
  run_packed(varlen({3, 0, 16, 7, 1}, {500, 20, 4097, 0, 130}, 8, 2, 64, DType::kFloat16, [](VarlenSpec& s) {
    s.causal = true, s.sink = true;  // up to 64 rows per KV head: the 64-row tile and the combine kernel
  }));
  run_packed(varlen({1, 4, 2}, {100003, 33, 5000}, 8, 2, 128, kBF16, [](VarlenSpec& s) {
    s.causal = true, s.sink = true;  // 16 rows, long keys: splits merged by the last CTA
  }));
  run_packed(varlen({5, 1, 9}, {2000, 16, 700}, 8, 2, 128, kBF16, [](VarlenSpec& s) {
    s.causal = true, s.window_left = 300, s.softcap = 15.0f;
  }));
  run_packed(varlen({2, 1, 3}, {300, 90, 70}, 4, 1, 256, DType::kFloat16, [](VarlenSpec& s) {
    s.seqused_k = {180, 0, 10}, s.pad_k = 7, s.nan_unused_keys = true;
  }));
  std::vector<int> queries, keys;
  for (int b = 0; b < 700; ++b) {
    queries.push_back((b * 7) % 5);  // 0 .. 4
    keys.push_back(1 + (b * 53) % 300);
  }
  run_packed(varlen(queries, keys, 8, 8, 64, kBF16, [](VarlenSpec& s) { s.causal = true; }));
}

// Device-resident offsets the host cannot check (negative, decreasing, past the tensors, a segment longer than
// max_seqlen_q) on the route: nothing is written past the tensors the call sees.
TEST(DecodeRoute, CorruptQueryOffsetsStayInBounds) {
  FLASH4_REQUIRE_GPU();
  const int64_t total = 9, guard = 16, heads = 8, d = 128;
  VarlenSpec s = varlen({3, 3, 3}, {100, 100, 100}, heads, 2, d, kBF16, [&](VarlenSpec& x) {
    x.pad_q = guard, x.pad_k = guard, x.sink = true;  // the packed tensors get `guard` extra rows ...
  });
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, false);
  const std::vector<int> bad = {-7, 8, 5, 9999};
  std::memcpy(t.cu_seqlens_q.data(), bad.data(), bad.size() * 4);
  DeviceVarlen dev(t);
  ASSERT_TRUE(dev.ok());
  ForwardArgs fa = dev.forward_args(s, t);
  fa.q.shape[0] = fa.out.shape[0] = total;  // ... which the call does not see
  fa.lse.shape[1] = total;                  // (heads, total_q) with row stride total + guard
  fa.max_seqlen_q = 4;
  ASSERT_TRUE(can_implement(fa).ok) << can_implement(fa).reason;
  ASSERT_TRUE(detail::dense_decode_route(fa, detail::validate(fa)));
  forward(fa);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dev.download(t.out));
  ASSERT_NO_FATAL_FAILURE(expect_guard_rows_untouched(t.out, total, guard, heads * d));
  FLASH4_TEST_CUDA(dev.download(t.lse));
  ASSERT_NO_FATAL_FAILURE(expect_guard_lse_untouched(t.lse, heads, total, guard));
}

// Batches the route must leave to the packed forward kernel: partly used queries, more rows per KV head than the
// decode tiles take (the 3-query segment of the second still runs on the decode kernel beside it: below).
TEST(DecodeRoute, PackedBatchesItLeaves) {
  FLASH4_REQUIRE_GPU();
  run_packed(varlen({2, 2}, {40, 300}, 8, 2, 128, kBF16, [](VarlenSpec& s) { s.seqused_q = {1, 2}; }), false);
  run_packed(varlen({16, 3}, {40, 300}, 32, 2, 128, kBF16, [](VarlenSpec& s) { s.causal = true; }), false);
}

// A packed batch of mixed query counts (prefill chunks beside decode steps): the decode kernel takes the segments
// of up to decode_max_queries(group) queries, the packed forward kernel the longer ones, both reading the offsets
// on the device (asserted: `decode_queries` is the share); every row judged, rows after the last segment included.
void run_shared(const VarlenSpec& s, int64_t decode_queries) {
  run_forward(s, [&](const ForwardArgs& args) {
    const Support support = can_implement(args);
    if (!support.ok && support.reason.find("not compiled") != std::string::npos) return false;
    const detail::Problem p = detail::validate(args);
    EXPECT_FALSE(detail::dense_decode_route(args, p));
    EXPECT_EQ(detail::packed_decode_share(args, p), decode_queries);
    return true;
  });
}

TEST(DecodeRoute, PackedBatchesSharedWithTheDenseKernel) {
  FLASH4_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256}) {
    const DType dtype = d == 128 ? DType::kBFloat16 : DType::kFloat16;
    run_shared(varlen({300, 1, 0, 17, 16, 4}, {500, 40, 0, 2000, 16, 90}, 8, 2, d, dtype, [](VarlenSpec& s) {
                 s.causal = true, s.pad_q = 3, s.nan_unused_queries = true;
               }),
               16);
  }
  run_shared(varlen({16, 17, 130}, {100, 700, 130}, 4, 4, 128, kBF16, [](VarlenSpec& s) {
               s.causal = true, s.window_left = 60, s.softcap = 15.0f, s.sink = true;  // MHA: 16 queries decoded
             }),
             16);
  run_shared(varlen({3, 40, 4, 5}, {300, 80, 1000, 5}, 32, 1, 64, kBF16, [](VarlenSpec& s) {
               s.seqused_k = {100, 80, 0, 5}, s.pad_k = 5, s.nan_unused_keys = true;  // 32 heads a KV head: 4
             }),
             4);
}

}  // namespace
}  // namespace flash4::test
