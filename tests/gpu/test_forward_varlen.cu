// Hopper forward on packed (variable-length) batches and with the learnable sink, against the fp64 reference
// with the tolerance rule (tests/common/varlen_case.h): every row of the packed tensors is checked, rows in no
// segment included. Inputs are fresh random values every run; outputs are NaN-poisoned before the launch.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "common/varlen_case.h"
#include "device_mirror.h"
#include "flash4/api.h"

namespace flash4::test {
namespace {

constexpr DType kF16 = DType::kFloat16, kBF16 = DType::kBFloat16;

// Device copies of a case's optional tensors (seqused, sink), kept alive for the call.
struct DeviceVarlen {
  std::vector<std::unique_ptr<DeviceMirror>> mirrors;
  TensorView mirror(HostTensor& t) {
    mirrors.push_back(std::make_unique<DeviceMirror>(t));
    return mirrors.back()->view();
  }
  bool ok() const {
    for (const auto& m : mirrors)
      if (!m->ok()) return false;
    return true;
  }
};

void run_and_check(const VarlenSpec& spec) {
  SCOPED_TRACE(spec.name());
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(spec, rng, /*backward=*/false);
  ForwardArgs args = t.forward_args(spec);
  DeviceVarlen dev;
  DeviceMirror q(t.q), k(t.k), v(t.v), out(t.out), lse(t.lse), cu_q(t.cu_seqlens_q), cu_k(t.cu_seqlens_k);
  ASSERT_TRUE(q.ok() && k.ok() && v.ok() && out.ok() && lse.ok() && cu_q.ok() && cu_k.ok());
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.out = out.view();
  args.lse = lse.view();
  args.cu_seqlens_q = cu_q.view();
  args.cu_seqlens_k = cu_k.view();
  if (t.seqused_q) args.seqused_q = dev.mirror(*t.seqused_q);
  if (t.seqused_k) args.seqused_k = dev.mirror(*t.seqused_k);
  if (t.sink) args.learnable_sink = dev.mirror(*t.sink);
  ASSERT_TRUE(dev.ok());
  const Support support = can_implement(args);
  ASSERT_TRUE(support.ok) << support.reason;
  forward(args);
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(out.download());
  FLASH4_TEST_CUDA(lse.download());
  EXPECT_TRUE(check_varlen_forward(spec, t));
}

template <class Change>
VarlenSpec varlen(std::vector<int> sq, std::vector<int> sk, int64_t heads, int64_t heads_kv, int64_t d, DType dtype,
                  Change&& change) {
  VarlenSpec s;
  s.seqlens_q = std::move(sq);
  s.seqlens_k = std::move(sk);
  s.heads = heads;
  s.heads_kv = heads_kv;
  s.head_dim = d;
  s.dtype = dtype;
  change(s);
  return s;
}
VarlenSpec varlen(std::vector<int> sq, std::vector<int> sk, int64_t heads, int64_t heads_kv, int64_t d, DType dtype) {
  return varlen(std::move(sq), std::move(sk), heads, heads_kv, d, dtype, [](VarlenSpec&) {});
}

std::vector<VarlenSpec> forward_cases() {
  std::vector<VarlenSpec> c;
  const std::vector<int> mixed = {0, 1, 17, 127, 64, 129, 3, 300};
  const std::vector<int> ragged_k = {5, 0, 30, 127, 200, 129, 1, 513};  // ragged q vs k, an empty key segment
  for (int64_t d : {64, 128, 256}) {
    c.push_back(varlen(mixed, mixed, 2, 2, d, kBF16));
    c.push_back(varlen(mixed, ragged_k, 4, 1, d, kF16, [](VarlenSpec& s) { s.causal = true; }));  // MQA
    c.push_back(varlen(mixed, ragged_k, 4, 2, d, kBF16, [](VarlenSpec& s) { s.sink = true; }));
    c.push_back(varlen({700, 9, 333}, {700, 900, 2}, 8, 1, d, kBF16, [](VarlenSpec& s) {  // GQA 8:1, window
      s.window_left = 100, s.window_right = 5;
    }));
    c.push_back(varlen({1000, 40}, {600, 1400}, 2, 2, d, kBF16, [](VarlenSpec& s) {
      s.causal = true, s.window_left = 150, s.sink = true;
    }));
    c.push_back(varlen({90, 31, 1}, {120, 31, 64}, 2, 1, d, kBF16, [](VarlenSpec& s) {
      s.softcap = 10.0f, s.input_stddev = 3.0, s.sink = true, s.causal = true;
    }));
    c.push_back(varlen({500, 7, 66}, {800, 7, 66}, 2, 1, d, kBF16, [](VarlenSpec& s) {  // seqused_q / seqused_k
      s.seqused_q = {200, 7, 0};
      s.seqused_k = {777, 3, 10};
      s.causal = true;
    }));
    c.push_back(varlen({40, 13}, {25, 70}, 4, 2, d, kF16, [](VarlenSpec& s) {  // rows after the segments
      s.pad_q = 9, s.pad_k = 5, s.sink = true;
    }));
    c.push_back(varlen({77, 1, 300}, {91, 450, 1}, 4, 2, d, kBF16, [](VarlenSpec& s) { s.layout = Layout::kStrided; }));
    c.push_back(varlen({33, 65}, {33, 65}, 2, 1, d, kBF16, [](VarlenSpec& s) { s.sink = true, s.sink_offset = 6.0; }));
  }
  c.push_back(varlen({0, 0}, {0, 3}, 2, 1, 128, kBF16, [](VarlenSpec& s) { s.sink = true; }));  // no query at all
  c.push_back(varlen({3, 5}, {0, 0}, 2, 1, 64, kBF16, [](VarlenSpec& s) { s.sink = true; }));   // no key at all
  c.push_back(varlen({4097}, {4097}, 2, 1, 128, kBF16, [](VarlenSpec& s) { s.causal = true; }));  // one long sequence
  {  // many short segments: more tiles than SMs, most of them partial
    VarlenSpec s = varlen({}, {}, 4, 1, 64, kBF16, [](VarlenSpec& x) { x.causal = true; });
    for (int b = 0; b < 300; ++b) {
      s.seqlens_q.push_back(1 + (b * 37) % 200);
      s.seqlens_k.push_back(1 + (b * 53) % 300);
    }
    c.push_back(s);
  }
  return c;
}

class GpuVarlenForward : public ::testing::TestWithParam<VarlenSpec> {};

TEST_P(GpuVarlenForward, MatchesReference) { run_and_check(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, GpuVarlenForward, ::testing::ValuesIn(forward_cases()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace flash4::test
