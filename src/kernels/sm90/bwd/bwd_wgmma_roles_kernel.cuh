// The Hopper backward main kernel for head_dim 192 and 256 on TMA + wgmma: the role-split kernel.
//
// At d = 192 / 256 the d = 64/128 kernel's layout (each consumer warpgroup keeps dK and dV of its 64 keys over the
// whole head dim) would need 192 / 256 accumulator registers per thread. Here a CTA owns kBlockN = 64 keys and the
// two consumer warpgroups split the work by role, each computing every matmul once:
//   the S warpgroup (consumer 0):  S^T = K Q^T, P^T, dV += P^T dO (all d columns: d / 2 registers), a share of
//                                  dQ's columns;
//   the dP warpgroup (consumer 1): dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q (all d columns), dS to
//                                  shared memory, the rest of dQ's columns.
// dQ's columns are split by whole 64-column chunks, since the MN-major K operand of dQ = dS K must start on a
// chunk: at d = 256 two chunks each; at d = 192 two for the dP warpgroup and one for the S warpgroup, which has the
// exps besides.
// P^T crosses over through shared memory in fp32 (per thread, the two warpgroups' accumulator layouts are the
// same), so dS^T is as accurate as from one fused pass. (The previous layout split the output columns and had
// both warpgroups compute S^T and dP^T: 7/5 of the matmul FLOPs and every exp twice.)
//
// Roles (one CTA per (64-key tile, kv head, batch), looping over the query heads of its GQA group and the Q tiles
// that can see its keys, as in bwd_wgmma_kernel.cuh):
//   warpgroup 0, warp 0   producer: K, V once (TMA); per Q tile Q and dO (TMA) into a kStages ring (2 at d = 256,
//                         3 at 192), LSE * log2e and D by the 32 lanes.
//   S warpgroup, per Q tile (kBlockM = 64 queries):
//     S^T = K Q^T                  wgmma SS, 64 keys x 64 queries, k = d
//     P^T                          exp2, softcap, mask in registers; P^T (x dtanh with softcap) -> p_xchg (fp32)
//     dV += P^T dO                 wgmma RS, N = d, k = 64 queries
//   dP warpgroup, per Q tile:
//     dP^T = V dO^T                wgmma SS, 64 x 64, k = d
//     dS^T = P^T (dP^T - D)        with P^T from p_xchg
//     dK += dS^T Q                 wgmma RS, N = d
//     dS -> shared                 stmatrix .trans, double buffered by tile parity
//   both: dQ[:, chunks] = dS K[:, chunks]   wgmma SS, 64 queries x 64 per chunk, k = 64 keys; added to the fp32
//                                  accumulator with 16-byte vector atomics (red.global.add.v4.f32) from registers
//                                  (bwd_wgmma_roles_dq.cuh).
//   Hand-offs (named barriers): "P ready" (S warpgroup arrives, dP warpgroup waits) and "dS ready" (both wait).
//   p_xchg is written again only after the S warpgroup has passed "dS ready" of the previous tile, i.e. after the
//   dP warpgroup has read it; a dS buffer only after both warpgroups passed "P ready" of the tile in between, i.e.
//   after both dQ matmuls that read it are complete.
//   dK (* softmax_scale) by the dP warpgroup and dV by the S warpgroup are written once at the end.
//
// Shared memory at d = 256: K, V 2 x 32 KB; Q, dO 2 stages x 2 x 32 KB; dS 2 x 8 KB; p_xchg 16 KB; LSE, D 1 KB:
// 225 KB; at d = 192, with 3 stages: K, V 2 x 24 KB; Q, dO 3 x 2 x 24 KB; dS, p_xchg as above: 225 KB.
// Deterministic mode: a per-(b, h, Q tile) semaphore orders the CTAs' dQ additions (releases_before in
// bwd_schedule.h); each warpgroup adds 1 once its columns are in, which it makes known one tile later (release_dq).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "hw/sm90/fence.cuh"
#include "hw/sm90/mbarrier.cuh"
#include "hw/sm90/named_barrier.cuh"
#include "hw/sm90/pipeline_state.cuh"
#include "hw/sm90/setmaxnreg.cuh"
#include "hw/sm90/stmatrix.cuh"
#include "hw/sm90/tma.cuh"
#include "hw/sm90/wgmma.cuh"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_query_tail.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_params.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_wgmma_config.h"
#include "kernels/sm90/bwd/bwd_wgmma_roles_dq.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_producer.cuh"
#include "kernels/sm90/bwd/bwd_wgmma_scores.cuh"
#include "kernels/sm90/bwd/bwd_warp_ops.cuh"
#include "kernels/sm90/device_math.cuh"
#include "kernels/sm90/pack.cuh"

