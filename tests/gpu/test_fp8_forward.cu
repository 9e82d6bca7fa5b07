// The FP8 (float8_e4m3fn) forward on the GPU: the CPU tests' FP8 cases
// (tests/common/fp8_case.h) at the kernels' head dims, uploaded with NaN-poisoned outputs, run through the public
// API and judged against the fp64 reference of the dequantized inputs with the naive FP8 attention as the
// tolerance baseline, in its model of Hopper's FP8 tensor cores and conditional rescaling. Odd lengths (tails inside a 128-key tile, a single key, decode-like rows), GQA, causal,
// window, softcap, the sink, without descales, tiles past the first K/V ring round. Also the refusals.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "common/fp8_case.h"
#include "device_mirror.h"

namespace flash4::test {
namespace {

// Device copies of one FP8 case's buffers, and its arguments pointing at them.
class DeviceFp8Case {
 public:
  explicit DeviceFp8Case(Fp8Problem& t) : t_(t), args_(t.args) {
    repoint(args_.q, t.q.data(), t.q.size());
    repoint(args_.k, t.k.data(), t.k.size());
    repoint(args_.v, t.v.data(), t.v.size());
    out_ = repoint(args_.out, t.out.data(), t.out.size() * sizeof(uint16_t));
    lse_ = repoint(args_.lse, t.lse.data(), t.lse.size() * sizeof(float));
    if (args_.q_descale.data != nullptr) {
      repoint(args_.q_descale, t.q_descale.data(), t.q_descale.size() * sizeof(float));
      repoint(args_.k_descale, t.k_descale.data(), t.k_descale.size() * sizeof(float));
      repoint(args_.v_descale, t.v_descale.data(), t.v_descale.size() * sizeof(float));
    }
    if (args_.learnable_sink.data != nullptr)
      repoint(args_.learnable_sink, t.sink.data(), t.sink.size() * sizeof(float));
    if (args_.cu_seqlens_q.data != nullptr) {  // a packed case (refused by the FP8 kernels, validated first)
      repoint(args_.cu_seqlens_q, t.cu_q.data(), t.cu_q.size() * sizeof(int));
      repoint(args_.cu_seqlens_k, t.cu_k.data(), t.cu_k.size() * sizeof(int));
    }
  }
  ~DeviceFp8Case() {
    for (void* p : buffers_) cudaFree(p);
  }
  DeviceFp8Case(const DeviceFp8Case&) = delete;
  DeviceFp8Case& operator=(const DeviceFp8Case&) = delete;

