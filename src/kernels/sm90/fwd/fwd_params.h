// Kernel parameters of the Hopper forward pass, filled by fwd_api.cu from the validated problem and the launch
// configuration.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/descale.h"
#include "common/kvcache_problem.h"
#include "common/mask.h"
#include "common/score_transform.h"
#include "common/sequence.h"

namespace flash4::sm90 {

struct FwdParams {
  // Packed (variable-length) tensors are mapped as one batch entry of total_q / total_k rows; a sequence's
  // tokens start at its offset in the layout (`seq`).
  // The maps keep the tensors' true widths (d, dv), which may be narrower than the kernel's kHeadDim columns:
  // TMA zero-fills the columns past them (head_dims.h).
  CUtensorMap tma_q;  // (b, sq, h, d),    box 64 cols x block_m rows
  CUtensorMap tma_k;  // (b, sk, hkv, d),  box 64 cols x block_n rows
  CUtensorMap tma_v;  // (b, sk, hkv, dv), box 64 cols x block_n rows

  void* out = nullptr;   // (b, sq, h, dv) bf16/fp16, element strides below (packed: stride_b 0), dv contiguous
  int head_dim_v = 0;    // dv, out's true width: the epilogue stores columns below it only
  int64_t out_stride_b = 0, out_stride_s = 0, out_stride_h = 0;
  float* lse = nullptr;  // (b, h, sq) fp32, optional (packed: (h, total_q), stride_b 0)
  int64_t lse_stride_b = 0, lse_stride_h = 0;
  const float* learnable_sink = nullptr;  // (h) fp32 logits in every row's softmax denominator; null = none

  int* tile_counter = nullptr;  // the dynamic tile scheduler's next tile: zero at launch, left zero at the end

  int batch = 0, heads = 0, group = 1;  // group = heads / heads_kv
  int num_m_blocks = 0;                 // query tiles per (batch, head) of the longest sequence
  int tile_section = 1;                 // (batch, head) pairs per L2 section of the masked tile order

  detail::SequenceLayout seq;     // where each batch entry's queries and keys lie
  detail::AttentionMask mask;     // window with causal folded in
  detail::ScoreTransform score;   // q·k -> log2-domain score
  bool clear_key_tail = false;   // K/V rows past an entry's keys may hold anything (FwdMainloop::clear_v_tail)
  bool conditional_rescale = true;
  bool exp2_poly = true;          // use the config's polynomial share of exps

  // KV-cache keys (flash_attn_with_kvcache's prefill route, fwd_kvcache.h): tma_k / tma_v map the caches as
  // (slots, rows, heads_kv, d), and key tile j.. of entry b lies in one cache row or page (fwd_producer.cuh,
  // cache_coords), one box of kv_rows_per_load = block_n rows. Off: keys through `seq`.
  bool kv_cache = false;
  int kv_rows_per_load = 0;
  detail::KvCacheProblem kv;

  // FP8 kernels (fwd_fp8.cu): tma_q / tma_k map e4m3 tensors (boxes of 128 columns), tma_v the transposed copy
  // of v (b, hkv, d, keys); the descale factors per (batch, kv head).
  detail::Descale q_descale, k_descale, v_descale;
};

}  // namespace flash4::sm90
