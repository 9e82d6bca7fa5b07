// The Hopper forward kernel: warp-specialized FlashAttention with FlashAttention-4's softmax, composed of
//
//   FwdTraits            fwd_traits.cuh          the configuration's constants, shared memory, per-tile key range
//   FwdTileScheduler     fwd_tile_scheduler.h    which (m_block, head, batch) tiles, in which order
//   FwdProducer          fwd_producer.cuh        warpgroup 0, one thread: TMA loads of Q and the K/V ring
//   FwdMainloop          fwd_mainloop.cuh        warpgroups 1..: S = Q K^T, softmax, O += P V in named steps
//   FwdStreamMainloop    fwd_mainloop_stream.cuh the same steps run across tiles (d = 128)
//   FwdSoftmax           fwd_softmax.cuh         online softmax, conditional rescaling, FMA-pipe exp2
//   FwdEpilogue          fwd_epilogue.cuh        O / l and the LSE from registers to global memory
//
// A CTA (persistent, one per SM, or one per tile: fwd_launch_persistent) computes tiles of block_m query rows
// of one (batch, head). Consumers own 64 query rows each; setmaxnreg moves registers from the producer to them.
#pragma once

#include <cstdint>

#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/shared_atomic.cuh"
#include "hw/sm90/setmaxnreg.cuh"
#include "kernels/sm90/fwd/fwd_mainloop.cuh"
#include "kernels/sm90/fwd/fwd_mainloop_stream.cuh"
#include "kernels/sm90/fwd/fwd_producer.cuh"
#include "kernels/sm90/fwd/fwd_tile_scheduler.h"
#include "kernels/sm90/fwd/fwd_traits.cuh"

namespace flash4::sm90 {

template <class Element, int kHeadDim, bool kMasked, class Config = FwdTableConfig<kHeadDim, kMasked>>
struct FwdKernel {
  using Traits = FwdTraits<Element, kHeadDim, kMasked, Config>;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kSmemBytes = Traits::kSmemBytes;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;

  static __device__ __forceinline__ void run(const FwdParams& p, char* smem_raw) {
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    // Three consumer warpgroups (d = 64's 192-row tiles) share each scheduler three ways and are issue-bound:
    // the warp-uniform index keeps their Q / V descriptors in uniform registers, with no per-block moves. Two
    // consumers are not issue-bound, and there the plain index ran faster (docs/performance.md 3.11).
    const int warpgroup =
        Traits::kConsumers == 3 ? wgmma::warpgroup_index() : static_cast<int>(threadIdx.x / 128);
    if (threadIdx.x == 0) {
      for (int i = 0; i < Traits::kQBuffers; ++i) {
        mbarrier::init(&s.q_full[i], 1);
        mbarrier::init(&s.q_empty[i], Traits::kConsumers * 4);  // one arrival per consumer warp
      }
      for (int i = 0; i < Traits::kStages; ++i) {
        mbarrier::init(&s.k_full[i], 1);
        mbarrier::init(&s.v_full[i], 1);
        mbarrier::init(&s.k_empty[i], Traits::kConsumers * 4);
        mbarrier::init(&s.v_empty[i], Traits::kConsumers * 4);
      }
      mbarrier::fence_init();
    }
    __syncthreads();

    const FwdTileScheduler<kMasked> scheduler{p.num_m_blocks, p.heads, p.batch, p.tile_section};
    if (warpgroup == 0) {
      setmaxnreg_dec<Traits::kProducerRegisters>();
      if (threadIdx.x == 0) FwdProducer<Traits>::run(p, s, scheduler);
      return;
    }
    setmaxnreg_inc<Traits::kConsumerRegisters>();
    PipelineState<Traits::kStages> st;
    if constexpr (Traits::kCrossTile) {
      FwdStreamMainloop<Traits>::run(p, s, warpgroup - 1, scheduler, st);
    } else {
      for (PipelineState<Traits::kQBuffers> qst;; qst.advance()) {
        mbarrier::wait(&s.q_full[qst.stage], qst.phase);
        // Published before q_full completed (the mbarrier orders it). One atomic read per warp, broadcast: the
        // producer rewrites the buffer's tile_id for a later tile after q_empty, and atomics keep racecheck from
        // flagging the (mbarrier-ordered) reuse.
        int t = 0;
        if (threadIdx.x % 32 == 0) t = shared_atomic_load(&s.tile_id[qst.stage]);
        t = __shfl_sync(0xffffffffu, t, 0);
        if (t < 0) break;
        FwdMainloop<Traits>::consume(p, s, warpgroup - 1, scheduler.tile(t), qst.stage, st);
      }
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1) fwd_kernel(const __grid_constant__ FwdParams params) {
  extern __shared__ char smem_unaligned[];
  // 128B-swizzled tiles must start on 1024-byte boundaries.
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_unaligned) + 1023) & ~uintptr_t(1023));
  Kernel::run(params, smem);
}

}  // namespace flash4::sm90
