// Element offsets of the judges' contiguous fp64 arrays in the public layouts, dense or packed, so the fp64
// reference and the naive baseline address both alike. Dense: q/out (batch, seqlen_q, heads, head_dim), lse
// (batch, heads, seqlen_q). Packed (p.varlen()): q/out (total_q, heads, head_dim), lse (heads, total_q). K and V
// likewise with the key sizes. Index pointers in `p` (cu_seqlens, seqused) must be host-resident.
#pragma once

#include <cstdint>

#include "common/problem.h"

namespace flash4::reference {

struct ArrayIndex {
  const detail::Problem& p;

  // Token rows of the arrays: total_q / total_k, or batch * seqlen for a dense problem.
  int64_t q_rows() const { return p.varlen() ? p.total_q : p.batch * p.seqlen_q; }
  int64_t k_rows() const { return p.varlen() ? p.total_k : p.batch * p.seqlen_k; }
  int64_t lse_size() const { return q_rows() * p.heads; }

  detail::SequenceInfo info(int64_t b) const { return p.layout().info(b); }
  // First row of entry b's queries / keys in the arrays.
  int64_t q_base(int64_t b) const { return p.varlen() ? info(b).q_offset : b * p.seqlen_q; }
  int64_t k_base(int64_t b) const { return p.varlen() ? info(b).k_offset : b * p.seqlen_k; }

  // Offsets of (entry b, token i, head h, 0) and of lse(entry b, head h, token i), given q_base / k_base. q, k
  // (and dq, dk) rows have head_dim elements; v, out (and dv, dout) rows have head_dim_v.
  int64_t q_row(int64_t base, int64_t i, int64_t h) const { return ((base + i) * p.heads + h) * p.head_dim; }
  int64_t k_row(int64_t base, int64_t j, int64_t hk) const { return ((base + j) * p.heads_kv + hk) * p.head_dim; }
  int64_t out_row(int64_t base, int64_t i, int64_t h) const { return ((base + i) * p.heads + h) * p.head_dim_v; }
  int64_t v_row(int64_t base, int64_t j, int64_t hk) const { return ((base + j) * p.heads_kv + hk) * p.head_dim_v; }
  int64_t lse_at(int64_t b, int64_t h, int64_t i) const {
    return p.varlen() ? h * p.total_q + q_base(b) + i : (b * p.heads + h) * p.seqlen_q + i;
  }
};

}  // namespace flash4::reference
