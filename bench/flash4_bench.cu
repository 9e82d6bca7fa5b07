// Times flash4's GPU forward on the benchmark shapes of ../shared/facts.md with CUDA events: warm-up, median of
// `iters` runs, several input sets rotated so that the working set exceeds L2. Prints one JSON object per line.
// Usage: flash4_bench [--iters N] [--ablation]
//   --ablation: at seqlen 8k, kernel variants that switch the pipeline ideas off one by one (compiled here only).
// flash4 vs cuDNN in one process: bench/sdpa_bench.py with the Python package installed.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "api/backends.h"
#include "flash4/api.h"
#include "kernels/sm90/fwd/fwd_launch.cuh"
#include "kernels/sm90/fwd/fwd_params_builder.h"

namespace {

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                      \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

__global__ void fill_random(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f) * 3.4f);  // ~unit variance
  }
}

struct Shape {
  int b, s, h, d;
  bool causal;
};

using Launcher = void (*)(const flash4::ForwardArgs&);

double run(const Shape& sh, int iters, flash4::Tuning tuning, Launcher launch) {
  const size_t n = size_t(sh.b) * sh.s * sh.h * sh.d;
  const size_t set_bytes = 4 * n * 2;
  const int sets = static_cast<int>(std::max<size_t>(1, (200u << 20) / set_bytes + 1));  // > 200 MB in rotation
  std::vector<__nv_bfloat16*> buf(4 * sets);
  for (int i = 0; i < 4 * sets; ++i) {
    CHECK(cudaMalloc(&buf[i], n * 2));
    fill_random<<<1024, 256>>>(buf[i], n, 1234u + i);
  }
  float* lse;
  CHECK(cudaMalloc(&lse, size_t(sh.b) * sh.h * sh.s * 4));
  auto args_for = [&](int set) {
    flash4::ForwardArgs a;
    auto view = [&](void* p) { return flash4::make_view(p, flash4::DType::kBFloat16, flash4::Device::cuda(0), sh.b, sh.s, sh.h, sh.d); };
    a.q = view(buf[4 * set]);
    a.k = view(buf[4 * set + 1]);
    a.v = view(buf[4 * set + 2]);
    a.out = view(buf[4 * set + 3]);
    a.lse = flash4::make_view(lse, flash4::DType::kFloat32, flash4::Device::cuda(0), sh.b, sh.h, sh.s);
    a.causal = sh.causal;
    a.tuning = tuning;
    return a;
  };
  for (int i = 0; i < 5; ++i) launch(args_for(i % sets));
  CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(iters);
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < iters; ++i) {
    const auto a = args_for(i % sets);
    CHECK(cudaEventRecord(start));
    launch(a);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  for (auto* p : buf) cudaFree(p);
  cudaFree(lse);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms[iters / 2];
}

void library_forward(const flash4::ForwardArgs& a) { flash4::forward(a); }

// A kernel variant the library does not compile, launched through the same parameter builder.
template <int kHeadDim, bool kMasked, bool kOverlap, bool kPingPong, int kStages>
void variant_forward(const flash4::ForwardArgs& a) {
  const flash4::detail::Problem p = flash4::detail::validate(a);
  flash4::sm90::launch_forward_variant<__nv_bfloat16, kHeadDim, kMasked, kOverlap, kPingPong, kStages>(
      flash4::detail::make_fwd_params(a, p), nullptr);
}

template <bool kOverlap, bool kPingPong, int kStages>
Launcher ablation_launcher(const Shape& sh) {
  if constexpr (kStages == 3) {  // only d = 128 has room for a third K/V stage
    if (sh.d != 128) return nullptr;
    return sh.causal ? &variant_forward<128, true, kOverlap, kPingPong, kStages> : &variant_forward<128, false, kOverlap, kPingPong, kStages>;
  } else {
  switch (sh.d) {
    case 64: return sh.causal ? &variant_forward<64, true, kOverlap, kPingPong, kStages> : &variant_forward<64, false, kOverlap, kPingPong, kStages>;
    case 128: return sh.causal ? &variant_forward<128, true, kOverlap, kPingPong, kStages> : &variant_forward<128, false, kOverlap, kPingPong, kStages>;
    case 256: return sh.causal ? &variant_forward<256, true, kOverlap, kPingPong, kStages> : &variant_forward<256, false, kOverlap, kPingPong, kStages>;
  }
  return nullptr;
  }
}

struct Variant {
  const char* name;
  flash4::Tuning tuning;
  Launcher launch;
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 30;
  bool ablation = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ablation")) ablation = true;
  }
  std::vector<Shape> shapes;
  for (int d : {64, 128, 256})
    for (int s : {512, 1024, 2048, 4096, 8192, 16384})
      for (bool causal : {false, true}) shapes.push_back({16384 / s, s, 2048 / d, d, causal});
  for (const Shape& sh : shapes) {
    std::vector<Variant> variants = {{"flash4", {}, &library_forward}};
    if (ablation && sh.s == 8192) {
      const flash4::Tuning plain{flash4::Exp2Mode::kExact, false};
      variants.push_back({"ws_plain", plain, ablation_launcher<false, false, 0>(sh)});
      variants.push_back({"ws_overlap", plain, ablation_launcher<true, false, 0>(sh)});
      variants.push_back({"ws_overlap_pingpong", plain, &library_forward});
      variants.push_back({"ws_overlap_pingpong_condrescale", {flash4::Exp2Mode::kExact, true}, &library_forward});
      if (sh.d == 128) variants.push_back({"flash4_3stages", {}, ablation_launcher<true, true, 3>(sh)});
    }
    for (const auto& var : variants) {
      if (var.launch == nullptr) continue;
      const double ms = run(sh, iters, var.tuning, var.launch);
      double flops = 4.0 * sh.b * sh.h * double(sh.s) * sh.s * sh.d;
      if (sh.causal) flops /= 2;
      std::printf("{\"impl\": \"%s\", \"b\": %d, \"s\": %d, \"h\": %d, \"d\": %d, \"causal\": %s, \"ms\": %.4f, \"tflops\": %.1f}\n",
                  var.name, sh.b, sh.s, sh.h, sh.d, sh.causal ? "true" : "false", ms, flops / ms / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}
