"""Merging attention results computed over disjoint parts of the keys by their log-sum-exp: the one combine
step of ring attention (flash4.distributed) and of split-KV decoding.

For one query row, attention over keys K = K_a ∪ K_b (disjoint) from the two partial results
(out_a, lse_a) over K_a and (out_b, lse_b) over K_b, with lse = log(sum_j exp(s_j)) in natural log, is

    lse = log(exp(lse_a) + exp(lse_b)) = max + log(exp(lse_a - max) + exp(lse_b - max)),  max = max(lse_a, lse_b)
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

because each partial output is its keys' softmax-weighted sum of values normalized by exp(lse_part). A part
that saw no key has lse = -inf (and out = 0) and gets weight 0; when both parts saw none, lse = -inf, out = 0.
The merge is associative and commutative in exact arithmetic; in floating point a fixed merge order gives
bit-identical results run to run. The C++ split-KV combine (src/common/lse_combine.h, docs/kvcache.md) applies the
same formula to n parts at once.
"""

import torch


def merge_attention_partials(out_acc, lse_acc, out_part, lse_part):
    """Merges the partial result (out_part, lse_part) into the accumulator (out_acc, lse_acc) in place.

    out_acc: (batch, seqlen_q, heads, head_dim) float32; lse_acc: (batch, heads, seqlen_q) float32 (the
    accumulators may be views, e.g. the rows of one segment). out_part: like out_acc in any floating dtype;
    lse_part: like lse_acc. Rows never merged into start as out = 0, lse = -inf."""
    lse_new = torch.logaddexp(lse_acc, lse_part)
    # -inf - -inf is nan: a row that no part has seen keeps weight 0 and lse -inf.
    unseen = torch.isneginf(lse_new)
    lse_safe = torch.where(unseen, torch.zeros_like(lse_new), lse_new)
    weight_acc = torch.exp(lse_acc - lse_safe).masked_fill_(unseen, 0.0)
    weight_part = torch.exp(lse_part - lse_safe).masked_fill_(unseen, 0.0)
    # Weights are (batch, heads, seqlen_q); the outputs are (batch, seqlen_q, heads, head_dim).
    weight_acc = weight_acc.transpose(1, 2).unsqueeze(-1)
    weight_part = weight_part.transpose(1, 2).unsqueeze(-1)
    # Two passes over the accumulator (addcmul_ reads out_part in its own dtype: no converted copy).
    out_acc.mul_(weight_acc).addcmul_(out_part, weight_part)
    lse_acc.copy_(lse_new)


def empty_attention_accumulator(batch, seqlen_q, heads, head_dim, device):
    """(out, lse) for merge_attention_partials before any part: out = 0 (float32), lse = -inf."""
    out = torch.zeros((batch, seqlen_q, heads, head_dim), dtype=torch.float32, device=device)
    lse = torch.full((batch, heads, seqlen_q), float("-inf"), dtype=torch.float32, device=device)
    return out, lse
