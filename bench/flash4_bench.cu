// Times flash4's GPU forward on the benchmark shapes of ../shared/facts.md with CUDA events: warm-up, median of
// `iters` runs, several input sets rotated so that the working set exceeds L2. Prints one JSON object per line.
// Usage: flash4_bench [--iters N] [--rounds R] [--warm-ms MS] [--ablation] [--candidates] [--backward] [--shape D:S:CAUSAL]
//                     [--seqlens S1,S2,...] [--dims D1,D2,...] [--shapes B:S:H:HKV:D:CAUSAL,...]
//                     [--host] [--varlen] [--decode [--decode-splits 0,1,8] [--decode-row B:S]] [--fp8]
//   --shapes: these forward / backward shapes (kv heads HKV) instead of the 16k-token protocol's.
//   --dims: head dims (default 64,128,256; 96 and 192 run on their own kernels); heads = 2048 / d
//           rounded to the nearest integer (21 at d = 96, 11 at 192), FLOPs counted with the heads used.
//   --warm-ms: warm-up per timing in ms of wall time (default 150; see g_warm_ms).
//   --backward: times flash4::backward (and its deterministic mode) instead; FLOPs = 2.5 x forward.
//   --ablation: at seqlen 8k, kernel variants that switch the pipeline ideas off one by one (compiled here only).
//   --candidates: at every seqlen, other tile shapes and launch modes for the tile table (compiled here only).
//   --host: host microseconds per call of forward / backward on a tiny problem and of their parts (host_costs.cuh).
//   --varlen: packed batches (lengths 128..4096, 16k tokens) and the learnable sink, forward and backward, beside
//             the dense batch of the same FLOPs (varlen_bench.cuh).
//   --fp8: the FP8 (e4m3) forward beside bf16 at d = 128 and 256 over --seqlens (fp8_bench.cuh).
//   --decode: KV-cache decode (issue #19's rows, contiguous and paged caches, graph replay, single-call latency)
//             and chunked prefill (decode_bench.cuh); --decode-splits times each listed split count (0 = auto).
//   --decode-route-sweep: KV-cache calls of 8..128 queries, the library's route against the decode kernel forced.
//   --decode-mixed: a prefill chunk beside decode steps as packed queries, three ways (decode_mixed_bench.cuh).
// flash4 vs cuDNN in one process: bench/sdpa_bench.py with the Python package installed.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "api/backends.h"
#include "flash4/api.h"
#include "kernels/sm90/fwd/fwd_launch.cuh"
#include "kernels/sm90/fwd/fwd_params_builder.h"
#include "host_costs.cuh"

