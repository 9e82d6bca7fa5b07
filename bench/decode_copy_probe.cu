// Decode KV-stream probe: how fast can a decode-shaped grid stream a (batch, seqlen, heads_kv, 128) bf16 K and V
// cache into a shared-memory ring, per copy mechanism, with a trivial consumer? Separates the memory system's
// ceiling for each copy form from the decode kernel's own compute. Same grid as the decode kernel at 8 x 32k
// GQA 32/8: (4 splits, 8 KV heads, 8 sequences), 128 threads, 2 CTAs per SM, 3 stages of 64 keys of K and V.
//
// Copy forms (--mode):
//   0 cp.async 16 B per thread (the decode kernel's form, .L2::128B hint), rows padded to 272 B in shared memory
//   1 the same without the L2 hint
//   2 cp.async 16 B with rows of 256 B, the 16-byte chunk index XOR-swizzled by the row (no padding)
//   3 cp.async.bulk: one 256-byte bulk copy per row (warp 0 issues), mbarrier completion, 272-byte rows
//   4 TMA tensor tiles: (64 keys x 64 columns) boxes with 128-byte swizzle, one thread issues, mbarrier completion
// Output: one JSON line per mode with the median time and the K+V read rate.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hw/sm90/cp_async.cuh"
#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/tma.cuh"
#include "hw/sm90/tma_map.h"

namespace {

constexpr int kD = 128, kThreads = 128, kBlockN = 64, kStages = 3;
constexpr int kRowBytes = kD * 2;                         // 256
constexpr int kPaddedRow = kRowBytes + 16;                // 272
constexpr int kTilePadded = kBlockN * kPaddedRow;         // one K or V block, padded rows
constexpr int kTileDense = kBlockN * kRowBytes;           // one K or V block, dense rows (modes 2, 4)
constexpr int kStageBytes = 2 * kTilePadded;              // room for either layout
constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 64;

struct Args {
  const uint16_t* k;
  const uint16_t* v;
  int64_t seqlen;
  int heads;
  int splits;
  unsigned* sink;
};

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool hint) {
  if (hint)
    flash4::sm90::cp_async_16_line(dst, src, 16);
  else
    flash4::sm90::cp_async_16(dst, src, 16);
}

__device__ __forceinline__ void bulk_row(uint32_t dst, const void* src, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "n"(kRowBytes), "r"(bar)
               : "memory");
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 2) stream_kernel(const Args a, const __grid_constant__ CUtensorMap k_map,
                                                             const __grid_constant__ CUtensorMap v_map) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int split = blockIdx.x, h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t keys_per_split = a.seqlen / a.splits, lo = split * keys_per_split;
  const int n_blocks = static_cast<int>(keys_per_split / kBlockN);
  const int64_t row_stride = int64_t{a.heads} * kD;  // elements between consecutive keys of one head
  const uint16_t* k_head = a.k + (b * a.seqlen * a.heads + h) * kD;
  const uint16_t* v_head = a.v + (b * a.seqlen * a.heads + h) * kD;
  constexpr bool kAsync = kMode >= 3;
  if (kAsync && threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) flash4::sm90::mbarrier::init(&bars[s], 1);
    flash4::sm90::mbarrier::fence_init();
  }
  __syncthreads();

  auto stage_addr = [&](int s) { return s_base + s * kStageBytes; };
  auto load_block = [&](int blk, int s) {
    const int64_t j0 = lo + int64_t{blk} * kBlockN;
    if constexpr (kMode <= 2) {
      const int r0 = threadIdx.x / 16, chunk = threadIdx.x % 16;
#pragma unroll
      for (int pass = 0; pass < kBlockN / 8; ++pass) {
        const int r = r0 + pass * 8;
        const int64_t off = (j0 + r) * row_stride + chunk * 8;
        uint32_t dst;
        if constexpr (kMode == 2) dst = r * kRowBytes + ((chunk ^ (r % 8)) * 16);
        else dst = r * kPaddedRow + chunk * 16;
        const int tile = kMode == 2 ? kTileDense : kTilePadded;
        cp16(stage_addr(s) + dst, k_head + off, kMode == 0);
        cp16(stage_addr(s) + tile + dst, v_head + off, kMode == 0);
      }
    } else if constexpr (kMode == 3) {
      if (threadIdx.x < 32) {
        const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[s]));
        if (threadIdx.x == 0) flash4::sm90::mbarrier::arrive_expect_tx(&bars[s], 2 * kBlockN * kRowBytes);
        __syncwarp();
        for (int r = threadIdx.x; r < kBlockN; r += 32) {
          const int64_t off = (j0 + r) * row_stride;
          bulk_row(stage_addr(s) + r * kPaddedRow, k_head + off, bar);
          bulk_row(stage_addr(s) + kTilePadded + r * kPaddedRow, v_head + off, bar);
        }
      }
    } else {
      if (threadIdx.x == 0) {
        flash4::sm90::mbarrier::arrive_expect_tx(&bars[s], 2 * kTileDense);
        unsigned char* st = smem + s * kStageBytes;
        const int32_t row = static_cast<int32_t>(j0);
        for (int half = 0; half < 2; ++half) {
          flash4::sm90::tma::load_4d(st + half * (kTileDense / 2), &k_map, half * 64, row, h, int32_t(b), &bars[s]);
          flash4::sm90::tma::load_4d(st + kTilePadded + half * (kTileDense / 2), &v_map, half * 64, row, h,
                                     int32_t(b), &bars[s]);
        }
      }
    }
  };

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_blocks) load_block(s, s);
    if constexpr (!kAsync) flash4::sm90::cp_async_commit();
  }
  unsigned acc = 0;
  int stage = 0, load_stage = kStages - 1;
  uint32_t phase = 0;
  for (int blk = 0; blk < n_blocks; ++blk) {
    if constexpr (!kAsync) flash4::sm90::cp_async_wait<kStages - 2>();
    else flash4::sm90::mbarrier::wait(&bars[stage], phase);
    __syncthreads();
    if (blk + kStages - 1 < n_blocks) load_block(blk + kStages - 1, load_stage);
    if constexpr (!kAsync) flash4::sm90::cp_async_commit();
    // Consumer stand-in: every thread reads 4 x 16 bytes of K and of V of this stage.
    const unsigned char* st = smem + stage * kStageBytes;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int off = ((threadIdx.x + i * kThreads) * 16) % kTileDense;
      const uint4 kv = *reinterpret_cast<const uint4*>(st + off);
      const uint4 vv = *reinterpret_cast<const uint4*>(st + kTilePadded + off);
      acc ^= kv.x ^ kv.y ^ kv.z ^ kv.w ^ vv.x ^ vv.y ^ vv.z ^ vv.w;
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
    if (stage == 0) phase ^= 1;
    load_stage = load_stage + 1 == kStages ? 0 : load_stage + 1;
  }
  if (acc == 0x12345678u) atomicAdd(a.sink, 1u);  // keeps the reads
}

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e = (x);                                                                       \
    if (e != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));           \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

