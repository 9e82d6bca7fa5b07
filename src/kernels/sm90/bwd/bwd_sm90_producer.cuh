// The producer warp shared by the wgmma backward kernels (bwd_sm90_kernel.cuh, bwd_sm90_hd256_kernel.cuh).
#pragma once

#include <cstdint>

#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/tma.cuh"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"

namespace flash4::sm90::bwd {

// The barriers of produce_tiles' ring (one thread, before the kernel's fence_init and __syncthreads): kv_full
// completes on K, V's TMA bytes; full[stage] on the Q / dO TMA bytes plus the 32 LSE / D lanes; empty[stage] on
// one arrival per consumer thread (each orders its own LSE / D reads before the next refill).
template <class Kernel, class Storage>
__device__ __forceinline__ void init_producer_barriers(Storage& s) {
  mbarrier::init(&s.kv_full, 1);
  for (int i = 0; i < Kernel::kStages; ++i) {
    mbarrier::init(&s.full[i], 1 + 32);
    mbarrier::init(&s.empty[i], Kernel::kConsumers * 128);
  }
}

// The producer warp of the wgmma backward kernels: K, V once (TMA); then per Q tile Q and dO (TMA) into the
// ring and LSE * log2e and D by the 32 lanes (+inf / 0 past the sequence). `Kernel` gives the tile constants and
// its SharedStorage the k, v, q, dout, lse, dsum tiles and the kv_full / full / empty barriers.
template <class Kernel, class Storage>
__device__ __forceinline__ void produce_tiles(const BwdWgmmaParams& P, Storage& s, int n_block, int hkv, int b,
                                              QRange range) {
  constexpr int kChunks = Kernel::kChunks, kBlockM = Kernel::kBlockM, kBlockN = Kernel::kBlockN;
  constexpr int kStages = Kernel::kStages;
  constexpr uint32_t kKVBytes = Kernel::kKVBytes, kQBytes = Kernel::kQBytes;
  const BwdParams& p = P.p;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int iterations = p.group * range.m_count;
  if (iterations == 0) return;  // the consumers write dK = dV = 0 and touch no shared tile
  if (lane == 0) {
    tma::prefetch_descriptor(&P.tma_q);
    tma::prefetch_descriptor(&P.tma_do);
    mbarrier::arrive_expect_tx(&s.kv_full, 2 * kKVBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      tma::load_4d(&s.k[c][0][0], &P.tma_k, c * 64, n_block * kBlockN, hkv, b, &s.kv_full);
      tma::load_4d(&s.v[c][0][0], &P.tma_v, c * 64, n_block * kBlockN, hkv, b, &s.kv_full);
    }
  }
  PipelineState<kStages> st;
  for (int it = 0; it < iterations; ++it) {
    const int h = hkv * p.group + it / range.m_count;
    const int m0 = range.m_block(it % range.m_count) * kBlockM;
    mbarrier::wait(&s.empty[st.stage], st.phase ^ 1u);  // a fresh barrier counts as released
    if (lane == 0) {
      mbarrier::arrive_expect_tx(&s.full[st.stage], 2 * kQBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        tma::load_4d(&s.q[st.stage][c][0][0], &P.tma_q, c * 64, m0, h, b, &s.full[st.stage]);
        tma::load_4d(&s.dout[st.stage][c][0][0], &P.tma_do, c * 64, m0, h, b, &s.full[st.stage]);
      }
    }
    const int64_t row0 = (static_cast<int64_t>(b) * p.heads + h) * p.seqlen_q;
#pragma unroll
    for (int r = lane; r < kBlockM; r += 32) {
      const int i = m0 + r;
      const bool valid = i < p.seqlen_q;
      s.lse[st.stage][r] = valid ? p.lse_log2[row0 + i] : __int_as_float(0x7f800000);
      s.dsum[st.stage][r] = valid ? p.dsum[row0 + i] : 0.0f;
    }
    mbarrier::arrive(&s.full[st.stage]);  // release: this lane's LSE / D stores
    st.advance();
  }
}

}  // namespace flash4::sm90::bwd
