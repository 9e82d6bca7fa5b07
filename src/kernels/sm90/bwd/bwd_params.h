// Kernel parameters of the backward pass (preprocess, main kernel, postprocess), built by bwd_params_builder.cu.
// Plain data: pointers, element strides and the mask as a band of allowed key-minus-query offsets. Host-only C++
// (no CUDA headers), so the CPU tests can use it (tests/cpu/test_bwd_schedule.cpp).
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/mask.h"
#include "common/sequence.h"

namespace flash4::sm90 {

// Strides in elements of a (batch, seqlen, heads, head_dim) tensor; head_dim is contiguous.
struct BshdStrides {
  int64_t batch = 0, seq = 0, head = 0;
};

struct BwdParams {
  // Inputs (dtype = the kernel's Element).
  // d = head_dim (q, k, dq, dk), dv = head_dim_v (v, out, dout, dv); the kernels may run them zero-padded to a
  // wider compiled width (head_dims.h) and bound every store they make themselves by these true widths.
  const void* q = nullptr;     // (b, sq, h, d)
  const void* k = nullptr;     // (b, sk, hkv, d)
  const void* v = nullptr;     // (b, sk, hkv, dv)
  const void* out = nullptr;   // (b, sq, h, dv)
  const void* dout = nullptr;  // (b, sq, h, dv)
  const float* lse = nullptr;  // (b, h, sq) natural log, -inf for a fully masked row
  int64_t lse_stride_b = 0, lse_stride_h = 0;
  BshdStrides q_stride, k_stride, v_stride, out_stride, dout_stride;

  // Outputs.
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  BshdStrides dq_stride, dk_stride, dv_stride;

  // Workspace (one cudaMallocAsync block, laid out in bwd_workspace.h), all contiguous.
  // (b, h, sq, dq_accum_cols) fp32, zeroed; holds sum_j dS_ij k_j (scale applied in postprocess). Rows are d
  // wide, or with dq_fragment_order rounded up to 32 and each 32-column block permuted (dq_fragment_column).
  float* dq_accum = nullptr;
  int dq_accum_cols = 0;
  bool dq_fragment_order = false;
  float* dsum = nullptr;      // (b, h, sq) D_i = sum_d dO_i * O_i
  float* lse_log2 = nullptr;  // (b, h, sq) LSE * log2(e); +inf for a fully masked row so that P = exp2(-inf) = 0
  int* semaphores = nullptr;  // (b, h, m_blocks), zeroed; deterministic mode only
  int* work_counter = nullptr;  // zeroed; the persistent wgmma kernel's item counter (null: one item per CTA)

  // The learnable sink (fp32 (h), natural-log logits; null = none) and its gradient dsink (fp32 (h); null = not
  // requested). The main kernel needs nothing of the sink: the forward's LSE includes it.
  const float* learnable_sink = nullptr;
  float* dsink = nullptr;

  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads = 0, heads_kv = 0, group = 1, head_dim = 0, head_dim_v = 0;
  int m_blocks = 0, n_blocks = 0;

  // GQA groups split across work items where (key tile, kv head, batch) items alone would leave SMs idle
  // (bwd_item_plan.h, bwd_group_parts; wgmma kernels only). An item's kv coordinate is then a slot
  // hkv * group_parts + part, and part takes group / group_parts of the group's query heads (GroupPart). With
  // group_parts > 1 the items write dK, dV as fp32 partials, (group_parts, partial_rows, heads_kv, d) and
  // (..., dv), which bwd_group_reduce_kernel sums in part order (deterministic) into dk, dv.
  int group_parts = 1;
  float* dk_partial = nullptr;
  float* dv_partial = nullptr;
  int64_t partial_rows = 0;  // key rows of one part: batch * seqlen_k, or total_k when the keys are packed
  // Work items' order (bwd_schedule.h, item_position): 0 = each (slot, batch) pair's key tiles one after the other;
  // > 0 = every pair's first key tiles first, within sections of this many pairs (bwd_order_section).
  int order_section = 0;

