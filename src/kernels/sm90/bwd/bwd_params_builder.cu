// The backward's launch configuration and kernel parameters (bwd_params_builder.h).
#include "kernels/sm90/bwd/bwd_params_builder.h"

#include <cstdint>

#include "common/mask.h"
#include "common/score_transform.h"
#include "kernels/sm90/bwd/bwd_mma_sync_kernel.cuh"
#include "kernels/sm90/bwd/bwd_item_plan.h"
#include "kernels/sm90/bwd/bwd_schedule.h"
#include "kernels/sm90/bwd/bwd_sequences.h"
#include "kernels/sm90/bwd/bwd_wgmma_config.h"
#include "kernels/sm90/head_dims.h"

namespace flash4::detail::bwd {
namespace {

using sm90::bwd::MmaSyncTile;
using sm90::bwd::WgmmaTile;
using sm90::bwd::WgmmaTileRoles;

bool tma_describable_tensor(const TensorView& t) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.stride[i] <= 0 || (t.stride[i] * dtype_size(t.dtype)) % 16 != 0) return false;
  return true;
}

sm90::BshdStrides strides_of(const TensorView& t) { return bshd(t).stride; }

// The one selection rule between the two main kernels (see the top of bwd_api.cu).
bool use_wgmma_kernel(const BackwardArgs& args, const Problem& p) {
  const int width = sm90::bwd_kernel_head_dim(p.head_dim, p.head_dim_v);
  if (width == 0) return false;
  const bool padded = sm90::padded_head_dims(p.head_dim, p.head_dim_v);  // no mma.sync kernel: see bwd_api.cu
  // Deterministic mode keeps the wgmma kernel at every length, so that a sequence's gradients are the same bits
  // whether it runs alone or in a packed batch (whose kernel is the wgmma one).
  if (!padded && width != 256 && p.seqlen_k <= 64 && !args.deterministic) return false;
  if (p.seqlen_q < 1 || p.batch < 1 || p.heads < 1 || p.heads_kv < 1) return false;
  return tma_describable(args);
}

// The v width of the wgmma kernel that runs (d, dv) at q / k width `width`: its own where a split kernel exists
// (bwd_has_split_kernel), else `width` (v zero-padded).
int bwd_kernel_head_dim_v(int width, int64_t dv) {
  return sm90::bwd::bwd_has_split_kernel(width, static_cast<int>(dv)) ? static_cast<int>(dv) : width;
}

// How many parts each GQA group's work items take (wgmma kernels): in deterministic mode from the heads alone
// (det_group_parts), else from the launch's tile shape and lengths (bwd_group_parts).
int group_parts_for(const sm90::BwdParams& params, const BwdLaunchConfig& launch, int sms) {
  using namespace flash4::sm90::bwd;
  if (params.deterministic) return det_group_parts(params.group, params.heads_kv);
  const long long items = static_cast<long long>(params.n_blocks) * params.heads_kv * params.batch;
  if (params.group <= 1 || items >= 4LL * sms) return 1;  // spares key_tile_steps' loop
  const KeyTileSteps steps = launch.block_m == 128   ? key_tile_steps<TileShape<128, 128>>(params)
                             : launch.block_n == 128 ? key_tile_steps<TileShape<64, 128>>(params)
                                                     : key_tile_steps<TileShape<64, 64>>(params);
  return bwd_group_parts(items, steps.longest, steps.total * params.heads_kv * params.batch, params.group, sms);
}

}  // namespace

BshdView bshd(const TensorView& t) {
  if (t.rank == 3) return {1, t.shape[0], {0, t.stride[0], t.stride[1]}};
  return {t.shape[0], t.shape[1], {t.stride[0], t.stride[1], t.stride[2]}};
}

bool tma_describable(const BackwardArgs& args) {
  for (const TensorView* t : {&args.q, &args.k, &args.v, &args.dout})
    if (!tma_describable_tensor(*t)) return false;
  return true;
}

bool rows_16b_aligned(const TensorView& t) {
  if (t.numel() == 0) return true;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.shape[i] > 1 && (t.stride[i] * dtype_size(t.dtype)) % 16 != 0) return false;
  return true;
}

bool backward_packed_native(const BackwardArgs& args, const Problem& p) {
  return backward_needs_sequences(p) && sm90::bwd_kernel_head_dim(p.head_dim, p.head_dim_v) != 0 && p.batch > 0 &&
         p.heads > 0 && p.total_q > 0 && p.total_k > 0 && tma_describable(args);
}

