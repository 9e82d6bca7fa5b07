// `flash4_bench --decode`: KV-cache decode for the targets of issue #19 (GQA 32/8, head_dim 128, bf16, one query
// token): rows 1x8k .. 128x2k, contiguous and paged caches (pages of 256 and 16 rows, shuffled in the pool),
// through flash4::forward_kvcache; the same rows through the dense forward (flash4::forward, its decode route);
// then chunked prefill (512 queries against a 32k cache, causal) through forward_kvcache and the dense forward.
// Per row: the median kernel time of back-to-back calls (CUDA events; enough cache copies rotated that the working
// set exceeds L2), the KV read bandwidth (K and V bytes / time), the median of synchronized single calls (host
// wall clock, host cost included) and of CUDA-graph replays. --decode-splits 0,1,4 times each split count
// (0 = the library's choice). The layout "head_major" stores the contiguous cache as (batch, hkv, seqlen, d) (the
// same logical tensor through strides): each CTA then streams one contiguous range instead of 256-byte rows 2 KB
// apart, which shows what the access pattern costs. "v_skewed" puts V right after K in one allocation, 7 KB off
// the allocation granularity, so that K row j and V row j do not share their low address bits (DRAM bank
// conflicts between the two streams would show there). Prints JSON lines.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flash4/kvcache.h"
#include "kernels/sm90/decode/decode_config.h"

