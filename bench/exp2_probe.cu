// MUFU exp2 probe: results per SM per clock of ex2.approx.f32 against the packed ex2.approx.f16x2 and
// ex2.approx.bf16x2 (two results per instruction), each thread running eight independent chains so that the
// unit's throughput, not its latency, sets the time. Whether a packed exp2 doubles the exp rate decides whether
// a 16-bit softmax could relieve the MUFU-bound FP8 forward (docs/performance.md, "FP8 forward"). Prints one JSON
// line per form.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

constexpr int kIters = 4096, kChains = 8;

__global__ void ex2_f32(float* out) {
  float x[kChains];
  for (int c = 0; c < kChains; ++c) x[c] = (threadIdx.x + c) * 1e-6f - 1.0f;
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[c]));
  float s = 0.0f;
  for (int c = 0; c < kChains; ++c) s += x[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// Packed forms on raw 32-bit registers (two 16-bit values); the start values only need to stay finite.
template <bool kBf16>
__global__ void ex2_x2(float* out) {
  uint32_t x[kChains];
  for (int c = 0; c < kChains; ++c) x[c] = (kBf16 ? 0x3f00bf00u : 0x3800b800u) ^ (threadIdx.x & 0xffu);
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (kBf16) {
        asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(x[c]));
      } else {
        asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(x[c]));
      }
    }
  uint32_t s = 0;
  for (int c = 0; c < kChains; ++c) s ^= x[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = static_cast<float>(s);
}

template <class Kernel>
float median_ms(Kernel kernel, float* out, int blocks, int threads) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best[5];
  kernel<<<blocks, threads>>>(out);  // warm-up
  for (float& ms : best) {
    cudaEventRecord(start);
    kernel<<<blocks, threads>>>(out);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    cudaEventElapsedTime(&ms, start, stop);
  }
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j)
      if (best[j] < best[i]) {
        const float t = best[i];
        best[i] = best[j];
        best[j] = t;
      }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best[2];
}

}  // namespace

int main() {
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const int blocks = sms * 4, threads = 512;
  float* out = nullptr;
  if (cudaMalloc(&out, sizeof(float) * blocks * threads) != cudaSuccess) return 1;
  const double instructions = double(blocks) * threads * kIters * kChains;
  struct Form {
    const char* name;
    float ms;
    int results_per_instruction;
  } forms[] = {{"ex2.approx.f32", median_ms(ex2_f32, out, blocks, threads), 1},
               {"ex2.approx.f16x2", median_ms(ex2_x2<false>, out, blocks, threads), 2},
               {"ex2.approx.bf16x2", median_ms(ex2_x2<true>, out, blocks, threads), 2}};
  for (const Form& f : forms) {
    const double per_sm_clock = instructions * f.results_per_instruction / (f.ms * 1e-3) / sms / (clock_khz * 1e3);
    std::printf("{\"probe\": \"exp2\", \"form\": \"%s\", \"ms\": %.3f, \"results_per_sm_per_clock\": %.2f, "
                "\"sms\": %d, \"clock_khz\": %d}\n",
                f.name, f.ms, per_sm_clock, sms, clock_khz);
  }
  cudaFree(out);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
