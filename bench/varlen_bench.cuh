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
#include <cstring>
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

// `flash4_bench --varlen-decode`: packed decode batches (keys packed and ragged: lengths spread over 0.5..1.5x the
// row's mean), GQA 32 / 8, head dim 128, bf16, causal, the rows of the KV-cache decode grid. Three calls per row:
// one query per sequence through the decode route; 1..4 queries per sequence (speculative decoding's verify step)
// through the route; the same ragged batch through the packed forward kernel (seqused_q, equal to the counts,
// keeps the route off). Prints JSON lines: microseconds and TB/s of K and V read.
inline void run_decode(int iters) {
  constexpr int kHeads = 32, kHeadsKv = 8, kDim = 128, kMaxQueries = 4;
  for (const auto& row : std::vector<std::array<int, 2>>{{1, 65536}, {1, 131072}, {8, 8192}, {8, 32768},
                                                         {64, 4096}, {128, 2048}}) {
    const int batch = row[0], mean = row[1];
    std::vector<int> cu_one = {0}, cu_ragged = {0}, counts, cu_k = {0};
    for (int b = 0; b < batch; ++b) {
      const double spread = 0.5 + ((b * 37) % batch + 0.5) / batch;
      cu_one.push_back(b + 1);
      counts.push_back(1 + (b * 3) % kMaxQueries);
      cu_ragged.push_back(cu_ragged.back() + counts.back());
      cu_k.push_back(cu_k.back() + static_cast<int>(mean * spread));
    }
    const int64_t total_k = cu_k.back(), rows = int64_t{batch} * kMaxQueries;
    __nv_bfloat16 *q, *k, *v, *out;
    float* lse;
    int *d_cu_one, *d_cu_ragged, *d_counts, *d_cu_k;
    CHECK(cudaMalloc(&q, size_t(rows) * kHeads * kDim * 2));
    CHECK(cudaMalloc(&out, size_t(rows) * kHeads * kDim * 2));
    CHECK(cudaMalloc(&k, size_t(total_k) * kHeadsKv * kDim * 2));
    CHECK(cudaMalloc(&v, size_t(total_k) * kHeadsKv * kDim * 2));
    CHECK(cudaMalloc(&lse, size_t(kHeads) * rows * 4));
    CHECK(cudaMalloc(&d_cu_one, (batch + 1) * 4));
    CHECK(cudaMalloc(&d_cu_ragged, (batch + 1) * 4));
    CHECK(cudaMalloc(&d_counts, batch * 4));
    CHECK(cudaMalloc(&d_cu_k, (batch + 1) * 4));
    fill_random<<<1024, 256>>>(q, size_t(rows) * kHeads * kDim, 11u);
    fill_random<<<1024, 256>>>(k, size_t(total_k) * kHeadsKv * kDim, 12u);
    fill_random<<<1024, 256>>>(v, size_t(total_k) * kHeadsKv * kDim, 13u);
    CHECK(cudaMemcpy(d_cu_one, cu_one.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_cu_ragged, cu_ragged.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_counts, counts.data(), batch * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_cu_k, cu_k.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    const flash4::Device dev = flash4::Device::cuda(0);
    const double bytes = 2.0 * total_k * kHeadsKv * kDim * 2;
    for (const char* impl : {"flash4_decode_route", "flash4_decode_route_ragged", "flash4_packed_kernel_ragged"}) {
      const bool ragged = std::strcmp(impl, "flash4_decode_route") != 0;
      const int64_t total_q = ragged ? cu_ragged.back() : batch;
      flash4::ForwardArgs a;
      a.q = flash4::make_view(q, flash4::DType::kBFloat16, dev, total_q, kHeads, kDim);
      a.out = flash4::make_view(out, flash4::DType::kBFloat16, dev, total_q, kHeads, kDim);
      a.k = flash4::make_view(k, flash4::DType::kBFloat16, dev, total_k, kHeadsKv, kDim);
      a.v = flash4::make_view(v, flash4::DType::kBFloat16, dev, total_k, kHeadsKv, kDim);
      a.lse = flash4::make_view(lse, flash4::DType::kFloat32, dev, kHeads, total_q);
      a.cu_seqlens_q = flash4::make_view(ragged ? d_cu_ragged : d_cu_one, flash4::DType::kInt32, dev, batch + 1);
      a.cu_seqlens_k = flash4::make_view(d_cu_k, flash4::DType::kInt32, dev, batch + 1);
      if (std::strstr(impl, "packed_kernel"))
        a.seqused_q = flash4::make_view(d_counts, flash4::DType::kInt32, dev, batch);
      a.max_seqlen_q = ragged ? kMaxQueries : 1;
      a.max_seqlen_k = 0;
      for (int b = 0; b < batch; ++b) a.max_seqlen_k = std::max<int64_t>(a.max_seqlen_k, cu_k[b + 1] - cu_k[b]);
      a.causal = true;
      const double ms = median_ms_of(1, iters, [&](int) { flash4::forward(a); });
      std::printf("{\"impl\": \"%s\", \"pass\": \"varlen_decode\", \"batch\": %d, \"mean_keys\": %d, "
                  "\"total_q\": %lld, \"total_k\": %lld, \"us\": %.2f, \"tb_s\": %.3f}\n",
                  impl, batch, mean, static_cast<long long>(total_q), static_cast<long long>(total_k), ms * 1e3,
                  bytes / ms / 1e9);
      std::fflush(stdout);
    }
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)lse, (void*)d_cu_one, (void*)d_cu_ragged,
                    (void*)d_counts, (void*)d_cu_k})
      cudaFree(p);
  }
}

}  // namespace varlen_bench
