// NaN in the inputs propagates to the rows it reaches and nothing else, with either exp2 (found by
// fuzz/api_args_fuzzer.cpp: the polynomial's exponent conversion of a NaN was undefined behaviour, which the
// asan preset's UBSan reports).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flash4/api.h"
#include "flash4/kvcache.h"

namespace flash4 {
namespace {

TEST(NanInputs, PropagateToTheirRowOnly) {
  constexpr int64_t kSeq = 9, kDim = 16;
  for (const Exp2Mode mode : {Exp2Mode::kExact, Exp2Mode::kPolynomial}) {
    std::vector<float> q(kSeq * kDim, 0.25f), k(kSeq * kDim, 0.5f), v(kSeq * kDim, 1.0f), out(kSeq * kDim, 0.0f);
    q[3 * kDim + 5] = std::numeric_limits<float>::quiet_NaN();  // query row 3
    const Device cpu = Device::cpu();
    ForwardArgs a;
    a.q = make_view(q.data(), DType::kFloat32, cpu, 1, kSeq, 1, kDim);
    a.k = make_view(k.data(), DType::kFloat32, cpu, 1, kSeq, 1, kDim);
    a.v = make_view(v.data(), DType::kFloat32, cpu, 1, kSeq, 1, kDim);
    a.out = make_view(out.data(), DType::kFloat32, cpu, 1, kSeq, 1, kDim);
    a.tuning.exp2 = mode;
    forward(a);
    for (int64_t i = 0; i < kSeq; ++i)
      for (int64_t c = 0; c < kDim; ++c) {
        const float x = out[i * kDim + c];
        if (i == 3) EXPECT_TRUE(std::isnan(x)) << "row " << i;
        else EXPECT_NEAR(x, 1.0f, 1e-3f) << "row " << i;
      }
  }
}

// The same through the KV-cache path with its keys split three ways: the combine keeps a NaN part's row NaN
// (a max over the parts' LSEs would drop it and leave the row's other parts, or zero).
TEST(NanInputs, PropagateThroughTheSplitCombine) {
  constexpr int64_t kRows = 4, kKeys = 900, kDim = 16;
  std::vector<float> q(kRows * kDim, 0.25f), k(kKeys * kDim, 0.5f), v(kKeys * kDim, 1.0f), out(kRows * kDim, 0.0f);
  std::vector<float> lse(kRows, 0.0f);
  q[2 * kDim + 7] = std::numeric_limits<float>::quiet_NaN();  // query row 2
  const Device cpu = Device::cpu();
  KvCacheArgs a;
  a.q = make_view(q.data(), DType::kFloat32, cpu, 1, kRows, 1, kDim);
  a.k_cache = make_view(k.data(), DType::kFloat32, cpu, 1, kKeys, 1, kDim);
  a.v_cache = make_view(v.data(), DType::kFloat32, cpu, 1, kKeys, 1, kDim);
  a.out = make_view(out.data(), DType::kFloat32, cpu, 1, kRows, 1, kDim);
  a.lse = make_view(lse.data(), DType::kFloat32, cpu, 1, 1, kRows);
  a.num_splits = 3;
  for (const bool key_nan : {false, true}) {  // then a NaN key of the second split: NaN in every row
    k[500 * kDim + 3] = key_nan ? std::numeric_limits<float>::quiet_NaN() : 0.5f;
    forward_kvcache(a);
    for (int64_t i = 0; i < kRows; ++i) {
      const bool nan_row = key_nan || i == 2;
      EXPECT_EQ(std::isnan(lse[i]), nan_row) << "row " << i << " key NaN " << key_nan;
      for (int64_t c = 0; c < kDim; ++c) {
        if (nan_row) EXPECT_TRUE(std::isnan(out[i * kDim + c])) << "row " << i << " key NaN " << key_nan;
        else EXPECT_NEAR(out[i * kDim + c], 1.0f, 1e-3f) << "row " << i;
      }
    }
  }
}

}  // namespace
}  // namespace flash4
