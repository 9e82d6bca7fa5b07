// The normalized KV-cache attention problem every backend receives after validation (src/api/validate_kvcache.cpp):
// the attention sizes, mask and score transform (Problem, with seqlen_k = the cache's capacity), and where each
// sequence's keys lie (PagedKeys) and how many there are. Plain data, usable on host and device; index pointers live
// on the tensors' device and are clamped when read (flash4/kvcache.h).
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/paged_keys.h"
#include "common/problem.h"
#include "common/sequence.h"

namespace flash4::detail {

struct KvCacheProblem {
  Problem attention;  // batch, seqlen_q, heads, heads_kv, head_dim, scale, softcap, window, sink;
                      // seqlen_k = capacity (keys a sequence can hold)
  bool paged = false;
  int64_t num_slots = 0;                 // batch_cache (contiguous) or num_pages (paged): the caches' first dimension
  int64_t page_size = 0;                 // paged: rows per page; contiguous: seqlen_cache
  int page_shift = -1;                   // paged: log2(page_size) when a power of two, else -1
  int64_t max_pages = 1;                 // paged: block_table.shape[1]
  int64_t capacity = 0;                  // keys a sequence can hold: seqlen_cache or max_pages * page_size
  int64_t seqlen_new = 0;                // keys appended per sequence (0 without k, v)
  const int* cache_seqlens = nullptr;    // (batch) or null: then every sequence has cache_seqlen keys
  int64_t cache_seqlen = 0;              // resolved (never -1)
  const int* cache_batch_idx = nullptr;  // (batch) or null = identity
  const int* cache_leftpad = nullptr;    // (batch) or null: sequence b's keys start at this row (contiguous caches)
  const int* block_table = nullptr;      // (batch, max_pages) rows block_table_stride apart
  int64_t block_table_stride = 0;
  int64_t rotary_dim = 0;  // 0 = no rotary
  int64_t seqlen_ro = 0;   // rows of the cos / sin tables
  bool rotary_interleaved = true;
  int num_splits = 0;  // as requested (0 = automatic)
  // Packed keys (the packed forward's decode route): sequence b's keys are rows cu_seqlens_k[b] .. of one
  // (total_k, heads_kv, head_dim) tensor, slot 0 of a contiguous cache of total_k rows; cache_seqlens, if set, is
  // seqused_k. Null = a cache of sequences (the fields above).
  const int* cu_seqlens_k = nullptr;  // (batch + 1)
  int64_t total_k = 0;

  // Packed keys: offset and length of sequence b's keys, clamped as the packed forward clamps them.
  FLASH4_HD SequenceInfo packed_keys(int64_t b) const {
    SequenceLayout l;
    l.seqlen_k = capacity;
    l.total_k = total_k;
    l.cu_seqlens_k = cu_seqlens_k;
    l.seqused_k = cache_seqlens;
    return l.info(b);
  }

  // Row of sequence b's cache at which the append writes (cache_seqlens[b]), clamped so that the append fits:
  // [0, capacity - seqlen_new].
  FLASH4_HD int64_t cache_end(int64_t b) const {
    const int64_t n = cache_seqlens != nullptr ? cache_seqlens[b] : cache_seqlen;
    const int64_t max = capacity - seqlen_new;
    return n < 0 ? 0 : n > max ? max : n;
  }
  // Rows before sequence b's first key (flash-attn's cache_leftpad), clamped to [0, cache_end(b)].
  FLASH4_HD int64_t left_pad(int64_t b) const {
    if (cache_leftpad == nullptr) return 0;
    const int64_t pad = cache_leftpad[b], end = cache_end(b);
    return pad < 0 ? 0 : pad > end ? end : pad;
  }
  // Keys in sequence b's cache before the append.
  FLASH4_HD int64_t cache_length(int64_t b) const {
    if (cu_seqlens_k != nullptr) return packed_keys(b).seqlen_k;  // nothing is appended to packed keys
    return cache_end(b) - left_pad(b);
  }
  // Rotary position of sequence b's key j: its row in the cache (flash-attn's rule: left padding counts).
  FLASH4_HD int64_t rotary_position(int64_t b, int64_t j) const { return left_pad(b) + j; }
  // Keys sequence b attends to: its cache and the appended keys.
  FLASH4_HD int64_t seqlen_k(int64_t b) const { return cache_length(b) + seqlen_new; }

  // Where sequence b's keys lie in the caches.
  FLASH4_HD PagedKeys keys(int64_t b) const {
    if (cu_seqlens_k != nullptr) return PagedKeys::contiguous(0, total_k, 1, packed_keys(b).k_offset);
    if (paged) return PagedKeys::paged(block_table + b * block_table_stride, page_size, max_pages, num_slots,
                                      page_shift);
    int64_t slot = cache_batch_idx != nullptr ? cache_batch_idx[b] : b;
    slot = slot < 0 ? 0 : slot > num_slots - 1 ? num_slots - 1 : slot;
    return PagedKeys::contiguous(slot, page_size, num_slots, left_pad(b));
  }

  // Whether q row i takes the rotary angle of key position cache_length + i (causal or windowed) or of
  // cache_length (rotary_position gives the row).
  FLASH4_HD bool rotary_q_per_row() const { return window().any(); }
  // Row of the cos / sin tables for position `pos` (clamped: device-resident lengths are not checked).
  FLASH4_HD int64_t rotary_row(int64_t pos) const { return pos < 0 ? 0 : pos > seqlen_ro - 1 ? seqlen_ro - 1 : pos; }

  // The mask inside sequence b (bottom-right aligned with its keys after the append).
  FLASH4_HD SequenceMask sequence_mask(int64_t b) const {
    return SequenceMask::make(window(), attention.seqlen_q, seqlen_k(b));
  }
  // The call's mask (causal folded in). Problem's own accessors are host-only.
  FLASH4_HD AttentionMask window() const { return {attention.window_left, attention.window_right}; }
};

}  // namespace flash4::detail