namespace flash4::sm90::bwd {

// kPacked: a packed or seqused batch, each CTA in its own entry's lengths and band (bwd_schedule.h,
// BwdSequence).
// kHeadDimV: v's, dO's and dV's columns, narrower than q / k's for (192, 128) (bwd_has_split_kernel): V and dO
// tiles, dP^T's k-steps and dV's accumulator shrink with it; K, Q, dK and dQ keep kHeadDim.
template <class Element, int kHeadDim_, bool kMasked, bool kPacked = false, int kHeadDimV_ = kHeadDim_>
struct BwdWgmmaRolesKernel {
  using Tile = WgmmaTileRoles<kHeadDim_>;
  static constexpr int kHeadDim = Tile::kHeadDim, kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  static constexpr int kHeadDimV = kHeadDimV_;
  static_assert(kHeadDimV % 64 == 0 && kHeadDimV <= kHeadDim, "v's columns: whole chunks, at most q / k's");
  static constexpr int kStages = Tile::kStages, kChunks = Tile::kChunks, kConsumers = Tile::kConsumers;
  static constexpr int kChunksV = kHeadDimV / 64;
  static constexpr int kThreads = Tile::kThreads;
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * 2, kVBytes = kBlockN * kHeadDimV * 2;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2, kDoBytes = kBlockM * kHeadDimV * 2;
  static constexpr uint32_t kBarWg0 = static_cast<uint32_t>(NamedBarrier::kConsumerWg0);
  static constexpr uint32_t kBarPReady = static_cast<uint32_t>(NamedBarrier::kBwdPReady);
  static constexpr uint32_t kBarDsReady = static_cast<uint32_t>(NamedBarrier::kBwdDsReady);
  static constexpr int kSWarpgroup = 0, kDpWarpgroup = 1;  // consumer roles
  static constexpr bool kPersistent = false;  // one work item per CTA (bwd_schedule.h)
  using DqAdder = BwdRolesDqAdder<BwdWgmmaRolesKernel, Element, kMasked>;

  struct SharedStorage {
    alignas(1024) Element k[kChunks][kBlockN][64];              // 128B swizzle; A of S^T, B of dQ (MN-major)
    alignas(1024) Element v[kChunksV][kBlockN][64];              // 128B swizzle; A of dP^T
    alignas(1024) Element q[kStages][kChunks][kBlockM][64];      // B of S^T (K-major), B of dK (MN-major)
    alignas(1024) Element dout[kStages][kChunksV][kBlockM][64];  // B of dP^T (K-major), B of dV (MN-major)
    alignas(1024) Element ds[2][kBlockM][64];                   // dS (queries x 64 keys), by tile parity; A of dQ
    float p_xchg[kBlockM / 2][128];  // P^T from the S to the dP warpgroup: [accumulator element][thread]
    float lse[kStages][kBlockM];   // LSE * log2e, +inf past the sequence (P = 0)
    float dsum[kStages][kBlockM];  // D = rowsum(dO * O), 0 past the sequence
    uint64_t kv_full;
    uint64_t full[kStages];
    uint64_t empty[kStages];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + base alignment
  static_assert(kSmemBytes <= 232448, "backward tiles exceed the 227 KB shared-memory limit");

  static __device__ __forceinline__ void run(const BwdWgmmaParams& P, char* smem_raw) {
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warpgroup = wgmma::warpgroup_index();
    if (threadIdx.x == 0) {
      init_producer_barriers<BwdWgmmaRolesKernel>(s);
      mbarrier::fence_init();
    }
    __syncthreads();
    const ItemPosition item = grid_item<kMasked>(P.p);
    const int slot = item.slot, b = item.b;  // slot: GroupPart
    if constexpr (kPacked) {
      run_item(P, s, warpgroup, entry_of<kBlockM, kBlockN>(P.p, b), slot, b);
    } else {
      run_item(P, s, warpgroup, P.p, slot, b);
    }
  }

