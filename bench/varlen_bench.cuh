// `flash4_bench --varlen`: packed (variable-length) batches and the learnable sink, for the targets of the
// variable-length issue. One packed batch per (head dim, mask) of 16k tokens whose lengths are drawn from
// 128..4096 (fixed seed), heads x head_dim = 2048, timed forward and backward, and beside it the dense batch of
// the same FLOPs (n sequences of the root-mean-square length); then the sink's cost on the dense protocol shapes
// at 4k. FLOPs of a packed batch: the sum over its sequences (half under causal; backward 2.5x). Prints JSON lines.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace varlen_bench {

// Lengths from 128..4096 (a fixed linear congruential sequence) until 16384 tokens; the last one is cut to fit.
inline std::vector<int> draw_lengths(uint32_t seed) {
  std::vector<int> lens;
  int total = 0;
  while (total < 16384) {
    seed = seed * 1664525u + 1013904223u;
    int len = 128 + static_cast<int>((seed >> 8) % (4096 - 128 + 1));
    len = std::min(len, 16384 - total);
    lens.push_back(len);
    total += len;
  }
  return lens;
}

struct Packed {
  int total, heads, d;
  std::vector<int> lens;
  __nv_bfloat16 *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *sink, *dsink;
  int* cu;  // device (batch + 1)

  Packed(const std::vector<int>& lengths, int h, int head_dim) : total(0), heads(h), d(head_dim), lens(lengths) {
    std::vector<int> host_cu = {0};
    for (int l : lens) host_cu.push_back(total += l);
    const size_t n = size_t(total) * heads * d;
    uint32_t seed = 77u;
    for (__nv_bfloat16** p : {&q, &k, &v, &out, &dout, &dq, &dk, &dv}) {
      CHECK(cudaMalloc(p, n * 2));
      fill_random<<<1024, 256>>>(*p, n, seed++);
    }
    CHECK(cudaMalloc(&lse, size_t(heads) * total * 4));
    CHECK(cudaMalloc(&sink, heads * 4));
    CHECK(cudaMalloc(&dsink, heads * 4));
    std::vector<float> host_sink(heads);
    for (int i = 0; i < heads; ++i) host_sink[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    CHECK(cudaMemcpy(sink, host_sink.data(), heads * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&cu, host_cu.size() * 4));
    CHECK(cudaMemcpy(cu, host_cu.data(), host_cu.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
  }
  ~Packed() {
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)dout, (void*)dq, (void*)dk, (void*)dv,
                    (void*)lse, (void*)sink, (void*)dsink, (void*)cu})
      cudaFree(p);
  }
  int max_len() const { return *std::max_element(lens.begin(), lens.end()); }
  double flops(bool causal) const {
    double f = 0;
    for (int l : lens) f += 4.0 * heads * double(l) * l * d;
    return causal ? f / 2 : f;
  }
  flash4::TensorView rows(__nv_bfloat16* p) const {
    return flash4::make_view(p, flash4::DType::kBFloat16, flash4::Device::cuda(0), total, heads, d);
  }
  flash4::ForwardArgs forward_args(bool causal, bool with_sink) const {
    flash4::ForwardArgs a;
    a.q = rows(q), a.k = rows(k), a.v = rows(v), a.out = rows(out);
    a.lse = flash4::TensorView{lse, flash4::DType::kFloat32, flash4::Device::cuda(0), 2, {heads, total}, {total, 1}};
    a.cu_seqlens_q = flash4::TensorView{cu, flash4::DType::kInt32, flash4::Device::cuda(0), 1,
                                        {static_cast<int64_t>(lens.size()) + 1}, {1}};
    a.cu_seqlens_k = a.cu_seqlens_q;
    a.max_seqlen_q = a.max_seqlen_k = max_len();
    a.causal = causal;
    if (with_sink) a.learnable_sink = flash4::TensorView{sink, flash4::DType::kFloat32, flash4::Device::cuda(0), 1, {heads}, {1}};
    return a;
  }
  flash4::BackwardArgs backward_args(bool causal, bool with_sink) const {
    const flash4::ForwardArgs f = forward_args(causal, with_sink);
    flash4::BackwardArgs a;
    a.q = f.q, a.k = f.k, a.v = f.v, a.out = f.out, a.lse = f.lse, a.dout = rows(dout);
    a.dq = rows(dq), a.dk = rows(dk), a.dv = rows(dv);
    a.cu_seqlens_q = f.cu_seqlens_q, a.cu_seqlens_k = f.cu_seqlens_k;
    a.max_seqlen_q = f.max_seqlen_q, a.max_seqlen_k = f.max_seqlen_k;
    a.causal = causal;
    if (with_sink) {
      a.learnable_sink = f.learnable_sink;
      a.dsink = flash4::TensorView{dsink, flash4::DType::kFloat32, flash4::Device::cuda(0), 1, {heads}, {1}};
    }
    return a;
  }
};