namespace {

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                      \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

// Element i of a hashed uniform sequence, scaled to about unit variance.
__device__ __forceinline__ float random_unit(size_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return (static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f) * 3.4f;
}

__global__ void fill_random(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(random_unit(i, seed));
}

struct Shape {
  int b, s, h, d;
  bool causal;
  int hkv = 0;  // kv heads (GQA / MQA); 0 = h
  int kv_heads() const { return hkv > 0 ? hkv : h; }
};

using Launcher = void (*)(const flash4::ForwardArgs&);

// Random bf16 input sets for one shape, rotated so that consecutive runs do not hit in L2 (> 200 MB in all).
class Inputs {
 public:
  explicit Inputs(const Shape& sh) : sh_(sh) {
    const size_t n = size_t(sh.b) * sh.s * sh.h * sh.d;
    sets_ = static_cast<int>(std::max<size_t>(1, (200u << 20) / (kPerSet * n * 2) + 1));
    buf_.resize(kPerSet * sets_);
    for (int i = 0; i < kPerSet * sets_; ++i) {
      CHECK(cudaMalloc(&buf_[i], n * 2));
      fill_random<<<1024, 256>>>(buf_[i], n, 1234u + i);
    }
    lse_.resize(sets_);
    for (auto& l : lse_) CHECK(cudaMalloc(&l, size_t(sh.b) * sh.h * sh.s * 4));
    CHECK(cudaDeviceSynchronize());
  }
  ~Inputs() {
    for (auto* p : buf_) cudaFree(p);
    for (auto* l : lse_) cudaFree(l);
  }
  static constexpr int kPerSet = 8;
  int sets() const { return sets_; }
  // Backward arguments of a set whose out / lse a forward has produced (see prepare_backward).
  flash4::BackwardArgs backward_args(int set, bool deterministic) const {
    const flash4::ForwardArgs f = args(set, {});
    flash4::BackwardArgs a;
    auto view = [&](void* p, int heads) {
      return flash4::make_view(p, flash4::DType::kBFloat16, flash4::Device::cuda(0), sh_.b, sh_.s, heads, sh_.d);
    };
    a.q = f.q, a.k = f.k, a.v = f.v, a.out = f.out, a.lse = f.lse;
    a.dout = view(buf_[kPerSet * set + 4], sh_.h);
    a.dq = view(buf_[kPerSet * set + 5], sh_.h);
    a.dk = view(buf_[kPerSet * set + 6], sh_.kv_heads());
    a.dv = view(buf_[kPerSet * set + 7], sh_.kv_heads());
    a.causal = sh_.causal;
    a.deterministic = deterministic;
    return a;
  }
  void prepare_backward() const {
    for (int i = 0; i < sets_; ++i) flash4::forward(args(i, {}));
    CHECK(cudaDeviceSynchronize());
  }
  flash4::ForwardArgs args(int set, flash4::Tuning tuning) const {
    flash4::ForwardArgs a;
    auto view = [&](void* p, int heads) {
      return flash4::make_view(p, flash4::DType::kBFloat16, flash4::Device::cuda(0), sh_.b, sh_.s, heads, sh_.d);
    };
    a.q = view(buf_[kPerSet * set], sh_.h);
    a.k = view(buf_[kPerSet * set + 1], sh_.kv_heads());
    a.v = view(buf_[kPerSet * set + 2], sh_.kv_heads());
    a.out = view(buf_[kPerSet * set + 3], sh_.h);
    a.lse = flash4::make_view(lse_[set], flash4::DType::kFloat32, flash4::Device::cuda(0), sh_.b, sh_.h, sh_.s);
    a.causal = sh_.causal;
    a.tuning = tuning;
    return a;
  }

 private:
  Shape sh_;
  int sets_ = 1;
  std::vector<__nv_bfloat16*> buf_;  // per set: q, k, v, out, dout, dq, dk, dv
  std::vector<float*> lse_;
};

// Warm-up before each timing, in ms of wall time of the call being timed (--warm-ms; at least 3 calls): the H200
// runs these kernels at its 700 W power cap with the SM clock between ~1650 and 1980 MHz, so a call timed right
// after a lighter one starts from a higher clock (identical kernels measured 574 vs 630 TFLOP/s by their place in
// a round, docs/performance.md "Same SASS, different speed: the power cap").
double g_warm_ms = 150.0;

// Median per-call GPU time (ms) of `iters` calls of run(set), after warm-up. Calls are issued back to back (the
// CPU runs ahead, as in a training loop), each between its own pair of events; one synchronization at the end.
template <class Run>
double median_ms_of(int sets, int iters, Run run) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 3 && elapsed >= g_warm_ms) break;
    run(i % sets);
    if (i % 4 == 3) CHECK(cudaDeviceSynchronize());
  }
  CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> start(iters), stop(iters);
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventCreate(&start[i]));
    CHECK(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(start[i]));
    run(i % sets);
    CHECK(cudaEventRecord(stop[i]));
  }
  CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventElapsedTime(&ms[i], start[i], stop[i]));
    cudaEventDestroy(start[i]);
    cudaEventDestroy(stop[i]);
  }
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

double median_ms(const Inputs& in, int iters, flash4::Tuning tuning, Launcher launch) {
  return median_ms_of(in.sets(), iters, [&](int set) { launch(in.args(set, tuning)); });
}

void library_forward(const flash4::ForwardArgs& a) { flash4::forward(a); }

struct Variant {
  std::string name;
  flash4::Tuning tuning;
  Launcher launch;
};

}  // namespace

