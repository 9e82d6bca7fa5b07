// What the Hopper kernels do not take is refused by can_implement with the reason, and forward / backward then
// throw kNotSupported and write nothing: split head dims other than (192, 128) and (128, 64), FP8
// (float8_e4m3fn) inputs at head dims without an FP8 kernel, and sizes past the forward kernels' 32-bit counts.
// The CPU runs all of them (tests/cpu/test_head_dims.cpp, test_fp8.cpp); test_padded_head_dims.cu and
// test_any_head_dims.cu run the padded head dims on the GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device_mirror.h"
#include "flash4/api.h"

namespace flash4::test {
namespace {

constexpr int64_t kBatch = 1, kSeq = 64, kHeads = 2;

// Zeroed device buffers for one call; outputs filled with the byte 0xA5 so a write shows.
struct DeviceCall {
  std::vector<void*> buffers;
  ~DeviceCall() {
    for (void* p : buffers) cudaFree(p);
  }
  TensorView tensor(DType dtype, int64_t dim, bool output) {
    const size_t bytes = static_cast<size_t>(kBatch * kSeq * kHeads * dim * dtype_size(dtype));
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return {};
    cudaMemset(p, output ? 0xA5 : 0, bytes);
    buffers.push_back(p);
    return make_view(p, dtype, Device::cuda(0), kBatch, kSeq, kHeads, dim);
  }
  static bool untouched(const TensorView& t) {
    std::vector<unsigned char> host(static_cast<size_t>(t.numel() * dtype_size(t.dtype)));
    cudaMemcpy(host.data(), t.data, host.size(), cudaMemcpyDeviceToHost);
    for (unsigned char b : host)
      if (b != 0xA5) return false;
    return true;
  }
};

bool hopper() { return cuda_available(0); }

void expect_refused(const ForwardArgs& args, const std::string& reason) {
  const Support s = can_implement(args);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find(reason), std::string::npos) << s.reason;
  try {
    forward(args);
    ADD_FAILURE() << "forward ran what can_implement refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported) << e.what();
  }
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(DeviceCall::untouched(args.out));
}

TEST(GpuRefusals, HeadDimsTheKernelsDoNotTake) {
  if (!hopper()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU and the CUDA build";
  for (auto [d, dv] : {std::pair{80, 64}, std::pair{192, 64}, std::pair{256, 128}}) {
    SCOPED_TRACE("head_dim " + std::to_string(d) + ", head_dim_v " + std::to_string(dv));
    DeviceCall call;
    ForwardArgs f;
    f.q = call.tensor(DType::kBFloat16, d, false);
    f.k = call.tensor(DType::kBFloat16, d, false);
    f.v = call.tensor(DType::kBFloat16, dv, false);
    f.out = call.tensor(DType::kBFloat16, dv, true);
    ASSERT_NE(f.out.data, nullptr);
    const char* reason = "(192, 128) or (128, 64)";
    expect_refused(f, reason);
    BackwardArgs b;
    b.q = f.q, b.k = f.k, b.v = f.v, b.out = f.out;
    b.dout = call.tensor(DType::kBFloat16, dv, false);
    std::vector<float> lse_host(kBatch * kHeads * kSeq, 0.0f);
    void* lse = nullptr;
    ASSERT_EQ(cudaMalloc(&lse, lse_host.size() * sizeof(float)), cudaSuccess);
    call.buffers.push_back(lse);
    b.lse = make_view(lse, DType::kFloat32, Device::cuda(0), kBatch, kHeads, kSeq);
    b.dq = call.tensor(DType::kBFloat16, d, true);
    b.dk = call.tensor(DType::kBFloat16, d, true);
    b.dv = call.tensor(DType::kBFloat16, dv, true);
    const Support s = can_implement(b);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find(reason), std::string::npos) << s.reason;
    EXPECT_THROW(backward(b), Error);
    FLASH4_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(DeviceCall::untouched(b.dq) && DeviceCall::untouched(b.dk) && DeviceCall::untouched(b.dv));
  }
}

TEST(GpuRefusals, Fp8Forward) {
  if (!hopper()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU and the CUDA build";
  DeviceCall call;
  ForwardArgs f;
  f.q = call.tensor(DType::kFloat8E4M3, 64, false);
  f.k = call.tensor(DType::kFloat8E4M3, 64, false);
  f.v = call.tensor(DType::kFloat8E4M3, 64, false);
  f.out = call.tensor(DType::kBFloat16, 64, true);
  ASSERT_NE(f.out.data, nullptr);
  expect_refused(f, "head_dim 128 or 256");
}

// The forward kernels count query rows and tiles in 32-bit ints: problems past that are refused by name, also
// where they need no memory (a packed batch's tiles come from max_seqlen_q, a broadcast k has no extent).
TEST(GpuRefusals, ForwardSizesBeyondTheKernelsInt32Counts) {
  if (!hopper()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU and the CUDA build";
  const Device gpu = Device::cuda(0);
  const auto refused = [](const ForwardArgs& a, const std::string& reason) {
    const Support s = can_implement(a, Validation::kWithoutBuffers);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find(reason), std::string::npos) << s.reason;
  };
  ForwardArgs packed;  // 128 tokens, max_seqlen_q 2^31 - 1: 2^24 tiles of 128 rows x 128 heads
  packed.q = packed.out = make_view(nullptr, DType::kBFloat16, gpu, 128, 128, 128);
  packed.k = packed.v = make_view(nullptr, DType::kBFloat16, gpu, 128, 128, 128);
  packed.cu_seqlens_q = packed.cu_seqlens_k = make_view(nullptr, DType::kInt32, gpu, 2);
  packed.max_seqlen_q = packed.max_seqlen_k = (int64_t{1} << 31) - 1;
  refused(packed, "query tiles");
  packed.max_seqlen_q = packed.max_seqlen_k = 128;
  EXPECT_TRUE(can_implement(packed, Validation::kWithoutBuffers).ok);

  ForwardArgs dense;  // seqlen_q 2^31 - 100: the last 192- or 128-row tile's rows pass 2^31
  dense.q = dense.out = make_view(nullptr, DType::kBFloat16, gpu, 1, (int64_t{1} << 31) - 100, 1, 64);
  dense.k = dense.v = make_view(nullptr, DType::kBFloat16, gpu, 1, 128, 1, 64);
  refused(dense, "seqlen_q < 2^31 - ");

  ForwardArgs window;  // a left window over 2^31 - 1000 keys: row + band_hi passes 2^31
  window.q = window.out = make_view(nullptr, DType::kBFloat16, gpu, 1, 4096, 1, 64);
  window.k = window.v = make_view(nullptr, DType::kBFloat16, gpu, 1, (int64_t{1} << 31) - 1000, 1, 64);
  window.window_left = 1024;
  refused(window, "seqlen_q + seqlen_k < 2^31");
}

}  // namespace
}  // namespace flash4::test