inline void print(const char* impl, const char* pass, int d, bool causal, int batch, int total, double ms,
                  double flops, const char* extra = "") {
  std::printf("{\"impl\": \"%s\", \"pass\": \"%s\", \"d\": %d, \"causal\": %s, \"batch\": %d, \"tokens\": %d, "
              "\"ms\": %.4f, \"tflops\": %.1f%s}\n",
              impl, pass, d, causal ? "true" : "false", batch, total, ms, flops / ms / 1e9, extra);
  std::fflush(stdout);
}

inline void run(int iters) {
  const std::vector<int> lens = draw_lengths(2026u);
  for (int d : {64, 128, 256}) {
    const int h = 2048 / d;
    const Packed packed(lens, h, d);
    // The dense batch of the same FLOPs: n sequences of the root-mean-square length (a multiple of 8).
    double sq = 0;
    for (int l : lens) sq += double(l) * l;
    const int rms = std::max(8, static_cast<int>(std::lround(std::sqrt(sq / lens.size()) / 8)) * 8);
    const Inputs dense(Shape{static_cast<int>(lens.size()), rms, h, d, false});
    const Inputs dense_causal(Shape{static_cast<int>(lens.size()), rms, h, d, true});
    for (bool causal : {false, true}) {
      const Inputs& dn = causal ? dense_causal : dense;
      const double packed_flops = packed.flops(causal);
      const double dense_flops = (causal ? 2.0 : 4.0) * lens.size() * h * double(rms) * rms * d;
      const int n = static_cast<int>(lens.size());
      // With and without the sink in the order A B B A, each the mean of its two medians: clocks that drift
      // over the run (the power cap) then weigh on both alike.
      auto abba = [&](auto time_of) {
        double ms[2] = {0, 0};
        for (bool sink : {false, true, true, false}) ms[sink] += time_of(sink) / 2;
        return std::array<double, 2>{ms[0], ms[1]};
      };
      const std::array<double, 2> fwd_ms = abba([&](bool sink) {
        const flash4::ForwardArgs fa = packed.forward_args(causal, sink);
        return median_ms_of(1, iters, [&](int) { flash4::forward(fa); });
      });
      for (bool sink : {false, true})
        print(sink ? "flash4_varlen_sink" : "flash4_varlen", "forward", d, causal, n, packed.total, fwd_ms[sink],
              packed_flops);
      print("flash4_dense_same_flops", "forward", d, causal, n, n * rms,
            median_ms_of(dn.sets(), iters, [&](int set) { flash4::forward(dn.args(set, {})); }), dense_flops);
      const std::array<double, 2> bwd_ms = abba([&](bool sink) {
        flash4::forward(packed.forward_args(causal, sink));  // out / lse for the backward
        const flash4::BackwardArgs ba = packed.backward_args(causal, sink);
        return median_ms_of(1, iters, [&](int) { flash4::backward(ba); });
      });
      for (bool sink : {false, true})
        print(sink ? "flash4_varlen_sink" : "flash4_varlen", "backward", d, causal, n, packed.total, bwd_ms[sink],
              2.5 * packed_flops);
      dn.prepare_backward();
      print("flash4_dense_same_flops", "backward", d, causal, n, n * rms,
            median_ms_of(dn.sets(), iters, [&](int set) { flash4::backward(dn.backward_args(set, false)); }),
            2.5 * dense_flops);
    }
  }
}

}  // namespace varlen_bench
