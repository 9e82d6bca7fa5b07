// Uses only the installed public headers: a small causal forward on the CPU. With all-equal values every
// output equals v's value and every LSE is log(number of visible keys) + the (constant) score. Then the same
// kind of forward through the C API, from C (c_api_check.c).
#include <cmath>
#include <cstdio>
#include <vector>

#include <flash4/api.h>

extern "C" int install_check_c_api(void);  // c_api_check.c

int main() {
  constexpr int kSeq = 16, kHeads = 2, kDim = 64;
  std::vector<float> q(kSeq * kHeads * kDim, 0.5f), k(q.size(), 0.5f), v(q.size(), 0.25f), out(q.size());
  std::vector<float> lse(kHeads * kSeq);
  const flash4::Device cpu = flash4::Device::cpu();
  flash4::ForwardArgs args;
  args.q = flash4::make_view(q.data(), flash4::DType::kFloat32, cpu, 1, kSeq, kHeads, kDim);
  args.k = flash4::make_view(k.data(), flash4::DType::kFloat32, cpu, 1, kSeq, kHeads, kDim);
  args.v = flash4::make_view(v.data(), flash4::DType::kFloat32, cpu, 1, kSeq, kHeads, kDim);
  args.out = flash4::make_view(out.data(), flash4::DType::kFloat32, cpu, 1, kSeq, kHeads, kDim);
  args.lse = flash4::make_view(lse.data(), flash4::DType::kFloat32, cpu, 1, kHeads, kSeq);
  args.causal = true;
  try {
    flash4::forward(args);
  } catch (const flash4::Error& e) {
    std::fprintf(stderr, "install check: forward failed: %s\n", e.what());
    return 1;
  }
  const double score = 0.25 * kDim / std::sqrt(double{kDim});
  for (int i = 0; i < kSeq; ++i) {
    const double expected_lse = score + std::log(i + 1.0);
    for (int h = 0; h < kHeads; ++h) {
      if (std::abs(lse[h * kSeq + i] - expected_lse) > 1e-3 || std::abs(out[(i * kHeads + h) * kDim] - 0.25f) > 1e-5) {
        std::fprintf(stderr, "install check: wrong result at row %d head %d\n", i, h);
        return 1;
      }
    }
  }
  if (install_check_c_api() != 0) return 1;
  std::printf("install check: flash4 %s found with find_package, CPU forward correct (C++ and C APIs)\n",
              flash4::version());
  return 0;
}
