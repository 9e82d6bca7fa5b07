// The per-sequence backward (api/sequence_split.h), which the GPU runs for packed and seqused batches on its dense
// kernels, checked here with the CPU's dense backward as the backend: the views, offsets, clamping and the clearing
// of rows in no sequence are host code, the same on both backends. Against the fp64 reference with the tolerance
// rule; dsink (computed separately by each backend) comes from the native packed CPU backward.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "api/backends.h"
#include "api/sequence_split.h"
#include "common/varlen_case.h"

namespace flash4::test {
namespace {

// Zeroes a host attention tensor of any rank and strides (16- or 32-bit elements) element by element.
void zero_host_view(const TensorView& t) {
  const int64_t rows = t.rank == 3 ? t.shape[0] : t.shape[0] * t.shape[1];
  const int64_t heads = t.rank == 3 ? t.shape[1] : t.shape[2], d = t.rank == 3 ? t.shape[2] : t.shape[3];
  const int64_t size = dtype_size(t.dtype);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t row_offset = t.rank == 3 ? r * t.stride[0] : (r / t.shape[1]) * t.stride[0] + (r % t.shape[1]) * t.stride[1];
      const int64_t head_stride = t.rank == 3 ? t.stride[1] : t.stride[2];
      std::memset(static_cast<char*>(t.data) + (row_offset + h * head_stride) * size, 0, d * size);
    }
}

detail::SequenceSplitBackend cpu_backend(int* calls) {
  detail::SequenceSplitBackend b;
  b.can_run = [](const BackwardArgs& a) {
    detail::validate(a);  // the per-sequence arguments are valid dense arguments
    return Support{};
  };
  b.run = [calls](const BackwardArgs& a) {
    ++*calls;
    detail::cpu_backward(a, detail::validate(a));
  };
  b.zero = zero_host_view;
  return b;
}

VarlenSpec spec(std::vector<int> sq, std::vector<int> sk, int64_t h, int64_t hkv, DType dtype) {
  VarlenSpec s;
  s.seqlens_q = std::move(sq);
  s.seqlens_k = std::move(sk);
  s.heads = h;
  s.heads_kv = hkv;
  s.dtype = dtype;
  return s;
}

std::vector<VarlenSpec> cases() {
  std::vector<VarlenSpec> c;
  c.push_back(spec({0, 1, 17, 127, 64, 129, 3}, {5, 0, 30, 127, 200, 129, 1}, 4, 2, DType::kBFloat16));
  VarlenSpec causal = spec({70, 9, 33}, {70, 90, 2}, 8, 1, DType::kFloat16);
  causal.causal = true;
  c.push_back(causal);
  VarlenSpec window = spec({100, 40}, {60, 140}, 2, 2, DType::kBFloat16);
  window.causal = true, window.window_left = 15, window.sink = true;
  c.push_back(window);
  VarlenSpec used = spec({50, 7, 66}, {80, 7, 66}, 2, 1, DType::kBFloat16);
  used.seqused_q = {20, 7, 0}, used.seqused_k = {80, 3, 10}, used.causal = true, used.softcap = 10.0f;
  c.push_back(used);
  VarlenSpec pad = spec({40, 13}, {25, 70}, 4, 2, DType::kFloat16);
  pad.pad_q = 9, pad.pad_k = 5, pad.sink = true, pad.deterministic = true;
  c.push_back(pad);
  VarlenSpec strided = spec({77, 1, 30}, {91, 45, 1}, 4, 2, DType::kBFloat16);
  strided.layout = Layout::kStrided;
  c.push_back(strided);
  return c;
}

class SequenceSplit : public ::testing::TestWithParam<VarlenSpec> {};

TEST_P(SequenceSplit, BackwardPerSequenceMatchesReference) {
  const VarlenSpec& s = GetParam();
  FLASH4_TEST_RNG(rng);
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  flash4::forward(t.forward_args(s));
  const BackwardArgs args = t.backward_args(s);
  if (t.dsink) flash4::backward(args);  // dsink from the native packed backward; the gradients are redone below
  for (HostTensor* h : {&*t.dq, &*t.dk, &*t.dv}) h->poison();
  const detail::Problem p = detail::validate(args);
  int calls = 0;
  detail::backward_per_sequence(args, p, p.layout(), cpu_backend(&calls));
  int nonempty = 0;
  for (int64_t b = 0; b < s.batch(); ++b) nonempty += !detail::sequence_backward_args(args, p, p.layout(), b).empty;
  EXPECT_EQ(calls, nonempty);
  EXPECT_TRUE(check_varlen_backward(s, t));
}

INSTANTIATE_TEST_SUITE_P(Cases, SequenceSplit, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// A refusal of any sequence leaves every output untouched.
TEST(SequenceSplitRefusal, NothingWrittenWhenASequenceIsRefused) {
  FLASH4_TEST_RNG(rng);
  const VarlenSpec s = spec({10, 20}, {10, 20}, 2, 1, DType::kBFloat16);
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  flash4::forward(t.forward_args(s));
  const BackwardArgs args = t.backward_args(s);
  const detail::Problem p = detail::validate(args);
  int calls = 0;
  detail::SequenceSplitBackend b = cpu_backend(&calls);
  b.can_run = [](const BackwardArgs& a) { return a.q.shape[1] == 20 ? Support{false, "no"} : Support{}; };
  EXPECT_THROW(detail::backward_per_sequence(args, p, p.layout(), b), Error);
  EXPECT_EQ(calls, 0);
  for (HostTensor* h : {&*t.dq, &*t.dk, &*t.dv})
    for (double x : h->to_double()) ASSERT_TRUE(std::isnan(x));
}

}  // namespace
}  // namespace flash4::test