  // The CTA's item in batch entry `e` (the params themselves in a dense launch: bwd_schedule.h, BwdSequence).
  template <class Entry>
  static __device__ __forceinline__ void run_item(const BwdWgmmaParams& P, SharedStorage& s, int warpgroup,
                                                  const Entry& e, int slot, int b) {
    int n_block;  // deterministic order: bwd_schedule.h
    QRange range;
    if constexpr (kPacked) {
      n_block = entry_key_tile<kMasked>(e, grid_item<kMasked>(P.p).launch);
      range = entry_q_range<Tile>(e, n_block);
    } else {
      n_block = grid_n_block<kMasked>(P.p);
      range = q_range<Tile>(P.p, n_block);
    }
    if (warpgroup == 0) {
      setmaxnreg_dec<24>();
      if (threadIdx.x < 32) produce_tiles<BwdWgmmaRolesKernel>(P, s, e, n_block, slot, b, range);
    } else {
      setmaxnreg_inc<240>();
      consume(P, s, e, warpgroup - 1, n_block, slot, b, range);
    }
  }

  // acc (64 keys x 64 queries) = keys (K or V, 64 x w) x rows^T (Q or dO of a stage, 64 x w), w = 64 kC
  // columns: wgmma SS with k = w, both operands K-major; issued and waited for.
  template <int kC>
  static __device__ __forceinline__ void transposed_product(const Element (&keys)[kC][kBlockN][64],
                                                            const Element (&rows)[kC][kBlockM][64],
                                                            float (&acc)[kBlockM / 2]) {
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kC * 4; ++ks) {
      const uint64_t desc_a = wgmma::make_desc_sw128(&keys[ks / 4][0][(ks % 4) * 16], 16, 1024);
      const uint64_t desc_b = wgmma::make_desc_sw128(&rows[ks / 4][0][(ks % 4) * 16], 16, 1024);
      wgmma::mma_ss<kBlockM, 0, Element>(acc, desc_a, desc_b, ks > 0);
    }
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::fence_operand(acc);
  }

  // acc (64 keys x w columns, w = 64 kC) += frag (this warpgroup's 64 keys x 64 queries, 16-bit A fragments) x
  // rows (Q or dO of a stage, 64 queries x w columns, 64-column chunks, LBO = one chunk, kBlockM * 128 bytes):
  // wgmma RS with k = 64 queries, B MN-major; issued and committed, not waited for. dV = P^T dO and dK = dS^T Q.
  template <int kC>
  static __device__ __forceinline__ void issue_key_rows_product(const uint32_t (&frag)[kBlockM / 16][4],
                                                                const Element (&rows)[kC][kBlockM][64],
                                                                float (&acc)[kC * 32]) {
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kBlockM / 16; ++ks) {
      const uint64_t desc = wgmma::make_desc_sw128(&rows[0][ks * 16][0], kBlockM * 128, 1024);
      wgmma::mma_rs<kC * 64, 1, Element>(acc, frag[ks], desc, true);
    }
    wgmma::commit_group();
  }

  // Warpgroup wg's share of dQ for loop iteration `it` (dS in s.ds[it & 1]): at d = 256 chunks 2 wg, 2 wg + 1; at
  // d = 192 the dP warpgroup takes chunks 0, 1 and the S warpgroup chunk 2, since the S warpgroup also has the
  // exps on its path to the next tile's "P ready".
  template <class Entry>
  static __device__ __forceinline__ void add_dq(const BwdParams& p, const Entry& e, SharedStorage& s, int wg, int it,
                                                int n_block, int h, int b, int m_block, int m0, int& pending) {
    constexpr int kWide = Tile::kDqWideChunks, kNarrow = Tile::kDqNarrowChunks;
    const int buf = it & 1;
    if constexpr (kWide == kNarrow) {
      DqAdder::template add_dq<kWide>(p, e, s, wg, kWide * wg, buf, n_block, h, b, m_block, m0, pending);
    } else if (wg == kDpWarpgroup) {
      DqAdder::template add_dq<kWide>(p, e, s, wg, 0, buf, n_block, h, b, m_block, m0, pending);
    } else {
      DqAdder::template add_dq<kNarrow>(p, e, s, wg, kWide, buf, n_block, h, b, m_block, m0, pending);
    }
  }