#include "fwd_variants.cuh"
#include "varlen_bench.cuh"
#include "decode_bench.cuh"
#include "decode_mixed_bench.cuh"
#include "fp8_bench.cuh"

namespace {
// "1,4,16" -> {1, 4, 16}.
std::vector<int> parse_ints(const char* c) {
  std::vector<int> out;
  while (*c) {
    char* end = nullptr;
    out.push_back(static_cast<int>(std::strtol(c, &end, 10)));
    if (end == c) break;
    c = *end == ',' ? end + 1 : end;
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  int iters = 30, rounds = 1;
  bool ablation = false, backward = false, candidates = false, host = false, varlen = false, decode = false;
  bool fp8 = false, varlen_decode = false, decode_route_sweep = false, decode_mixed = false;
  std::vector<int> decode_splits = {0};
  int decode_only_batch = 0, decode_only_seqlen = 0;  // --decode-row B:S times that decode row alone (profilers)
  int only_d = 0, only_s = 0, only_causal = -1;  // --shape D:S:C selects one shape (for profilers)
  std::vector<Shape> listed_shapes;               // --shapes: these instead of the protocol's
  std::vector<int> seqlens = {512, 1024, 2048, 4096, 8192, 16384};  // --seqlens 1024,4096,16384 selects some
  std::vector<int> dims = {64, 128, 256};                            // --dims 96,192 selects others
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
      std::sscanf(argv[++i], "%d:%d:%d", &only_d, &only_s, &only_causal);
      continue;
    }
    if (!std::strcmp(argv[i], "--seqlens") && i + 1 < argc) {
      seqlens = parse_ints(argv[++i]);
      continue;
    }
    if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) {  // b:s:h:hkv:d:causal,...
      for (const char* c = argv[++i]; *c;) {
        Shape sh{};
        int causal = 0, used = 0;
        if (std::sscanf(c, "%d:%d:%d:%d:%d:%d%n", &sh.b, &sh.s, &sh.h, &sh.hkv, &sh.d, &causal, &used) != 6) break;
        sh.causal = causal != 0;
        listed_shapes.push_back(sh);
        c += used;
        if (*c == ',') ++c;
      }
      continue;
    }
    if (!std::strcmp(argv[i], "--dims") && i + 1 < argc) {
      dims = parse_ints(argv[++i]);
      continue;
    }
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--warm-ms") && i + 1 < argc) g_warm_ms = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--ablation")) ablation = true;
    else if (!std::strcmp(argv[i], "--candidates")) candidates = true;
    else if (!std::strcmp(argv[i], "--backward")) backward = true;
    else if (!std::strcmp(argv[i], "--host")) host = true;
    else if (!std::strcmp(argv[i], "--varlen")) varlen = true;
    else if (!std::strcmp(argv[i], "--decode")) decode = true;
    else if (!std::strcmp(argv[i], "--decode-route-sweep")) decode_route_sweep = true;
    else if (!std::strcmp(argv[i], "--decode-mixed")) decode_mixed = true;
    else if (!std::strcmp(argv[i], "--varlen-decode")) varlen_decode = true;
    else if (!std::strcmp(argv[i], "--fp8")) fp8 = true;
    else if (!std::strcmp(argv[i], "--decode-splits") && i + 1 < argc) decode_splits = parse_ints(argv[++i]);
    else if (!std::strcmp(argv[i], "--decode-row") && i + 1 < argc)
      std::sscanf(argv[++i], "%d:%d", &decode_only_batch, &decode_only_seqlen);
  }
  if (varlen) {
    varlen_bench::run(iters);
    return 0;
  }
  if (varlen_decode) {
    varlen_bench::run_decode(iters);
    return 0;
  }
  if (fp8) {
    fp8_bench::run(seqlens, iters, rounds);
    return 0;
  }
  if (decode_route_sweep) {
    decode_bench::run_route_sweep(iters);
    return 0;
  }
  if (decode_mixed) {
    decode_mixed_bench::run(iters);
    return 0;
  }
  if (decode) {
    decode_bench::run(iters, decode_splits, decode_only_batch, decode_only_seqlen);
    return 0;
  }
  if (host) {
    const Inputs tiny(Shape{1, 128, 2, 64, true});
    tiny.prepare_backward();
    host_costs::run(tiny.args(0, {}), tiny.backward_args(0, false));
    return 0;
  }
  std::vector<Shape> shapes = listed_shapes;
  for (int d : listed_shapes.empty() ? dims : std::vector<int>{}) {
    if (d <= 0) continue;
    for (int s : seqlens)
      for (bool causal : {false, true}) shapes.push_back({16384 / s, s, std::max(1, (2048 + d / 2) / d), d, causal});
  }
  for (const Shape& sh : shapes) {
    if (ablation && sh.s != 8192) continue;
    if (only_d && (sh.d != only_d || sh.s != only_s || int(sh.causal) != only_causal)) continue;
    if (backward) {
      {
        const Inputs probe_inputs(Shape{1, 128, sh.h, sh.d, sh.causal});
        const flash4::Support support = flash4::can_implement(probe_inputs.backward_args(0, false));
        if (!support) {
          std::fprintf(stderr, "skipping d=%d backward: %s\n", sh.d, support.reason.c_str());
          continue;
        }
      }
      const Inputs inputs(sh);
      inputs.prepare_backward();
      double flops = 2.5 * 4.0 * sh.b * sh.h * double(sh.s) * sh.s * sh.d;
      if (sh.causal) flops /= 2;
      for (bool deterministic : {false, true}) {
        const double ms = median_ms_of(inputs.sets(), iters, [&](int set) {
          flash4::backward(inputs.backward_args(set, deterministic));
        });
        std::printf("{\"impl\": \"%s\", \"pass\": \"backward\", \"b\": %d, \"s\": %d, \"h\": %d, \"hkv\": %d, "
                    "\"d\": %d, \"causal\": %s, \"ms\": %.4f, \"tflops\": %.1f}\n",
                    deterministic ? "flash4_deterministic" : "flash4", sh.b, sh.s, sh.h, sh.kv_heads(), sh.d,
                    sh.causal ? "true" : "false", ms, flops / ms / 1e9);
        std::fflush(stdout);
      }
      continue;
    }
    std::vector<Variant> variants = {{"flash4", {}, &library_forward}};
    if (ablation) {
      auto more = fwd_variants::ablation(sh);
      variants.insert(variants.end(), more.begin(), more.end());
    }
    if (candidates) {
      auto more = fwd_variants::tile_candidates(sh);
      variants.insert(variants.end(), more.begin(), more.end());
    }
    // Kernel variants exist for 64, 96, 128 and 256 only.
    variants.erase(std::remove_if(variants.begin(), variants.end(), [](const Variant& v) { return v.launch == nullptr; }),
                   variants.end());
    const Inputs inputs(sh);
    // Rounds interleave the variants so that clock and thermal drift hit all of them alike.
    std::vector<std::vector<double>> times(variants.size());
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < variants.size(); ++i)
        times[i].push_back(median_ms(inputs, iters, variants[i].tuning, variants[i].launch));
    double flops = 4.0 * sh.b * sh.h * double(sh.s) * sh.s * sh.d;
    if (sh.causal) flops /= 2;
    for (size_t i = 0; i < variants.size(); ++i) {
      auto t = times[i];
      std::sort(t.begin(), t.end());
      const double ms = t[t.size() / 2];
      std::printf("{\"impl\": \"%s\", \"b\": %d, \"s\": %d, \"h\": %d, \"hkv\": %d, \"d\": %d, \"causal\": %s, "
                  "\"ms\": %.4f, \"tflops\": %.1f, \"tflops_min\": %.1f, \"tflops_max\": %.1f}\n",
                  variants[i].name.c_str(), sh.b, sh.s, sh.h, sh.kv_heads(), sh.d, sh.causal ? "true" : "false", ms, flops / ms / 1e9,
                  flops / t.back() / 1e9, flops / t.front() / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}