namespace decode_bench {

constexpr int kHeads = 32, kHeadsKv = 8, kHeadDim = 128;

struct Row {
  int batch, seqlen;
};
constexpr int kHeadMajor = -1;  // the `page` of a head-major contiguous cache
constexpr int kVSkewed = -2;    // the `page` of a contiguous cache whose V follows K in one buffer, 7 KB off
const Row kRows[] = {{1, 8192}, {1, 65536}, {1, 131072}, {8, 8192}, {8, 32768}, {32, 16384}, {64, 4096}, {128, 2048}};

__nv_bfloat16* random_bf16(size_t n, uint32_t seed) {
  __nv_bfloat16* p = nullptr;
  CHECK(cudaMalloc(&p, std::max<size_t>(n, 8) * 2));
  fill_random<<<1024, 256>>>(p, n, seed);
  return p;
}

// One cache copy (contiguous (batch, seqlen, hkv, d), or a pool of shuffled pages with its block table) and the
// call's other tensors.
struct Set {
  __nv_bfloat16 *q, *k, *v, *out;
  int *seqlens = nullptr, *table = nullptr;
  bool v_in_k_buffer = false;  // v points into k's allocation (kVSkewed): freed with it
  flash4::KvCacheArgs args;
};

class Caches {
 public:
  // page = 0: contiguous; kHeadMajor: contiguous, stored head-major. seqlen_q queries per sequence (causal when > 1).
  Caches(const Row& r, int page, int seqlen_q) {
    const size_t kv = size_t(r.batch) * r.seqlen * kHeadsKv * kHeadDim;
    const size_t set_bytes = 2 * kv * 2;
    const int sets = static_cast<int>(std::max<size_t>(1, (200u << 20) / set_bytes + 1));
    std::mt19937 rng(7);
    for (int i = 0; i < sets; ++i) {
      Set s;
      s.q = random_bf16(size_t(r.batch) * seqlen_q * kHeads * kHeadDim, 11u + i);
      if (page == kVSkewed) {
        constexpr size_t kSkew = 3584;  // elements: 7 KB
        s.k = random_bf16(2 * kv + kSkew, 100u + 2 * i);
        s.v = s.k + kv + kSkew;
        s.v_in_k_buffer = true;
      } else {
        s.k = random_bf16(kv, 100u + 2 * i);
        s.v = random_bf16(kv, 101u + 2 * i);
      }
      CHECK(cudaMalloc(&s.out, size_t(r.batch) * seqlen_q * kHeads * kHeadDim * 2));
      const std::vector<int> lengths(r.batch, r.seqlen);
      CHECK(cudaMalloc(&s.seqlens, r.batch * 4));
      CHECK(cudaMemcpy(s.seqlens, lengths.data(), r.batch * 4, cudaMemcpyHostToDevice));
      const flash4::Device dev = flash4::Device::cuda(0);
      flash4::KvCacheArgs& a = s.args;
      a.q = flash4::make_view(s.q, flash4::DType::kBFloat16, dev, r.batch, seqlen_q, kHeads, kHeadDim);
      a.out = flash4::make_view(s.out, flash4::DType::kBFloat16, dev, r.batch, seqlen_q, kHeads, kHeadDim);
      a.cache_seqlens = flash4::make_view(s.seqlens, flash4::DType::kInt32, dev, r.batch);
      a.causal = seqlen_q > 1;
      if (page <= 0) {  // contiguous, head-major or V-skewed
        a.k_cache = flash4::make_view(s.k, flash4::DType::kBFloat16, dev, r.batch, r.seqlen, kHeadsKv, kHeadDim);
        a.v_cache = flash4::make_view(s.v, flash4::DType::kBFloat16, dev, r.batch, r.seqlen, kHeadsKv, kHeadDim);
        if (page == kHeadMajor)
          for (flash4::TensorView* t : {&a.k_cache, &a.v_cache}) {
            t->stride[1] = kHeadDim;
            t->stride[2] = int64_t{r.seqlen} * kHeadDim;
          }
      } else {
        const int pages_per_seq = r.seqlen / page, pages = r.batch * pages_per_seq;
        std::vector<int> table(pages);
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng);  // pages anywhere in the pool, in any order
        CHECK(cudaMalloc(&s.table, pages * 4));
        CHECK(cudaMemcpy(s.table, table.data(), pages * 4, cudaMemcpyHostToDevice));
        a.k_cache = flash4::make_view(s.k, flash4::DType::kBFloat16, dev, pages, page, kHeadsKv, kHeadDim);
        a.v_cache = flash4::make_view(s.v, flash4::DType::kBFloat16, dev, pages, page, kHeadsKv, kHeadDim);
        a.block_table = flash4::make_view(s.table, flash4::DType::kInt32, dev, r.batch, pages_per_seq);
      }
      sets_.push_back(s);
    }
    CHECK(cudaDeviceSynchronize());
  }
  ~Caches() {
    for (Set& s : sets_)
      for (void* p : {(void*)s.q, (void*)s.k, (void*)s.v, (void*)s.out, (void*)s.seqlens, (void*)s.table})
        if (!(s.v_in_k_buffer && p == s.v)) cudaFree(p);
  }
  int count() const { return static_cast<int>(sets_.size()); }
  Set& set(int i) { return sets_[i]; }
  // The same tensors as a dense forward (contiguous caches only): k, v (batch, seqlen, hkv, d).
  flash4::ForwardArgs dense_args(int i) const {
    const flash4::KvCacheArgs& a = sets_[i].args;
    flash4::ForwardArgs f;
    f.q = a.q;
    f.k = a.k_cache;
    f.v = a.v_cache;
    f.out = a.out;
    f.causal = a.causal;
    return f;
  }

 private:
  std::vector<Set> sets_;
};

// Median wall-clock microseconds of a synchronized single call (the latency a serving loop sees per step).
template <class Call>
double single_call_us(Call call, int iters) {
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call(i);
    CHECK(cudaDeviceSynchronize());
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Median kernel time of CUDA-graph replays of one captured call per set.
template <class Call>
double graph_us(int sets, int iters, Call call) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<cudaGraphExec_t> execs(sets);
  for (int i = 0; i < sets; ++i) {
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    call(i, stream);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&execs[i], graph, 0));
    CHECK(cudaGraphDestroy(graph));
  }
  const double ms = median_ms_of(sets, iters, [&](int i) { CHECK(cudaGraphLaunch(execs[i], nullptr)); });
  for (auto e : execs) cudaGraphExecDestroy(e);
  cudaStreamDestroy(stream);
  return ms * 1e3;
}