  // Keys past an entry's end in its last key tile (kPacked) are rows of the caller's tensors that belong to no
  // sequence or to the next one: any bits, NaN included. P^T hides them by a select, but dS^T = P^T (dP^T - D)
  // multiplies their dP^T (= V dO^T) by P = 0, and dQ = dS K their K rows: 0 * NaN is NaN. So the S warpgroup
  // zeroes K's rows from `valid_rows` on (its S^T's A operand) and the dP warpgroup V's (its dP^T's), each before
  // its first matmul of the item under its own barrier; the dQ matmuls, which read K in both, come after the dS
  // barrier both pass.
  template <int kTileChunks>
  static __device__ __forceinline__ void clear_tail(Element (&tile)[kTileChunks][kBlockN][64], int wg,
                                                    int valid_rows) {
    const int unit = static_cast<int>(threadIdx.x % 8);  // 16-byte unit of a 128-byte chunk row; 16 rows a pass
    for (int row = max(valid_rows, 0) + static_cast<int>(threadIdx.x % 128) / 8; row < kBlockN; row += 16) {
#pragma unroll
      for (int c = 0; c < kTileChunks; ++c)
        reinterpret_cast<uint4*>(&tile[c][row][0])[unit] = make_uint4(0u, 0u, 0u, 0u);
    }
    fence_async_shared();
    named_barrier_sync(kBarWg0 + static_cast<uint32_t>(wg), 128);
  }

  // The S warpgroup: S^T, P^T (handed to the dP warpgroup), dV over all of v's columns, its share of dQ (add_dq).
  template <bool kSoftcap, class Entry>
  static __device__ __forceinline__ void s_loop(const BwdWgmmaParams& P, SharedStorage& s, const Entry& e,
                                                int n_block, int slot, int b, QRange range,
                                                float (&acc_dv)[kHeadDimV / 2]) {
    const BwdParams& p = P.p;
    const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
    const int t = lane % 4;
    const int n0 = n_block * kBlockN;
    const int key_row = n0 + warp * 16 + lane / 4;  // keys of accumulator rows: key_row and key_row + 8
    const GroupPart gp = group_part(p, slot);  // the item's query heads
    const int iterations = gp.heads * range.m_count;

    mbarrier::wait(&s.kv_full, 0);
    if constexpr (kPacked) {
      if (iterations > 0 && e.seqlen_k - n0 < kBlockN) clear_tail(s.k, kSWarpgroup, e.seqlen_k - n0);
    }
    PipelineState<kStages> st;
    int pending = -1;  // deterministic mode: semaphore of the last tile's dQ additions, not yet released
    QStep at;
    for (int it = 0; it < iterations; ++it, at.advance(range)) {
      const int h = gp.h_first + at.head;
      const int m_block = range.m_block(at.step);
      const int m0 = m_block * kBlockM;
      const int stage = st.stage;
      mbarrier::wait(&s.full[stage], st.phase);
      if constexpr (kPacked) {
        if (e.seqlen_q - m0 < kBlockM) clear_query_tail(s.q[stage], s.dout[stage], e.seqlen_q - m0, tid, kBarDsReady);
      }

      float acc_s[kBlockM / 2];
      transposed_product(s.k, s.q[stage], acc_s);  // S^T = K Q^T

      // ---- P^T = exp2(score * log2e - LSE * log2e) in place; p_xchg gets P^T (x dtanh with softcap) ----
      const bool need_mask = tile_needs_mask<kBlockM, kBlockN, kMasked>(e, m0, n0);
      float dscore[kSoftcap ? kBlockM / 2 : 1];
#pragma unroll
      for (int jn = 0; jn < kBlockM / 8; ++jn) {
        const float2 lse2 = row_pair(s.lse[stage], jn, t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * jn + e;
          float score_log2;
          if constexpr (kSoftcap) {
            const float th = tanh_accurate(acc_s[i] * p.tanh_scale);
            score_log2 = p.log2_scale * th;
            dscore[i] = 1.0f - th * th;
          } else {
            score_log2 = acc_s[i] * p.log2_scale;
          }
          acc_s[i] = exp2f(score_log2 - ((e & 1) ? lse2.y : lse2.x));
        }
      }
      if (need_mask) apply_mask<kBlockM, kMasked>(e, acc_s, key_row, m0, t);
#pragma unroll
      for (int i = 0; i < kBlockM / 2; ++i) {
        if constexpr (kSoftcap) s.p_xchg[i][tid] = acc_s[i] * dscore[i];
        else s.p_xchg[i][tid] = acc_s[i];
      }
      named_barrier_arrive(kBarPReady, 2 * 128);  // for the dP warpgroup

      // ---- dV += P^T dO: 64 keys x d columns, k = 64 queries ----
      uint32_t p_frag[kBlockM / 16][4];
      to_a_fragments<Element, kBlockM>(acc_s, p_frag);
      issue_key_rows_product(p_frag, s.dout[stage], acc_dv);
      wgmma::wait_group<0>();  // dV done: Q, dO, LSE of this stage are no longer read; p_frag free
      wgmma::fence_operand(acc_dv);
#pragma unroll
      for (int j = 0; j < kBlockM / 16; ++j) wgmma::fence_operand(p_frag[j]);
      mbarrier::arrive(&s.empty[stage]);  // every consumer thread arrives (see bwd_wgmma_kernel.cuh)

      named_barrier_sync(kBarDsReady, 2 * 128);  // the dP warpgroup has written dS (and read p_xchg)
      add_dq(p, e, s, kSWarpgroup, it, n_block, h, b, m_block, m0, pending);
      st.advance();
    }
    if (pending >= 0) DqAdder::release_dq(p, kSWarpgroup, pending);
  }

