// Legal arguments at the edges of their ranges, which validation accepts and the CPU path must handle without
// undefined behaviour or work that grows with a bound rather than with the data: the rank of an absent optional
// tensor, and a packed batch whose max_seqlen is far above its longest segment.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/varlen_case.h"
#include "flash4/api.h"

namespace flash4::test {
namespace {

TEST(ExtremeArguments, NumelReadsAtMostFourSizes) {
  TensorView t;
  t.shape[0] = 2, t.shape[1] = 3, t.shape[2] = 4, t.shape[3] = 5;
  t.rank = 5;  // invalid: validation refuses it where the tensor is used, but numel() must not read past shape
  EXPECT_EQ(t.numel(), 120);
  t.rank = -1;
  EXPECT_EQ(t.numel(), 1);
}

// An absent dsink is not validated, so its rank may be anything; the backward with no output elements must
// still only look at its four sizes.
TEST(ExtremeArguments, BackwardIgnoresAnAbsentDsinkOfAnyRank) {
  std::vector<uint16_t> storage(64);
  std::vector<float> sink(2, 0.5f), lse(1);
  const auto empty = [&](int64_t heads) {
    return make_view(storage.data(), DType::kBFloat16, Device::cpu(), 2, 0, heads, 8);
  };
  BackwardArgs a;
  a.q = a.out = a.dout = a.dq = empty(2);
  a.k = a.v = a.dk = a.dv = empty(1);
  a.dq.data = storage.data() + 16;
  a.dk.data = storage.data() + 32;
  a.dv.data = storage.data() + 48;
  a.lse = make_view(lse.data(), DType::kFloat32, Device::cpu(), 2, 2, 0);
  a.learnable_sink = make_view(sink.data(), DType::kFloat32, Device::cpu(), 2);
  for (const int rank : {5, 100, -1}) {
    a.dsink = TensorView{};
    a.dsink.rank = rank;
    EXPECT_NO_THROW(backward(a)) << "dsink.rank = " << rank;
  }
  for (uint16_t x : storage) EXPECT_EQ(x, 0);
}

// max_seqlen_q / k only have to bound the segments: at 2^31 - 1 for segments of a few tokens the CPU path gives
// the same bits as with the tight bound, in the time of the segments (sized by max_seqlen, the tasks of one head
// numbered 2^25, and the call took minutes).
TEST(ExtremeArguments, LooseMaxSeqlenCostsNoMoreThanTheSegments) {
  FLASH4_TEST_RNG(rng);
  VarlenSpec s;
  s.seqlens_q = {3, 0, 70};
  s.seqlens_k = {5, 2, 66};
  s.heads = 2;
  s.heads_kv = 1;
  s.head_dim = 16;
  s.causal = true;
  s.sink = true;
  VarlenTensors t = make_varlen_tensors(s, rng, true);
  const std::vector<HostTensor*> written = {&t.out, &t.lse, &*t.dq, &*t.dk, &*t.dv, &*t.dsink};
  const auto outputs = [&] {
    std::vector<std::vector<double>> all;
    for (const HostTensor* h : written) all.push_back(h->to_double());
    return all;
  };
  forward(t.forward_args(s));
  backward(t.backward_args(s));
  const std::vector<std::vector<double>> tight = outputs();
  for (HostTensor* h : written) h->poison();

  const auto start = std::chrono::steady_clock::now();
  ForwardArgs f = t.forward_args(s);
  BackwardArgs b = t.backward_args(s);
  f.max_seqlen_q = f.max_seqlen_k = b.max_seqlen_q = b.max_seqlen_k = std::numeric_limits<int32_t>::max();
  forward(f);
  backward(b);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<std::vector<double>> loose = outputs();
  ASSERT_EQ(loose.size(), tight.size());
  for (size_t i = 0; i < tight.size(); ++i) {
    ASSERT_EQ(loose[i].size(), tight[i].size());
    for (size_t j = 0; j < tight[i].size(); ++j)
      ASSERT_EQ(std::memcmp(&loose[i][j], &tight[i][j], sizeof(double)), 0) << "output " << i << ", element " << j;
  }
  EXPECT_LT(seconds, 10.0);  // milliseconds in practice, sanitizers included
}

}  // namespace
}  // namespace flash4::test
