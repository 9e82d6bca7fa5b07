// Where the queries and keys of one batch entry lie, and how long they are. Every backend asks this one type,
// so that dense batches, packed variable-length batches (cu_seqlens), partly used key segments (seqused_k) and a
// paged key/value cache differ only in the answers, not in the kernels' loops.
//
// Today only the dense layout is produced (validation rejects the rest): every sequence has seqlen_q queries and
// seqlen_k keys, addressed by (batch, position). Packed layouts address tokens by one running position instead:
// sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of a (total_q, heads, head_dim) tensor.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

// One batch entry's queries and keys.
struct SequenceInfo {
  int64_t q_offset = 0, k_offset = 0;  // first token's row in a packed tensor (0 for dense: batch indexes it)
  int64_t seqlen_q = 0, seqlen_k = 0;  // queries and (used) keys of this entry
};

struct SequenceLayout {
  int64_t seqlen_q = 0, seqlen_k = 0;  // dense: every entry's lengths; packed: the maxima
  const int* cu_seqlens_q = nullptr;  // (batch + 1) running token offsets of the queries; null = dense
  const int* cu_seqlens_k = nullptr;  // the same for the keys; null = dense
  const int* seqused_k = nullptr;     // keys used per entry (<= its segment); null = the whole segment

  FLASH4_HD bool packed() const { return cu_seqlens_q != nullptr || cu_seqlens_k != nullptr; }

  // Entry b's offsets and lengths. Device-resident offsets cannot be checked without a synchronisation, so the
  // lengths are clamped to the maxima: a kernel never reads or writes past what the launch was sized for.
  FLASH4_HD SequenceInfo info(int64_t b) const {
    SequenceInfo s;
    s.seqlen_q = seqlen_q;
    s.seqlen_k = seqlen_k;
    if (cu_seqlens_q != nullptr) {
      s.q_offset = cu_seqlens_q[b];
      s.seqlen_q = clamp_length(cu_seqlens_q[b + 1] - s.q_offset, seqlen_q);
    }
    if (cu_seqlens_k != nullptr) {
      s.k_offset = cu_seqlens_k[b];
      s.seqlen_k = clamp_length(cu_seqlens_k[b + 1] - s.k_offset, seqlen_k);
    }
    if (seqused_k != nullptr) s.seqlen_k = clamp_length(seqused_k[b], s.seqlen_k);
    return s;
  }

 private:
  FLASH4_HD static int64_t clamp_length(int64_t n, int64_t max) { return n < 0 ? 0 : n > max ? max : n; }
};

// Dense layout: every entry seqlen_q x seqlen_k.
FLASH4_HD SequenceLayout dense_layout(int64_t seqlen_q, int64_t seqlen_k) {
  SequenceLayout l;
  l.seqlen_q = seqlen_q;
  l.seqlen_k = seqlen_k;
  return l;
}

}  // namespace flash4::detail
