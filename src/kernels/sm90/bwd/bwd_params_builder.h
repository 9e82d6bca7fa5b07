// The backward's launch configuration, chosen once per call, and the kernels' parameters built from it and the
// validated arguments (bwd_params_builder.cu). cuda_backward (bwd_api.cu) hands both to the workspace and the
// launches, so every launch of a call sees one choice of kernel, tile and dQ staging.
#pragma once

#include <cstdint>

#include "api/backends.h"
#include "kernels/sm90/bwd/bwd_params.h"
#include "kernels/sm90/bwd/bwd_workspace.h"

namespace flash4::detail::bwd {

// An attention tensor as the kernels address it, (batch, seqlen, heads, head_dim) element strides: a packed
// (total, heads, head_dim) one is a single batch entry of `total` rows (batch stride 0).
struct BshdView {
  int64_t batch, seqlen;
  sm90::BshdStrides stride;
};
BshdView bshd(const TensorView& t);

// TMA can describe q, k, v and dout: 16-byte aligned bases, every stride (also of size-1 dimensions) a non-zero
// multiple of 16 bytes.
bool tma_describable(const BackwardArgs& args);
// 16-byte aligned rows: the kernels move head-dim rows in 16-byte vectors (cp.async, uint4).
bool rows_16b_aligned(const TensorView& t);

// Packed (cu_seqlens) and seqused batches run on the wgmma kernels' packed instantiation, every entry in its own
// lengths and band, wherever TMA can describe the tensors and there are rows to describe; the rest (layouts TMA
// cannot describe, empty packed tensors) as one dense call per sequence (bwd_sequences.h).
bool backward_packed_native(const BackwardArgs& args, const Problem& p);

struct BwdLaunchConfig {
  bool wgmma = false;           // the wgmma + TMA kernel (else the mma.sync one)
  bool packed = false;          // the wgmma kernel's per-entry instantiation (packed or seqused batches)
  int width = 0, width_v = 0;   // the compiled head dims that run the problem (zero-padded from the true ones)
  int block_m = 0, block_n = 0; // queries per Q tile, keys per CTA (or per mma.sync tile)
  // The mma.sync kernel's CTAs per K/V tile (d = 256: one per 128-column half), each with its own semaphores.
  int col_slices = 1;
};

// The one choice of kernel and tile for a problem cuda_can_backward accepted (see the top of bwd_api.cu).
BwdLaunchConfig choose_bwd_launch(const BackwardArgs& args, const Problem& p);

// The kernels' parameters without the workspace's pointers: tensors, sizes, band, score transform, and the
// choices that depend on them: the deterministic order, the GQA group split (wgmma kernels) and the dQ staging.
// `sm_count`: the current device's SMs.
sm90::BwdParams make_bwd_params(const BackwardArgs& args, const Problem& p, const BwdLaunchConfig& launch,
                                int sm_count);

// Rows of the LSE / D / dQ-accumulator workspace: (b, h, sq), or (h, total_q) with packed queries.
int64_t bwd_workspace_rows(const Problem& p);
// Whether the wgmma kernel runs persistent CTAs pulling work items from a counter (bwd_schedule.h,
// bwd_persistent_pays; never in deterministic mode).
bool bwd_runs_persistent(const sm90::BwdParams& params, const BwdLaunchConfig& launch, int64_t rows);
// What the call's workspace holds (bwd_workspace.h).
sm90::bwd::BwdWorkspaceNeeds bwd_workspace_needs(const sm90::BwdParams& params, const Problem& p,
                                                 const BwdLaunchConfig& launch, bool persistent);

}  // namespace flash4::detail::bwd
