"""Test-side attention in torch with autograd, for the tests of entry points layered on flash_attn_func and
flash_attn_varlen_func: in float64 the exact reference, and with round_to the naive same-dtype baseline of the
tolerance rule (attention_reference.py: P and O rounded to the dtype), dense or per sequence of a packed batch.

The naive baseline's backward takes D = rowsum(dO * O) from the stored output that the implementation's backward
was given (argument delta, from stored_output_delta), as the C++ naive backward (src/check/naive_attention.h)
and every FlashAttention backward do: where dP - D cancels (rows that see few keys, a sink's share, softcap) O's
rounding dominates dQ and dK, and the baseline must carry the same draw of that rounding as the implementation."""

import torch

from attention_reference import allowed_keys


class _SoftmaxWithGivenD(torch.autograd.Function):
    """softmax over the last dim whose backward is dS = P (dP - D) with D given per row, not rowsum(P dP)."""

    @staticmethod
    def forward(ctx, s, delta):
        p = torch.softmax(s, dim=-1)
        ctx.save_for_backward(p, delta)
        return p

    @staticmethod
    def backward(ctx, dp):
        p, delta = ctx.saved_tensors
        return p * (dp - delta[..., None]), None


def stored_output_delta(out, dout):
    """D = rowsum(dO * O) in float64, laid out as the lse: (batch, heads, seqlen_q) of dense (batch, seqlen_q,
    heads, d_v) tensors, (heads, total_q) of packed (total_q, heads, d_v) ones."""
    return (dout.detach().double() * out.detach().double()).sum(-1).transpose(-1, -2)


def attention(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, round_to=None, sink=None, delta=None):
    """(out, lse) of q (batch, seqlen_q, heads, d), k / v (batch, seqlen_k, heads_kv, d / d_v) in q's dtype (float64
    here), lse (batch, heads, seqlen_q). Rows that see no key (nor a sink) get out 0 and lse -inf. round_to: P and
    O rounded to that dtype and lse to float32, the naive baseline. sink (heads,): one more score column per row
    that carries no value (dropped after the softmax). delta (batch, heads, seqlen_q): the backward's D =
    rowsum(dO * O) of the stored output (stored_output_delta), for the naive baseline; None: autograd's own D."""
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    ok = torch.from_numpy(allowed_keys(q.shape[1], k.shape[1], causal, window)).to(q.device)
    s = s.masked_fill(~ok, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.to(s.dtype)[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    seen = torch.isfinite(lse)[..., None]
    # A row without keys would give softmax NaN: its scores are zeroed first and its probabilities dropped.
    s = s.masked_fill(~seen, 0.0)
    if delta is None:
        p = torch.softmax(s, dim=-1)
    else:
        p = _SoftmaxWithGivenD.apply(s, torch.where(seen[..., 0], delta.to(s.dtype), 0.0))
    p = torch.where(seen, p, torch.zeros_like(s))
    if sink is not None:
        p = p[..., :-1]
    if round_to is not None:
        p = p.to(round_to).to(q.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    if round_to is not None:
        out = out.to(round_to).to(q.dtype)
        lse = lse.float().to(q.dtype)
    return out, lse


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, delta=None, **options):
    """attention() on each sequence of a packed batch, q (total_q, heads, d), k / v (total_k, heads_kv, d / d_v),
    offsets as lists covering every row; lse and delta (heads, total_q)."""
    outs, lses = [], []
    for b in range(len(cu_seqlens_q) - 1):
        rows_q = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])
        rows_k = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])
        seq_delta = None if delta is None else delta[None, :, rows_q]
        out, lse = attention(q[None, rows_q], k[None, rows_k], v[None, rows_k], scale, delta=seq_delta, **options)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def numpy64(t):
    return t.detach().to("cpu", torch.float64).numpy()