  bool ok() const { return ok_; }
  const ForwardArgs& args() const { return args_; }
  // Copies out and lse back into the host problem.
  cudaError_t download() {
    const cudaError_t e = cudaMemcpy(t_.out.data(), out_, t_.out.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return e;
    return cudaMemcpy(t_.lse.data(), lse_, t_.lse.size() * sizeof(float), cudaMemcpyDeviceToHost);
  }

 private:
  void* repoint(TensorView& view, const void* host, size_t bytes) {
    void* d = nullptr;
    if (cudaMalloc(&d, bytes == 0 ? 16 : bytes) != cudaSuccess) {
      ok_ = false;
      return nullptr;
    }
    buffers_.push_back(d);
    if (bytes > 0 && cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) ok_ = false;
    view.data = d;
    view.device = Device::cuda(0);
    return d;
  }

  Fp8Problem& t_;
  ForwardArgs args_;
  std::vector<void*> buffers_;
  void* out_ = nullptr;
  void* lse_ = nullptr;
  bool ok_ = true;
};

std::vector<Fp8Spec> gpu_fp8_cases() {
  std::vector<Fp8Spec> c;
  for (int64_t d : {128, 256}) {
    c.push_back(fp8_spec(1, 1, 1, 1, d, d));  // one key: a tile of 127 zero columns
    c.push_back(fp8_spec(128, 128, 2, 2, d, d));
    c.push_back(fp8_spec(200, 333, 4, 2, d, d));  // tails in Q and K/V tiles, GQA 2
    c.push_back(fp8_with(fp8_spec(300, 300, 6, 2, d, d), [](Fp8Spec& s) { s.causal = true; }));
    c.push_back(fp8_with(fp8_spec(130, 700, 4, 1, d, d), [](Fp8Spec& s) { s.causal = true; }));  // MQA, sq < sk
    c.push_back(fp8_with(fp8_spec(257, 190, 2, 1, d, d), [](Fp8Spec& s) { s.window_left = 40, s.window_right = 7; }));
    c.push_back(fp8_with(fp8_spec(150, 260, 4, 4, d, d), [](Fp8Spec& s) { s.softcap = 15.0f; }));
    c.push_back(fp8_with(fp8_spec(100, 100, 4, 2, d, d), [](Fp8Spec& s) { s.sink = true, s.causal = true; }));
    c.push_back(fp8_with(fp8_spec(90, 170, 2, 2, d, d), [](Fp8Spec& s) { s.descale = false; }));
    c.push_back(fp8_spec(3, 1000, 8, 1, d, d));  // decode-like rows: the FP8 path has no decode route
  }
  c.push_back(fp8_with(fp8_spec(1100, 1100, 2, 1, 128, 128), [](Fp8Spec& s) { s.causal = true; }));  // ring laps
  return c;
}

bool hopper() { return cuda_available(0); }

class GpuFp8Forward : public ::testing::TestWithParam<Fp8Spec> {};

TEST_P(GpuFp8Forward, MatchesReferenceOfDequantizedInputs) {
  if (!hopper()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU and the CUDA build";
  FLASH4_TEST_RNG(rng);
  Fp8Problem t(GetParam(), rng);
  DeviceFp8Case dev(t);
  ASSERT_TRUE(dev.ok());
  const Support s = can_implement(dev.args());
  ASSERT_TRUE(s.ok) << s.reason;
  forward(dev.args());
  FLASH4_TEST_CUDA(cudaDeviceSynchronize());
  FLASH4_TEST_CUDA(dev.download());
  EXPECT_TRUE(check_fp8(t, t.out_values(), t.lse_values(), check::Fp8Arithmetic::hopper_tensor_cores()));
}

void PrintTo(const Fp8Spec& s, std::ostream* os) { *os << s.name(); }

INSTANTIATE_TEST_SUITE_P(Cases, GpuFp8Forward, ::testing::ValuesIn(gpu_fp8_cases()),
                         [](const auto& info) { return info.param.name(); });

// Configurations the FP8 kernels do not take are refused with the reason, before anything is written.
TEST(GpuFp8Forward, RefusesWhatTheKernelsDoNotTake) {
  if (!hopper()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU and the CUDA build";
  FLASH4_TEST_RNG(rng);
  const auto refusal = [&](const Fp8Spec& spec) {
    Fp8Problem t(spec, rng);
    DeviceFp8Case dev(t);
    EXPECT_TRUE(dev.ok());
    const Support s = can_implement(dev.args());
    EXPECT_THROW(forward(dev.args()), Error);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dev.download(), cudaSuccess);
    for (uint16_t o : t.out) EXPECT_EQ(o, 0x7fc1) << "out written";  // still the poison
    return s.ok ? std::string("accepted") : s.reason;
  };
  EXPECT_NE(refusal(fp8_spec(64, 64, 2, 2, 64, 64)).find("head_dim 128 or 256"), std::string::npos);
  EXPECT_NE(refusal(fp8_spec(64, 64, 2, 2, 192, 128)).find("head_dim 128 or 256"), std::string::npos);
  EXPECT_NE(refusal(fp8_with(fp8_spec(64, 64, 2, 2, 128, 128), [](Fp8Spec& s) { s.out = DType::kFloat16; }))
                .find("bf16 out"),
            std::string::npos);
  Fp8Spec packed = fp8_spec(0, 0, 2, 2, 128, 128);
  packed.lens_q = {30, 40}, packed.lens_k = {50, 20}, packed.seqlen_q = 40, packed.seqlen_k = 50;
  EXPECT_NE(refusal(packed).find("dense batches only"), std::string::npos);
}

}  // namespace
}  // namespace flash4::test