  // Mask as a band: key j is visible to query i iff band_lo <= j - i <= band_hi (and j < seqlen_k). Unbounded
  // sides are clamped sentinels (+-kBandSentinel) that every real offset satisfies.
  int band_lo = 0, band_hi = 0;

  // The score transform (common/score_transform.h, one meaning): the score in log2 units is q.k * log2_scale, or
  // tanh(q.k * tanh_scale) * log2_scale with softcap; dK and dQ are scaled by softmax_scale.
  float softmax_scale = 0.0f;
  float softcap = 0.0f;     // 0 = off
  float tanh_scale = 0.0f;  // softmax_scale / softcap (softcap only)
  float log2_scale = 0.0f;  // softmax_scale * log2(e), or softcap * log2(e) with softcap
  bool deterministic = false;
  // Deterministic without a mask, with few enough key tiles per (batch, kv head) that all of them are resident
  // at once (make_bwd_params decides): Q loops rotate as in the non-deterministic mode and the additions into a Q tile
  // follow the order in which the CTAs reach it (bwd_schedule.h, det_arrival_rank).
  bool det_rotated = false;
  // d = 192 / 256 deterministic: a warpgroup releases its dQ additions one tile late (bwd_wgmma_roles_kernel.cuh,
  // release_dq), so that their fence no longer stalls it; not where the unrotated release chain of a head whose
  // CTAs are all resident is the critical path (make_bwd_params decides).
  bool det_defer_release = false;

  // Packed (cu_seqlens) and seqused batches, run by the kernels' kPacked instantiations: where each entry's rows
  // lie and how many take part (common/sequence.h), and the call's window, from which each entry's band is made
  // (bwd_schedule.h, BwdSequence). Then batch counts the entries, seqlen_q / seqlen_k are the maxima, m_blocks /
  // n_blocks their tiles, and band_lo / band_hi are unused. Dense launches leave `seq` dense.
  detail::SequenceLayout seq;
  detail::AttentionMask mask;
  // Deterministic without a mask: the key tiles of one (entry, kv head) that may all be resident at once, for the
  // per-entry rotated order (bwd_schedule.h, det_rotates); 0 = never rotated.
  int det_resident_key_tiles = 0;

  // What a dense launch's every entry answers to the questions BwdSequence answers per entry of a packed one:
  // as constants, so that the per-entry code of a dense kernel compiles as if they were not asked.
  static constexpr int q_offset = 0, k_offset = 0;  // rows start at position 0 of entry b
  static constexpr bool packed_q = false, packed_k = false;  // tensors indexed by (b, position)
};

// Where column c of dQ lies in a dq_fragment_order accumulator row: each 32-column block is two groups q of 16,
// and the four columns 2t, 2t + 1, 2t + 8, 2t + 9 of group q (one thread's in a wgmma accumulator fragment) are the
// four floats of 16-byte unit 2t + q, so that the wgmma kernel stages a dQ piece with 16-byte stores
// (bwd_wgmma_consumer.cuh) and the postprocess reads four whole units per 16 columns.
FLASH4_HD int dq_fragment_column(int c) {
  const int in_block = c % 32, q = in_block / 16, hi = (in_block % 16) / 8, t = (in_block % 8) / 2;
  return c - in_block + 4 * (2 * t + q) + 2 * hi + in_block % 2;
}

// Largest |j - i| the kernels meet is below 2^30 + 2^7 (seqlens are limited to 2^30 by cuda_can_backward).
inline constexpr int kBandSentinel = (1 << 30) + (1 << 20);

// One side of SequenceMask's band (common/mask.h) in int: beyond the sentinels (unbounded sides included) it
// becomes the sentinel, which every real offset satisfies.
FLASH4_HD int clamp_band(int64_t offset) {
  return static_cast<int>(offset < -kBandSentinel ? -kBandSentinel : offset > kBandSentinel ? kBandSentinel : offset);
}

}  // namespace flash4::sm90
