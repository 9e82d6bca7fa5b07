// NaN in the inputs reaches the rows it touches and nothing else on the GPU, as on the CPU (tests/cpu/
// test_nan_inputs.cpp): through the split-KV decode kernel, whose merge of the splits must keep a NaN part's row
// NaN (a max over the parts' LSEs drops NaN, which left a row whose every split was NaN at 0 with LSE -inf).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/host_tensor.h"
#include "device_mirror.h"
#include "flash4/kvcache.h"
#include "kvcache_device.h"

namespace flash4::test {
namespace {

// One decode step of 1 query against 9000 keys, GQA 8 / 2, d = 128, bf16: q = 0.25, k = 0.5, v = 1 (every out
// element 1). A NaN in query head 3; then also a NaN key of KV head 1 (query heads 4..7) in the middle of the
// cache, inside one split only.
TEST(NanInputsGpu, PropagateThroughTheSplitMerge) {
  FLASH4_REQUIRE_GPU();
  constexpr int64_t kHeads = 8, kHeadsKv = 2, kKeys = 9000, kDim = 128;
  for (const int splits : {0, 3, 17}) {  // the kernel's own choice, and forced counts
    for (const bool key_nan : {false, true}) {
      HostTensor q(DType::kBFloat16, 1, 1, kHeads, kDim), k(DType::kBFloat16, 1, kKeys, kHeadsKv, kDim);
      HostTensor v(DType::kBFloat16, 1, kKeys, kHeadsKv, kDim), out(DType::kBFloat16, 1, 1, kHeads, kDim);
      HostTensor lse = HostTensor::lse(1, kHeads, 1);
      std::vector<double> qv(static_cast<size_t>(q.numel()), 0.25), kv(static_cast<size_t>(k.numel()), 0.5);
      qv[3 * kDim + 7] = std::numeric_limits<double>::quiet_NaN();
      if (key_nan) kv[(4321 * kHeadsKv + 1) * kDim + 9] = std::numeric_limits<double>::quiet_NaN();
      q.assign(qv);
      k.assign(kv);
      v.fill(1.0);
      out.poison();
      lse.poison();
      DeviceMirror dq(q), dk(k), dv(v), dout(out), dlse(lse);
      ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok() && dlse.ok());
      KvCacheArgs a;
      a.q = dq.view(), a.k_cache = dk.view(), a.v_cache = dv.view(), a.out = dout.view(), a.lse = dlse.view();
      a.num_splits = splits;
      const Support support = can_implement(a);
      ASSERT_TRUE(support.ok) << support.reason;
      forward_kvcache(a);
      FLASH4_TEST_CUDA(cudaDeviceSynchronize());
      FLASH4_TEST_CUDA(dout.download());
      FLASH4_TEST_CUDA(dlse.download());
      const std::vector<double> o = out.to_double(), l = lse.to_double();
      for (int64_t h = 0; h < kHeads; ++h) {
        const bool nan_row = h == 3 || (key_nan && h >= 4);
        SCOPED_TRACE(testing::Message() << "splits " << splits << " key NaN " << key_nan << " head " << h);
        EXPECT_EQ(std::isnan(l[h]), nan_row) << "lse " << l[h];
        for (int64_t c = 0; c < kDim; ++c) {
          const double x = o[h * kDim + c];
          if (nan_row) {
            EXPECT_TRUE(std::isnan(x)) << "column " << c << ": " << x;
          } else {
            EXPECT_NEAR(x, 1.0, 1e-2) << "column " << c;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace flash4::test
