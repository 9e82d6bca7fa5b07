"""Ring attention over a packed batch: the dense ring (_ring_attention) with packed shards. Each ring step is a
few packed flash4 calls (_varlen_plan), whose partial results merge into this rank's rows by their LSE; the
K/V shards, of different lengths on different ranks, travel with receive buffers sized from cu_seqlens (every
rank knows every shard's length, so no lengths are sent).

A learnable sink (one extra logit per head, no value) enters each row's softmax once: after the ring, as one
more partial result with out = 0 and lse = sink. Its gradient is this rank's rows' share,
dsink[h] = -sum_rows exp(sink[h] - lse[h, row]) * rowsum(dO * O)[row, h]; the shares of the ranks add up to
the unsharded gradient (reduce it across the group like any replicated parameter's gradient).
"""

import torch

from .. import _torch_ops  # noqa: F401  (registers torch.ops.flash4.fwd and .bwd)
from .._lse_merge import merge_attention_partials
from ._block_plan import global_band
from ._ring_attention import finish_exchanges, last_dim_contiguous
from ._varlen_plan import plan_varlen_step

_TAG_KV, _TAG_DKV = 0, 1  # message streams of the ring (see Ring.start_exchange)


def varlen_ring_plans(ring, layout_, causal, window_left, window_right, device):
    """For each ring step, the packed calls of this rank's queries against the K/V shard it holds then (the
    shard of rank (rank - step) mod world_size)."""
    band = global_band(causal, window_left, window_right)
    mine = layout_.segments[ring.rank]
    plans = []
    for step in range(ring.world_size):
        source = (ring.rank - step) % ring.world_size
        plans.append(plan_varlen_step(mine, layout_.segments[source], band, layout_.rows[ring.rank],
                                      layout_.rows[source], device))
    return plans


def _take(x, rows, dim=0):
    return x if rows is None else x.index_select(dim, rows)


def _merge_rows(out_acc, lse_acc, rows, out_part, lse_part):
    """merge_attention_partials on the rows `rows` (None = all) of the packed accumulators, through a leading
    batch dimension of 1 (out (total, heads, d), lse (heads, total))."""
    if rows is None:
        merge_attention_partials(out_acc[None], lse_acc[None], out_part[None], lse_part[None])
        return
    out_rows, lse_rows = out_acc.index_select(0, rows), lse_acc.index_select(1, rows)
    merge_attention_partials(out_rows[None], lse_rows[None], out_part[None], lse_part[None])
    out_acc.index_copy_(0, rows, out_rows)
    lse_acc.index_copy_(1, rows, lse_rows)


def _add_rows(acc, rows, part):
    # A call names each row at most once; gather-add-scatter keeps the sum deterministic on every device.
    if rows is None:
        acc += part
    else:
        acc.index_copy_(0, rows, acc.index_select(0, rows) + part)


def _call_options(call, softmax_scale, softcap, deterministic):
    return (softmax_scale, False, call.window_left, call.window_right, softcap, deterministic, call.cu_seqlens_q,
            call.cu_seqlens_k, None, None, call.max_seqlen_q, call.max_seqlen_k)


def varlen_ring_forward(q, k, v, sink, ring, plans, receive_rows, softmax_scale, softcap, deterministic):
    """(out, lse) of this rank's packed queries against every K/V shard; out like q, lse (heads, total)
    float32. receive_rows[step]: the length of the shard that arrives for step + 1."""
    total, heads, _ = q.shape
    out_acc = torch.zeros((total, heads, v.shape[-1]), dtype=torch.float32, device=q.device)
    lse_acc = torch.full((heads, total), float("-inf"), dtype=torch.float32, device=q.device)
    kv = [k.contiguous(), v.contiguous()]
    for step, plan in enumerate(plans):
        pending = (ring.start_exchange(kv, _TAG_KV, receive_rows[step]) if step + 1 < ring.world_size else None)
        k_shard, v_shard = kv
        try:
            for call in plan:
                out_part, lse_part = torch.ops.flash4.fwd(
                    _take(q, call.q_rows), _take(k_shard, call.k_rows), _take(v_shard, call.k_rows),
                    *_call_options(call, softmax_scale, softcap, deterministic))
                _merge_rows(out_acc, lse_acc, call.q_rows, out_part, lse_part)
        except BaseException:
            finish_exchanges(pending)
            raise
        if pending is not None:
            kv = pending.wait()
    if sink is not None:
        merge_attention_partials(out_acc[None], lse_acc[None], torch.zeros_like(out_acc)[None],
                                 sink[None, :, None].expand(1, heads, total))
    return out_acc.to(q.dtype), lse_acc


