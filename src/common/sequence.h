// Where the queries and keys of one batch entry lie, and how long they are. Every backend asks this one type,
// so that dense batches, packed variable-length batches (cu_seqlens), partly used segments (seqused_q/k) and a
// paged key/value cache differ only in the answers, not in the kernels' loops.
//
// Dense: every sequence has seqlen_q queries and seqlen_k keys, addressed by (batch, position). Packed: tokens are
// addressed by one running position instead: sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1]
// - 1 of a (total_q, heads, head_dim) tensor (the same for the keys). Dense is the packed case with the implicit
// offsets b * seqlen, which backends that keep a batch index simply leave at 0 (q_offset / k_offset below).
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

// One batch entry's queries and keys.
struct SequenceInfo {
  int64_t q_offset = 0, k_offset = 0;  // first token's row in a packed tensor (0 for dense: batch indexes it)
  int64_t seqlen_q = 0, seqlen_k = 0;  // queries and keys of this entry that take part (after seqused_q / k)
};

struct SequenceLayout {
  int64_t seqlen_q = 0, seqlen_k = 0;  // dense: every entry's lengths; packed: the maxima (max_seqlen_q / k)
  int64_t total_q = 0, total_k = 0;    // rows of the packed tensors (dense: batch * seqlen)
  const int* cu_seqlens_q = nullptr;  // (batch + 1) running token offsets of the queries; null = dense
  const int* cu_seqlens_k = nullptr;  // the same for the keys; null = dense
  const int* seqused_q = nullptr;     // queries used per entry (<= its segment); null = the whole segment
  const int* seqused_k = nullptr;     // keys used per entry (<= its segment); null = the whole segment
  // Packed queries shared between two kernels of one call (the KV-cache path's decode kernel takes the short
  // segments): an entry whose segment holds fewer queries than this takes no part here (seqlen_q 0).
  int64_t min_seqlen_q = 0;

  FLASH4_HD bool packed() const { return cu_seqlens_q != nullptr || cu_seqlens_k != nullptr; }

  // Entry b's offsets and lengths. Device-resident offsets cannot be checked without a synchronisation, so they
  // are clamped instead: an offset to [0, total], a length to [0, the maximum] and to total - offset, seqused to
  // [0, the segment]. Whatever the offsets hold, a kernel never reads or writes outside the packed tensors nor
  // past what the launch was sized for (validation checks them exactly where they are host-resident).
  FLASH4_HD SequenceInfo info(int64_t b) const {
    SequenceInfo s;
    s.seqlen_q = seqlen_q;
    s.seqlen_k = seqlen_k;
    // Dense batches take one branch here: tested one pointer at a time, the compiler predicated the seqused
    // reads and clamps, and every tile of a dense kernel issued them.
    if ((reinterpret_cast<uintptr_t>(cu_seqlens_q) | reinterpret_cast<uintptr_t>(cu_seqlens_k) |
         reinterpret_cast<uintptr_t>(seqused_q) | reinterpret_cast<uintptr_t>(seqused_k)) == 0)
      return s;
    if (cu_seqlens_q != nullptr) {
      s.q_offset = clamp(cu_seqlens_q[b], total_q);
      s.seqlen_q = clamp(clamp(int64_t{cu_seqlens_q[b + 1]} - cu_seqlens_q[b], seqlen_q), total_q - s.q_offset);
      if (s.seqlen_q < min_seqlen_q) s.seqlen_q = 0;
    }
    if (cu_seqlens_k != nullptr) {
      s.k_offset = clamp(cu_seqlens_k[b], total_k);
      s.seqlen_k = clamp(clamp(int64_t{cu_seqlens_k[b + 1]} - cu_seqlens_k[b], seqlen_k), total_k - s.k_offset);
    }
    if (seqused_q != nullptr) s.seqlen_q = clamp(seqused_q[b], s.seqlen_q);
    if (seqused_k != nullptr) s.seqlen_k = clamp(seqused_k[b], s.seqlen_k);
    return s;
  }

  // The entry whose query segment starts at or before packed row j: the last b < batch with cu_seqlens_q[b] <= j,
  // or -1 when there is none. A binary search over the offsets, for kernels that walk packed rows instead of
  // entries; whether row j takes part is then info(b)'s question. Reads only cu_seqlens_q[0 .. batch - 1],
  // whatever they hold.
  FLASH4_HD int64_t entry_at_q_row(int64_t j, int64_t batch) const {
    if (batch <= 0 || j < cu_seqlens_q[0]) return -1;
    int64_t lo = 0, hi = batch;  // cu_seqlens_q[lo] <= j; the answer is in [lo, hi)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (cu_seqlens_q[mid] <= j) lo = mid;
      else hi = mid;
    }
    return lo;
  }

 private:
  // n clamped to [0, max].
  FLASH4_HD static int64_t clamp(int64_t n, int64_t max) { return n < 0 ? 0 : n > max ? max : n; }
};

// offsets[i] of device-resident running offsets (cu_seqlens) clamped to [0, total], as SequenceLayout::info clamps
// its own: for kernels that walk a packed batch's rows by the offsets themselves.
FLASH4_HD int64_t clamped_offset(const int* offsets, int64_t i, int64_t total) {
  const int64_t x = offsets[i];
  return x < 0 ? int64_t{0} : x > total ? total : x;
}

// Dense layout: every entry seqlen_q x seqlen_k (totals left 0: no packed tensor is addressed).
FLASH4_HD SequenceLayout dense_layout(int64_t seqlen_q, int64_t seqlen_k) {
  SequenceLayout l;
  l.seqlen_q = seqlen_q;
  l.seqlen_k = seqlen_k;
  return l;
}

}  // namespace flash4::detail
