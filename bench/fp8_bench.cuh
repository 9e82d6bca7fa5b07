// flash4_bench --fp8: the FP8 (e4m3) forward beside the bf16 forward of the same shapes (16k tokens, heads = 2048 /
// d, d = 128 and 256), interleaved in rounds, one JSON line each ("flash4" and "flash4_fp8"). The FP8 call includes
// its V transpose. Inputs: random e4m3 of about unit variance, descales 0.5, rotated sets larger than L2.
#pragma once

#include <cuda_fp8.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace fp8_bench {

__global__ void fill_random_e4m3(__nv_fp8_e4m3* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = __nv_fp8_e4m3(random_unit(i, seed));
}

__global__ void fill_value(float* x, size_t n, float value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

// FP8 q, k, v (and bf16 out, fp32 lse, descales) per set, as many sets as exceed L2.
class Fp8Inputs {
 public:
  explicit Fp8Inputs(const Shape& sh) : sh_(sh) {
    const size_t n = size_t(sh.b) * sh.s * sh.h * sh.d;
    sets_ = static_cast<int>(std::max<size_t>(1, (200u << 20) / (5 * n) + 1));
    for (int i = 0; i < sets_; ++i) {
      Set set;
      for (int t = 0; t < 3; ++t) {
        CHECK(cudaMalloc(&set.qkv[t], n));
        fill_random_e4m3<<<1024, 256>>>(set.qkv[t], n, 99u + 3 * i + t);
      }
      CHECK(cudaMalloc(&set.out, n * 2));
      CHECK(cudaMalloc(&set.lse, size_t(sh.b) * sh.h * sh.s * 4));
      CHECK(cudaMalloc(&set.descale, size_t(sh.b) * sh.h * 4));
      fill_value<<<16, 256>>>(set.descale, size_t(sh.b) * sh.h, 0.5f);
      sets.push_back(set);
    }
    CHECK(cudaDeviceSynchronize());
  }
  ~Fp8Inputs() {
    for (Set& s : sets) {
      for (auto* p : s.qkv) cudaFree(p);
      cudaFree(s.out);
      cudaFree(s.lse);
      cudaFree(s.descale);
    }
  }
  int count() const { return sets_; }
  flash4::ForwardArgs args(int i) const {
    const Set& s = sets[i];
    const flash4::Device dev = flash4::Device::cuda(0);
    flash4::ForwardArgs a;
    a.q = flash4::make_view(s.qkv[0], flash4::DType::kFloat8E4M3, dev, sh_.b, sh_.s, sh_.h, sh_.d);
    a.k = flash4::make_view(s.qkv[1], flash4::DType::kFloat8E4M3, dev, sh_.b, sh_.s, sh_.h, sh_.d);
    a.v = flash4::make_view(s.qkv[2], flash4::DType::kFloat8E4M3, dev, sh_.b, sh_.s, sh_.h, sh_.d);
    a.out = flash4::make_view(s.out, flash4::DType::kBFloat16, dev, sh_.b, sh_.s, sh_.h, sh_.d);
    a.lse = flash4::make_view(s.lse, flash4::DType::kFloat32, dev, sh_.b, sh_.h, sh_.s);
    a.q_descale = a.k_descale = a.v_descale = flash4::make_view(s.descale, flash4::DType::kFloat32, dev, sh_.b, sh_.h);
    a.causal = sh_.causal;
    return a;
  }

 private:
  struct Set {
    __nv_fp8_e4m3* qkv[3] = {};
    void* out = nullptr;
    float* lse = nullptr;
    float* descale = nullptr;
  };
  Shape sh_;
  int sets_ = 1;
  std::vector<Set> sets;
};

inline void run(const std::vector<int>& seqlens, int iters, int rounds) {
  for (int d : {128, 256}) {
    for (int s : seqlens) {
      for (bool causal : {false, true}) {
        const Shape sh{std::max(1, 16384 / s), s, 2048 / d, d, causal};
        const Fp8Inputs fp8(sh);
        if (const flash4::Support support = flash4::can_implement(fp8.args(0)); !support) {
          std::fprintf(stderr, "skipping FP8 d=%d: %s\n", d, support.reason.c_str());
          continue;
        }
        const Inputs bf16(sh);
        std::vector<double> t_bf16, t_fp8;
        for (int r = 0; r < rounds; ++r) {
          t_bf16.push_back(median_ms(bf16, iters, {}, &library_forward));
          t_fp8.push_back(median_ms_of(fp8.count(), iters, [&](int set) { flash4::forward(fp8.args(set)); }));
        }
        double flops = 4.0 * sh.b * sh.h * double(sh.s) * sh.s * sh.d;
        if (causal) flops /= 2;
        for (auto* t : {&t_bf16, &t_fp8}) {
          std::sort(t->begin(), t->end());
          const double ms = (*t)[t->size() / 2];
          std::printf("{\"impl\": \"%s\", \"b\": %d, \"s\": %d, \"h\": %d, \"d\": %d, \"causal\": %s, \"ms\": %.4f, "
                      "\"tflops\": %.1f}\n",
                      t == &t_fp8 ? "flash4_fp8" : "flash4", sh.b, sh.s, sh.h, sh.d, causal ? "true" : "false", ms,
                      flops / ms / 1e9);
        }
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace fp8_bench