def varlen_ring_backward(dout, q, k, v, out, lse, sink, ring, plans, receive_rows, softmax_scale, softcap,
                         deterministic):
    """(dq, dk, dv, dsink) of this rank's shards (dsink: this rank's rows' share; None without a sink)."""
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = [k.contiguous(), v.contiguous()]
    pending_dkv = None
    for step, plan in enumerate(plans):
        last = step + 1 == ring.world_size
        pending_kv = None if last else ring.start_exchange(kv, _TAG_KV, receive_rows[step])
        k_shard, v_shard = kv
        dk_shard = torch.zeros(k_shard.shape, dtype=torch.float32, device=k.device)
        dv_shard = torch.zeros(v_shard.shape, dtype=torch.float32, device=v.device)
        try:
            for call in plan:
                rows, keys = call.q_rows, call.k_rows
                dq_part, dk_part, dv_part, _ = torch.ops.flash4.bwd(  # the 4th output: dsink (the sink is apart)
                    _take(dout, rows), _take(q, rows), _take(k_shard, keys), _take(v_shard, keys), _take(out, rows),
                    _take(lse, rows, dim=1), *_call_options(call, softmax_scale, softcap, deterministic))
                _add_rows(dq, rows, dq_part)
                _add_rows(dk_shard, keys, dk_part)
                _add_rows(dv_shard, keys, dv_part)
        except BaseException:
            finish_exchanges(pending_kv, pending_dkv)
            raise
        if pending_dkv is not None:
            # The dK/dV of this shard accumulated by the ranks it visited before; ranks add in ring order.
            dk_before, dv_before = pending_dkv.wait()
            dk_shard += dk_before
            dv_shard += dv_before
        # The dK/dV go where the K/V went: the next rank, which holds this shard at the next step.
        pending_dkv = ring.start_exchange([dk_shard, dv_shard], _TAG_DKV, receive_rows[step])
        if pending_kv is not None:
            kv = pending_kv.wait()
    # The last exchange brought this rank's own shard's dK/dV, complete, from the previous rank.
    dk, dv = pending_dkv.wait()
    dsink = None
    if sink is not None:
        rowsum = (dout.float() * out.float()).sum(-1).transpose(0, 1)  # (heads, total)
        dsink = -(torch.exp(sink[:, None] - lse) * rowsum).sum(1)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink


class VarlenRingAttention(torch.autograd.Function):
    """varlen_ring_forward and varlen_ring_backward for autograd (the LSE is not differentiable)."""

    @staticmethod
    def forward(ctx, q, k, v, sink, ring, plans, receive_rows, softmax_scale, softcap, deterministic):
        q = last_dim_contiguous(q)
        out, lse = varlen_ring_forward(q, k, v, sink, ring, plans, receive_rows, softmax_scale, softcap,
                                       deterministic)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.ring = ring
        ctx.plans = plans
        ctx.receive_rows = receive_rows
        ctx.options = (softmax_scale, softcap, deterministic)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, sink = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        elif dout.stride(-1) != 1 or 0 in dout.stride():
            dout = dout.contiguous()
        dq, dk, dv, dsink = varlen_ring_backward(dout, q, k, v, out, lse, sink, ctx.ring, ctx.plans,
                                                 ctx.receive_rows, *ctx.options)
        return (dq, dk, dv, dsink) + (None,) * 6
