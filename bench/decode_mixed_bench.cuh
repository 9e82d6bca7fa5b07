// `flash4_bench --decode-mixed`: a serving step that mixes one prefill chunk with decode and verify steps, as
// packed queries against a KV cache (flash4::forward_kvcache with cu_seqlens_q on the device). Sequence 0 holds a
// chunk of kChunk queries, the others 1, 2, 3, 4, 1, ... queries (causal, the last positions); GQA 32/8, d 128,
// bf16, contiguous caches. Three ways to run the same step:
//   packed           one call: the decode kernel takes the short segments, the dense kernel the chunk
//                    (decode_api.cu, packed_queries_forward);
//   packed_decode    one call forced onto the decode kernel for every segment by a zero cache_leftpad (which the
//                    dense kernel refuses; no key moves): how packed calls ran before the dense kernel took a share;
//   two_calls        the chunk alone as a (1, kChunk) call (dense kernel) and the steps as a packed call: the
//                    split a caller could make by hand, reading the offsets on the host.
// Per row the median kernel time of back-to-back calls and of CUDA-graph replays, alternating the ways over two
// rounds. Prints JSON lines.
#pragma once

#include <cstdio>
#include <vector>

#include "decode_bench.cuh"
#include "flash4/kvcache.h"

namespace decode_mixed_bench {

using decode_bench::kHeadDim;
using decode_bench::kHeads;
using decode_bench::kHeadsKv;
using decode_bench::Row;
constexpr int kChunk = 512;

inline void run(int iters) {
  const flash4::Device dev = flash4::Device::cuda(0);
  const auto bf16 = flash4::DType::kBFloat16, i32 = flash4::DType::kInt32;
  for (const Row& r : {Row{8, 8192}, Row{64, 4096}, Row{8, 32768}}) {
    std::vector<int> counts(r.batch), offsets(r.batch + 1, 0);
    for (int b = 0; b < r.batch; ++b) counts[b] = b == 0 ? kChunk : b % 4 + 1;
    for (int b = 0; b < r.batch; ++b) offsets[b + 1] = offsets[b] + counts[b];
    const int total_q = offsets[r.batch], steps_q = total_q - kChunk;
    std::vector<int> step_offsets(r.batch);  // the steps' own offsets (two_calls)
    for (int b = 1; b <= r.batch; ++b) step_offsets[b - 1] = offsets[b] - kChunk;

    const size_t kv = size_t(r.batch) * r.seqlen * kHeadsKv * kHeadDim;
    const int sets = static_cast<int>(std::max<size_t>(1, (200u << 20) / (4 * kv) + 1));
    std::vector<__nv_bfloat16*> k(sets), v(sets);
    for (int i = 0; i < sets; ++i) {
      k[i] = decode_bench::random_bf16(kv, 500u + 2 * i);
      v[i] = decode_bench::random_bf16(kv, 501u + 2 * i);
    }
    __nv_bfloat16* q = decode_bench::random_bf16(size_t(total_q) * kHeads * kHeadDim, 19u);
    __nv_bfloat16* out = nullptr;
    int *cu = nullptr, *cu_steps = nullptr, *lengths = nullptr, *zeros = nullptr;
    CHECK(cudaMalloc(&out, size_t(total_q) * kHeads * kHeadDim * 2));
    CHECK(cudaMalloc(&cu, (r.batch + 1) * 4));
    CHECK(cudaMalloc(&cu_steps, r.batch * 4));
    CHECK(cudaMalloc(&lengths, r.batch * 4));
    CHECK(cudaMalloc(&zeros, r.batch * 4));
    const std::vector<int> host_lengths(r.batch, r.seqlen);
    CHECK(cudaMemcpy(cu, offsets.data(), (r.batch + 1) * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(cu_steps, step_offsets.data(), r.batch * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(lengths, host_lengths.data(), r.batch * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(zeros, 0, r.batch * 4));

    // Sequences first .. first + n - 1 of set i: their caches and lengths; q and out from packed row q_row.
    auto cache_args = [&](int i, int first, int n) {
      flash4::KvCacheArgs a;
      const size_t skip = size_t(first) * r.seqlen * kHeadsKv * kHeadDim;
      a.k_cache = flash4::make_view(k[i] + skip, bf16, dev, n, r.seqlen, kHeadsKv, kHeadDim);
      a.v_cache = flash4::make_view(v[i] + skip, bf16, dev, n, r.seqlen, kHeadsKv, kHeadDim);
      a.cache_seqlens = flash4::make_view(lengths + first, i32, dev, n);
      a.causal = true;
      return a;
    };
    auto packed = [&](int i, bool forced) {
      flash4::KvCacheArgs a = cache_args(i, 0, r.batch);
      a.q = flash4::make_view(q, bf16, dev, total_q, kHeads, kHeadDim);
      a.out = flash4::make_view(out, bf16, dev, total_q, kHeads, kHeadDim);
      a.cu_seqlens_q = flash4::make_view(cu, i32, dev, r.batch + 1);
      a.max_seqlen_q = kChunk;
      if (forced) a.cache_leftpad = flash4::make_view(zeros, i32, dev, r.batch);
      return a;
    };
    auto two_calls = [&](int i, cudaStream_t s) {
      flash4::KvCacheArgs chunk = cache_args(i, 0, 1);
      chunk.q = flash4::make_view(q, bf16, dev, 1, kChunk, kHeads, kHeadDim);
      chunk.out = flash4::make_view(out, bf16, dev, 1, kChunk, kHeads, kHeadDim);
      flash4::forward_kvcache(chunk, s);
      flash4::KvCacheArgs steps = cache_args(i, 1, r.batch - 1);
      const size_t skip = size_t(kChunk) * kHeads * kHeadDim;
      steps.q = flash4::make_view(q + skip, bf16, dev, steps_q, kHeads, kHeadDim);
      steps.out = flash4::make_view(out + skip, bf16, dev, steps_q, kHeads, kHeadDim);
      steps.cu_seqlens_q = flash4::make_view(cu_steps, i32, dev, r.batch);
      steps.max_seqlen_q = 4;
      flash4::forward_kvcache(steps, s);
    };
    const char* ways[] = {"packed", "packed_decode", "two_calls"};
    auto call = [&](int way, int i, cudaStream_t s) {
      if (way == 2) two_calls(i, s);
      else flash4::forward_kvcache(packed(i, way == 1), s);
    };
    for (int round = 0; round < 2; ++round) {
      for (int way = 0; way < 3; ++way) {
        const double us = median_ms_of(sets, iters, [&](int i) { call(way, i, nullptr); }) * 1e3;
        const double graph = decode_bench::graph_us(sets, iters, [&](int i, cudaStream_t s) { call(way, i, s); });
        std::printf("{\"bench\": \"decode_mixed\", \"impl\": \"%s\", \"b\": %d, \"s\": %d, \"chunk\": %d, "
                    "\"total_q\": %d, \"h\": %d, \"hkv\": %d, \"d\": %d, \"round\": %d, \"us\": %.2f, "
                    "\"us_graph\": %.2f}\n",
                    ways[way], r.batch, r.seqlen, kChunk, total_q, kHeads, kHeadsKv, kHeadDim, round, us, graph);
        std::fflush(stdout);
      }
    }
    for (int i = 0; i < sets; ++i) {
      CHECK(cudaFree(k[i]));
      CHECK(cudaFree(v[i]));
    }
    for (void* p : {(void*)q, (void*)out, (void*)cu, (void*)cu_steps, (void*)lengths, (void*)zeros}) CHECK(cudaFree(p));
  }
}

}  // namespace decode_mixed_bench
