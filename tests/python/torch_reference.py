"""Test-side attention in torch with autograd, for the tests of entry points layered on flash_attn_func and
flash_attn_varlen_func: in float64 the exact reference, and with round_to the naive same-dtype baseline of the
tolerance rule (attention_reference.py: P and O rounded to the dtype), dense or per sequence of a packed batch."""

import torch

from attention_reference import allowed_keys


def attention(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, round_to=None, sink=None):
    """(out, lse) of q (batch, seqlen_q, heads, d), k / v (batch, seqlen_k, heads_kv, d / d_v) in q's dtype (float64
    here), lse (batch, heads, seqlen_q). Rows that see no key (nor a sink) get out 0 and lse -inf. round_to: P and
    O rounded to that dtype and lse to float32, the naive baseline. sink (heads,): one more score column per row
    that carries no value (dropped after the softmax)."""
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
    p = torch.where(seen, torch.softmax(s.masked_fill(~seen, 0.0), dim=-1), torch.zeros_like(s))
    if sink is not None:
        p = p[..., :-1]
    if round_to is not None:
        p = p.to(round_to).to(q.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    if round_to is not None:
        out = out.to(round_to).to(q.dtype)
        lse = lse.float().to(q.dtype)
    return out, lse


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, **options):
    """attention() on each sequence of a packed batch, q (total_q, heads, d), k / v (total_k, heads_kv, d / d_v),
    offsets as lists covering every row; lse (heads, total_q)."""
    outs, lses = [], []
    for b in range(len(cu_seqlens_q) - 1):
        rows_q = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])
        rows_k = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])
        out, lse = attention(q[None, rows_q], k[None, rows_k], v[None, rows_k], scale, **options)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def numpy64(t):
    return t.detach().to("cpu", torch.float64).numpy()