template <int kMode>
float run(const Args& a, int batch, const CUtensorMap& km, const CUtensorMap& vm, int iters) {
  auto kernel = stream_kernel<kMode>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid(a.splits, a.heads, batch);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < iters + 3; ++i) {
    CHECK(cudaEventRecord(e0));
    kernel<<<grid, kThreads, kSmemBytes>>>(a, km, vm);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int batch = 8, heads = 8, splits = 4, iters = 20, only = -1;
  int64_t seqlen = 32768;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seqlen")) seqlen = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--splits")) splits = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--mode")) only = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  const size_t elems = size_t(batch) * seqlen * heads * kD;
  uint16_t *k, *v;
  unsigned* sink;
  CHECK(cudaMalloc(&k, elems * 2));
  CHECK(cudaMalloc(&v, elems * 2));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(k, 0x3c, elems * 2));  // any bits: the consumer only XORs them
  CHECK(cudaMemset(v, 0x41, elems * 2));
  const Args a{k, v, seqlen, heads, splits, sink};
  const int64_t rs = int64_t{heads} * kD;
  const CUtensorMap km = flash4::sm90::make_tensor_map_bshd(k, batch, seqlen, heads, kD, seqlen * rs, rs, kD, 64);
  const CUtensorMap vm = flash4::sm90::make_tensor_map_bshd(v, batch, seqlen, heads, kD, seqlen * rs, rs, kD, 64);
  const double bytes = 2.0 * elems * 2;
  for (int mode = 0; mode <= 4; ++mode) {
    if (only >= 0 && mode != only) continue;
    float ms = 0;
    switch (mode) {
      case 0: ms = run<0>(a, batch, km, vm, iters); break;
      case 1: ms = run<1>(a, batch, km, vm, iters); break;
      case 2: ms = run<2>(a, batch, km, vm, iters); break;
      case 3: ms = run<3>(a, batch, km, vm, iters); break;
      case 4: ms = run<4>(a, batch, km, vm, iters); break;
    }
    std::printf("{\"mode\": %d, \"batch\": %d, \"seqlen\": %lld, \"splits\": %d, \"us\": %.1f, \"tb_per_s\": %.3f}\n",
                mode, batch, static_cast<long long>(seqlen), splits, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
  }
  return 0;
}