inline void print_row(const char* impl, const std::string& layout, const Row& r, int seqlen_q, int splits,
                      double us, double us_single, double us_graph) {
  const double kv_bytes = 2.0 * r.batch * r.seqlen * kHeadsKv * kHeadDim * 2;
  double flops = 4.0 * r.batch * kHeads * kHeadDim * double(seqlen_q) * r.seqlen;
  if (seqlen_q > 1) flops -= 2.0 * r.batch * kHeads * kHeadDim * double(seqlen_q) * (seqlen_q - 1);  // causal
  std::printf("{\"bench\": \"decode\", \"impl\": \"%s\", \"layout\": \"%s\", \"b\": %d, \"s\": %d, \"sq\": %d, "
              "\"h\": %d, \"hkv\": %d, \"d\": %d, \"splits\": %d, \"us\": %.2f, \"tbps\": %.3f, \"tflops\": %.1f, "
              "\"us_single\": %.2f, \"us_graph\": %.2f}\n",
              impl, layout.c_str(), r.batch, r.seqlen, seqlen_q, kHeads, kHeadsKv, kHeadDim, splits, us,
              kv_bytes / us / 1e6, flops / us / 1e6, us_single, us_graph);
  std::fflush(stdout);
}

// only_batch > 0 (--decode-row B:S): that row alone, contiguous cache only and no chunked prefill, for profilers.
inline void run(int iters, const std::vector<int>& split_counts, int only_batch = 0, int only_seqlen = 0) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<Row> rows(std::begin(kRows), std::end(kRows));
  if (only_batch > 0) rows = {Row{only_batch, only_seqlen}};
  const std::vector<int> pages =
      only_batch > 0 ? std::vector<int>{0} : std::vector<int>{0, kHeadMajor, kVSkewed, 256, 16};
  for (const Row& r : rows) {
    for (int page : pages) {
      Caches caches(r, page, 1);
      const std::string layout =
          page == 0            ? "contiguous"
          : page == kHeadMajor ? "head_major"
          : page == kVSkewed   ? "v_skewed"
                               : "paged" + std::to_string(page);
      for (int splits : split_counts) {
        for (int i = 0; i < caches.count(); ++i) caches.set(i).args.num_splits = splits;
        const int chosen = flash4::sm90::decode::decode_num_splits(splits, sms, r.batch, kHeadsKv, kHeads / kHeadsKv,
                                                                   kHeadDim, r.seqlen);
        auto call = [&](int i) { flash4::forward_kvcache(caches.set(i % caches.count()).args); };
        const double us = median_ms_of(caches.count(), iters, call) * 1e3;
        const double single = single_call_us(call, 20);
        const double graph = graph_us(caches.count(), iters, [&](int i, cudaStream_t s) {
          flash4::forward_kvcache(caches.set(i).args, s);
        });
        print_row("flash4_kvcache", layout, r, 1, chosen, us, single, graph);
      }
      if (page == 0) {  // the dense forward's decode route on the same tensors
        auto dense = [&](int i) { flash4::forward(caches.dense_args(i % caches.count())); };
        const double us = median_ms_of(caches.count(), iters, dense) * 1e3;
        print_row("flash4_forward", "dense", r, 1, 0, us, single_call_us(dense, 20), 0.0);
      }
    }
  }
  if (only_batch > 0) return;
  // Chunked prefill: 512 queries (causal, the last positions) against a 32k cache.
  const Row chunk{1, 32768};
  for (int page : {0, 256}) {
    Caches caches(chunk, page, 512);
    auto call = [&](int i) { flash4::forward_kvcache(caches.set(i % caches.count()).args); };
    const double us = median_ms_of(caches.count(), iters, call) * 1e3;
    print_row("flash4_kvcache", page == 0 ? "contiguous" : "paged256", chunk, 512, 0, us, single_call_us(call, 10),
              0.0);
    if (page == 0) {
      auto dense = [&](int i) { flash4::forward(caches.dense_args(i % caches.count())); };
      print_row("flash4_forward", "dense", chunk, 512, 0, median_ms_of(caches.count(), iters, dense) * 1e3,
                single_call_us(dense, 10), 0.0);
    }
  }
}

