// Forward rows the attention kernel does not write. With no keys at all (seqlen_k = 0, which TMA cannot describe)
// every row gets out = 0 and LSE = -inf (or the row's learnable sink). In a packed or seqused batch, rows that
// take part in no sequence (past seqused_q, past cu_seqlens_q[batch]) get out = 0 and LSE = -inf; the attention
// kernel writes the rest.
#pragma once

#include <cuda_runtime.h>

#include "common/problem.h"
#include "flash4/api.h"

namespace flash4::sm90 {

void launch_forward_no_keys(const ForwardArgs& args, const detail::Problem& p, cudaStream_t stream);
void launch_forward_uncovered_rows(const ForwardArgs& args, const detail::Problem& p, cudaStream_t stream);
// Zeroes every row of a 16-bit attention tensor, (batch, seqlen, heads, head_dim) or packed (total, heads,
// head_dim), any strides (the packed GPU backward clears its gradients with it).
void launch_zero_rows(const TensorView& t, cudaStream_t stream);
// Zeroes the key rows of a packed or seqused batch that take part in no sequence (past seqused_k, past
// cu_seqlens_k[batch]) of a (batch, seqlen_k, heads_kv, d) or (total_k, heads_kv, d) tensor: the backward's dK, dV
// there.
void launch_zero_uncovered_key_rows(const TensorView& t, const detail::Problem& p, cudaStream_t stream);

}  // namespace flash4::sm90