BwdLaunchConfig choose_bwd_launch(const BackwardArgs& args, const Problem& p) {
  constexpr int kMmaBlockM = MmaSyncTile<64>::kBlockM, kMmaBlockN = MmaSyncTile<64>::kBlockN;
  static_assert(kMmaBlockM == MmaSyncTile<128>::kBlockM && kMmaBlockN == MmaSyncTile<128>::kBlockN &&
                    kMmaBlockM == MmaSyncTile<256>::kBlockM && kMmaBlockN == MmaSyncTile<256>::kBlockN,
                "the mma.sync kernel has one tile shape for every head dim");
  static_assert(WgmmaTile<64>::kBlockN == WgmmaTile<128>::kBlockN &&
                WgmmaTile<96>::kBlockM == WgmmaTile<128>::kBlockM && WgmmaTile<96>::kBlockN == WgmmaTile<128>::kBlockN);
  static_assert(WgmmaTileRoles<192>::kBlockM == WgmmaTileRoles<256>::kBlockM &&
                WgmmaTileRoles<192>::kBlockN == WgmmaTileRoles<256>::kBlockN);
  static_assert(MmaSyncTile<64>::kColSlices == 1 && MmaSyncTile<128>::kColSlices == 1);
  BwdLaunchConfig c;
  c.packed = backward_needs_sequences(p);  // packed or seqused: the kernels' per-entry instantiation
  c.wgmma = c.packed || use_wgmma_kernel(args, p);
  // The compiled width that runs the problem: its own head dim, or zero-padded the next wider one (head_dims.h);
  // v's: its own where a split kernel exists ((192, 128)), else the same.
  c.width = sm90::bwd_kernel_head_dim(p.head_dim, p.head_dim_v);
  c.width_v = bwd_kernel_head_dim_v(c.width, p.head_dim_v);
  // The role-split kernel's tile at d = 192 and 256.
  using RolesTile = WgmmaTileRoles<256>;
  c.block_m = !c.wgmma        ? kMmaBlockM
              : c.width == 64  ? WgmmaTile<64>::kBlockM
              : c.width <= 128 ? WgmmaTile<128>::kBlockM
                               : RolesTile::kBlockM;
  c.block_n = !c.wgmma ? kMmaBlockN : c.width >= 192 ? RolesTile::kBlockN : WgmmaTile<128>::kBlockN;
  c.col_slices = !c.wgmma && c.width == 256 ? MmaSyncTile<256>::kColSlices : 1;
  return c;
}