// --decode-route-sweep: where a KV-cache call should leave the decode kernel for the dense one. The route sends a
// call to the decode kernel when seqlen_q <= 16 and seqlen_q x group <= 128 rows per KV head, or when the dense
// kernel's batch x heads CTAs fill at most half the SMs over 16k keys or more and batch x heads x seqlen_q <= 2048
// (common/decode_rows.h); beyond that
// the dense kernel's 128-row tiles hold a group's few queries and read K / V once per query head. Per (cache, group, seqlen_q): the library's route against the decode kernel forced by a zero
// cache_leftpad (which the dense route refuses; no key moves), contiguous caches, causal, two alternating rounds.
inline void run_route_sweep(int iters) {
  const flash4::Device dev = flash4::Device::cuda(0);
  for (const Row& r : {Row{8, 8192}, Row{1, 32768}, Row{32, 2048}, Row{1, 16384}, Row{2, 16384}, Row{4, 16384}}) {
    for (int heads : {32, 64}) {  // GQA 4:1 and 8:1 over 8 KV heads
      const size_t kv = size_t(r.batch) * r.seqlen * kHeadsKv * kHeadDim;
      const int sets = static_cast<int>(std::max<size_t>(1, (200u << 20) / (4 * kv) + 1));
      std::vector<__nv_bfloat16*> k(sets), v(sets);
      for (int i = 0; i < sets; ++i) {
        k[i] = random_bf16(kv, 300u + 2 * i);
        v[i] = random_bf16(kv, 301u + 2 * i);
      }
      int *lengths = nullptr, *zeros = nullptr;
      const std::vector<int> host_lengths(r.batch, r.seqlen);
      CHECK(cudaMalloc(&lengths, r.batch * 4));
      CHECK(cudaMalloc(&zeros, r.batch * 4));
      CHECK(cudaMemcpy(lengths, host_lengths.data(), r.batch * 4, cudaMemcpyHostToDevice));
      CHECK(cudaMemset(zeros, 0, r.batch * 4));
      for (int seqlen_q : {4, 8, 12, 16, 24, 32, 48, 64, 128}) {
        const size_t q_elems = size_t(r.batch) * seqlen_q * heads * kHeadDim;
        __nv_bfloat16* q = random_bf16(q_elems, 17u);
        __nv_bfloat16* out = nullptr;
        CHECK(cudaMalloc(&out, q_elems * 2));
        auto args = [&](int i, bool forced) {
          flash4::KvCacheArgs a;
          a.q = flash4::make_view(q, flash4::DType::kBFloat16, dev, r.batch, seqlen_q, heads, kHeadDim);
          a.out = flash4::make_view(out, flash4::DType::kBFloat16, dev, r.batch, seqlen_q, heads, kHeadDim);
          a.k_cache = flash4::make_view(k[i], flash4::DType::kBFloat16, dev, r.batch, r.seqlen, kHeadsKv, kHeadDim);
          a.v_cache = flash4::make_view(v[i], flash4::DType::kBFloat16, dev, r.batch, r.seqlen, kHeadsKv, kHeadDim);
          a.cache_seqlens = flash4::make_view(lengths, flash4::DType::kInt32, dev, r.batch);
          if (forced) a.cache_leftpad = flash4::make_view(zeros, flash4::DType::kInt32, dev, r.batch);
          a.causal = true;
          return a;
        };
        const double kv_bytes = 4.0 * kv, flops = 4.0 * r.batch * heads * kHeadDim * double(seqlen_q) * r.seqlen;
        for (int round = 0; round < 2; ++round) {  // alternating, so that drift hits both
          for (bool forced : {false, true}) {
            const double us = median_ms_of(sets, iters, [&](int i) { flash4::forward_kvcache(args(i, forced)); }) * 1e3;
            std::printf("{\"bench\": \"decode_route\", \"impl\": \"%s\", \"b\": %d, \"s\": %d, \"sq\": %d, "
                        "\"h\": %d, \"hkv\": %d, \"d\": %d, \"round\": %d, \"us\": %.2f, \"tbps\": %.3f, "
                        "\"tflops\": %.1f}\n",
                        forced ? "decode_kernel" : "route", r.batch, r.seqlen, seqlen_q, heads, kHeadsKv, kHeadDim,
                        round, us, kv_bytes / us / 1e6, flops / us / 1e6);
            std::fflush(stdout);
          }
        }
        CHECK(cudaFree(q));
        CHECK(cudaFree(out));
      }
      for (int i = 0; i < sets; ++i) {
        CHECK(cudaFree(k[i]));
        CHECK(cudaFree(v[i]));
      }
      CHECK(cudaFree(lengths));
      CHECK(cudaFree(zeros));
    }
  }
}

}  // namespace decode_bench