  // The dP warpgroup: dP^T, dS^T (from the S warpgroup's P^T), dK over all d columns, dS to shared memory, its
  // share of dQ (add_dq).
  template <class Entry>
  static __device__ __forceinline__ void dp_loop(const BwdWgmmaParams& P, SharedStorage& s, const Entry& e,
                                                 int n_block, int slot, int b, QRange range,
                                                 float (&acc_dk)[kHeadDim / 2]) {
    const BwdParams& p = P.p;
    const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32;
    const int t = lane % 4;
    const GroupPart gp = group_part(p, slot);  // the item's query heads
    const int iterations = gp.heads * range.m_count;

    // stmatrix lane addresses inside the 64 x 64 dS tile (rows = queries, 128 bytes of keys, 128B swizzle), as in
    // bwd_wgmma_kernel.cuh: lane L gives row 8 (L / 16) + L % 8 (+ 16 k-step) of matrix L / 8, whose keys start at
    // 16 warp + 8 ((L / 8) % 2), i.e. 16-byte unit 2 warp + (L / 8) % 2, stored at unit ^ (row % 8).
    const int st_row = 8 * (lane / 16) + lane % 8;
    const uint32_t st_off = static_cast<uint32_t>(st_row * 128 + (((2 * warp + (lane / 8) % 2) ^ (lane % 8)) * 16));

    mbarrier::wait(&s.kv_full, 0);
    if constexpr (kPacked) {
      const int valid_rows = e.seqlen_k - n_block * kBlockN;
      if (iterations > 0 && valid_rows < kBlockN) clear_tail(s.v, kDpWarpgroup, valid_rows);
    }
    PipelineState<kStages> st;
    int pending = -1;  // deterministic mode: semaphore of the last tile's dQ additions, not yet released
    QStep at;
    for (int it = 0; it < iterations; ++it, at.advance(range)) {
      const int h = gp.h_first + at.head;
      const int m_block = range.m_block(at.step);
      const int m0 = m_block * kBlockM;
      const int stage = st.stage;
      const int buf = it & 1;
      mbarrier::wait(&s.full[stage], st.phase);
      if constexpr (kPacked) {
        if (e.seqlen_q - m0 < kBlockM)
          clear_query_tail(s.q[stage], s.dout[stage], e.seqlen_q - m0, 128 + tid, kBarDsReady);
      }

      float acc_dp[kBlockM / 2];
      transposed_product(s.v, s.dout[stage], acc_dp);  // dP^T = V dO^T

      // ---- dS^T = P^T (dP^T - D) in place, P^T (masked, x dtanh with softcap) from the S warpgroup ----
      named_barrier_sync(kBarPReady, 2 * 128);
#pragma unroll
      for (int jn = 0; jn < kBlockM / 8; ++jn) {
        const float2 dsum2 = row_pair(s.dsum[stage], jn, t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * jn + e;
          acc_dp[i] = s.p_xchg[i][tid] * (acc_dp[i] - ((e & 1) ? dsum2.y : dsum2.x));
        }
      }
      uint32_t ds_frag[kBlockM / 16][4];
      to_a_fragments<Element, kBlockM>(acc_dp, ds_frag);

      // ---- dK += dS^T Q: 64 keys x d columns, k = 64 queries ----
      issue_key_rows_product(ds_frag, s.q[stage], acc_dk);

      // ---- dS (queries x the CTA's 64 keys) to shared memory while dK runs ----
      const uint32_t s_ds = smem_addr(&s.ds[buf][0][0]) + st_off;
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) stmatrix_x4_trans(s_ds + ks * 16 * 128, ds_frag[ks]);
      fence_async_shared();  // generic-proxy stores -> wgmma (async proxy) reads

      wgmma::wait_group<0>();  // dK done: Q, dO, D of this stage are no longer read; ds_frag free
      wgmma::fence_operand(acc_dk);
#pragma unroll
      for (int j = 0; j < kBlockM / 16; ++j) wgmma::fence_operand(ds_frag[j]);
      mbarrier::arrive(&s.empty[stage]);

      named_barrier_sync(kBarDsReady, 2 * 128);  // both warpgroups: dS of this tile is written
      add_dq(p, e, s, kDpWarpgroup, it, n_block, h, b, m_block, m0, pending);
      st.advance();
    }
    if (pending >= 0) DqAdder::release_dq(p, kDpWarpgroup, pending);
  }

  template <class Entry>
  static __device__ __forceinline__ void consume(const BwdWgmmaParams& P, SharedStorage& s, const Entry& e, int wg,
                                                 int n_block, int slot, int b, QRange range) {
    const BwdParams& p = P.p;
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = (static_cast<int>(threadIdx.x) % 128) / 32;
    const int key_row = n_block * kBlockN + warp * 16 + lane / 4;

    // Accumulator layout of a 64 x w wgmma: element i is row 16 warp + g + 8 ((i / 2) % 2), column 8 (i / 4) +
    // 2 t + (i % 2). The S warpgroup keeps dV (v's columns), the dP warpgroup dK (q / k's).
    float acc[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc[i] = 0.0f;
    float(&acc_v)[kHeadDimV / 2] = *reinterpret_cast<float(*)[kHeadDimV / 2]>(&acc[0]);  // dV: v's columns
    if (range.m_count > 0) {
      if (wg == kSWarpgroup) {
        // One loop per softcap case, so that each loop's registers hold only its own element-wise pass.
        if (p.softcap > 0.0f) s_loop<true>(P, s, e, n_block, slot, b, range, acc_v);
        else s_loop<false>(P, s, e, n_block, slot, b, range, acc_v);
      } else {
        dp_loop(P, s, e, n_block, slot, b, range, acc);
      }
    }

    // ---- dV = sum P^T dO (S warpgroup), dK = scale * sum dS^T Q (dP warpgroup) ----
    if (wg == kSWarpgroup) {
      store_item_key_rows<Element, kHeadDimV>(p, e, p.dv, p.dv_stride, p.dv_partial, acc_v, 1.0f, b, slot, key_row,
                                              0, p.head_dim_v, lane % 4);
    } else {
      store_item_key_rows<Element, kHeadDim>(p, e, p.dk, p.dk_stride, p.dk_partial, acc, p.softmax_scale, b, slot,
                                             key_row, 0, p.head_dim, lane % 4);
    }
  }
};

}  // namespace flash4::sm90::bwd