sm90::BwdParams make_bwd_params(const BackwardArgs& args, const Problem& p, const BwdLaunchConfig& launch,
                                int sm_count) {
  sm90::BwdParams params{};
  params.q = args.q.data;
  params.k = args.k.data;
  params.v = args.v.data;
  params.out = args.out.data;
  params.dout = args.dout.data;
  params.lse = static_cast<const float*>(args.lse.data);
  params.lse_stride_b = args.lse.rank == 2 ? 0 : args.lse.stride[0];  // packed: (heads, total_q)
  params.lse_stride_h = args.lse.rank == 2 ? args.lse.stride[0] : args.lse.stride[1];
  params.q_stride = strides_of(args.q);
  params.k_stride = strides_of(args.k);
  params.v_stride = strides_of(args.v);
  params.out_stride = strides_of(args.out);
  params.dout_stride = strides_of(args.dout);
  params.dq = args.dq.data;
  params.dk = args.dk.data;
  params.dv = args.dv.data;
  params.dq_stride = strides_of(args.dq);
  params.dk_stride = strides_of(args.dk);
  params.dv_stride = strides_of(args.dv);

  params.batch = static_cast<int>(p.batch);
  params.seqlen_q = static_cast<int>(p.seqlen_q);
  params.seqlen_k = static_cast<int>(p.seqlen_k);
  params.heads = static_cast<int>(p.heads);
  params.heads_kv = static_cast<int>(p.heads_kv);
  params.group = static_cast<int>(p.group());
  params.head_dim = static_cast<int>(p.head_dim);
  params.head_dim_v = static_cast<int>(p.head_dim_v);
  params.m_blocks = static_cast<int>((p.seqlen_q + launch.block_m - 1) / launch.block_m);
  params.n_blocks = static_cast<int>((p.seqlen_k + launch.block_n - 1) / launch.block_n);
  // The common mask and score transform (common/mask.h, common/score_transform.h); the band in int for the kernels'
  // compares, unbounded sides as the sentinels every real offset satisfies. Packed and seqused launches make
  // each entry's band from `seq` and `mask` (bwd_schedule.h); theirs below, of the longest entry, only sizes the
  // launch.
  params.seq = p.layout();
  params.mask = p.mask();
  const SequenceMask band = SequenceMask::make(p.mask(), p.seqlen_q, p.seqlen_k);
  params.band_lo = sm90::clamp_band(band.band_lo);
  params.band_hi = sm90::clamp_band(band.band_hi);
  const ScoreTransform score = p.score_transform();
  params.softmax_scale = score.softmax_scale;
  params.softcap = score.softcap;
  params.tanh_scale = score.tanh_scale;
  params.log2_scale = score.log2_scale;
  params.deterministic = args.deterministic;
  params.learnable_sink = p.learnable_sink;
  params.dsink = args.dsink.data != nullptr ? static_cast<float*>(args.dsink.data) : nullptr;
  if (args.deterministic && launch.wgmma) {
    // Key tiles of one (batch, kv head) that fit on half the SMs: all resident together, with room left for other
    // work on the GPU.
    const int resident_key_tiles = sm_count / 2;
    // Rotated deterministic order (bwd_schedule.h, det_rotates); a packed launch decides it per entry.
    if (!p.has_mask()) {
      if (launch.packed) params.det_resident_key_tiles = resident_key_tiles;
      else params.det_rotated = sm90::bwd::det_rotates(params.m_blocks, params.n_blocks, resident_key_tiles);
    }
    // d = 192 / 256: release dQ additions one tile late (bwd_wgmma_roles_kernel.cuh), so that the release fence
    // stops stalling the warpgroup; not where each CTA waits on its predecessor's release in lockstep (unmasked,
    // unrotated, and a head's CTAs resident together), where the late release lengthens the chain.
    if (launch.width >= 192) {
      params.det_defer_release = p.has_mask() || params.det_rotated || params.n_blocks > resident_key_tiles;
    }
  }

  if (launch.wgmma) params.group_parts = group_parts_for(params, launch, sm_count);
  // 16-bit Q and dO (the backward's element types).
  if (launch.wgmma) params.order_section = sm90::bwd::bwd_order_section(params, p.has_mask(), 2, sm_count);
  // A split group's fp32 dK, dV partials (bwd_params.h), one block of key rows per part.
  params.partial_rows = params.seq.cu_seqlens_k != nullptr ? p.total_k : p.batch * p.seqlen_k;
  // The wgmma kernel of widths 64 / 96 / 128 stages its dQ pieces in fragment order (bwd_params.h); the others
  // add into row-major rows, and so does that kernel in deterministic mode without a mask, where the CTAs add
  // into each Q tile one after another and the row-major staging measured faster (docs/performance.md 4.10).
  params.dq_fragment_order = launch.wgmma && launch.width <= 128 && !(args.deterministic && !p.has_mask());
  params.dq_accum_cols = static_cast<int>(params.dq_fragment_order ? (p.head_dim + 31) / 32 * 32 : p.head_dim);
  return params;
}

int64_t bwd_workspace_rows(const Problem& p) { return p.heads * (p.varlen() ? p.total_q : p.batch * p.seqlen_q); }

bool bwd_runs_persistent(const sm90::BwdParams& params, const BwdLaunchConfig& launch, int64_t rows) {
  // The counter is zeroed by the preprocess kernel, which runs whenever rows > 0.
  return launch.wgmma && !params.deterministic && launch.width <= 128 && rows > 0 &&
         sm90::bwd::bwd_persistent_pays(params, launch.block_m);
}

sm90::bwd::BwdWorkspaceNeeds bwd_workspace_needs(const sm90::BwdParams& params, const Problem& p,
                                                 const BwdLaunchConfig& launch, bool persistent) {
  sm90::bwd::BwdWorkspaceNeeds n;
  n.rows = bwd_workspace_rows(p);
  n.dq_accum_cols = params.dq_accum_cols;
  n.semaphores = params.deterministic ? int64_t{launch.col_slices} * p.batch * p.heads * params.m_blocks : 0;
  n.work_counter = persistent;
  if (params.dsink != nullptr) {
    const int64_t slots = p.varlen() ? p.total_q : p.batch * p.seqlen_q;  // row slots per head
    n.dsink_partials = p.heads * int64_t{sm90::bwd::dsink_slices(slots, static_cast<int>(p.heads))};
  }
  n.partial_rows = params.group_parts > 1 ? int64_t{params.group_parts} * params.partial_rows * p.heads_kv : 0;
  n.head_dim = params.head_dim;
  n.head_dim_v = params.head_dim_v;
  return n;
}

}  // namespace flash4::detail::bwd
