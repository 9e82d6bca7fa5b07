"""Ring attention: each rank holds a shard of the sequence's queries, keys and values; the K/V shards travel
around the ring of ranks, and each rank attends its queries to every K/V shard as it passes, merging the partial
results by their log-sum-exp. The backward sends K/V around the ring again, with the dK/dV accumulated for each
shard travelling alongside it back to its owner.

Every block is a call to flash4's own forward (flash4::fwd, with its LSE) and backward (flash4::bwd). Given the
merged output and LSE of the whole row, a block's backward gives exactly that block's share of dQ, dK and dV
(its probabilities are exp(s - lse) with the global lse, and D = rowsum(dO * O) uses the global output), so the
shares add up to the gradients of the unsharded attention.
"""

import torch

from .. import _torch_ops  # noqa: F401  (registers torch.ops.flash4.fwd and .bwd)
from .._lse_merge import empty_attention_accumulator, merge_attention_partials
from ._block_plan import global_band, plan_shard_pair
from ._layout import segments

_TAG_KV, _TAG_DKV = 0, 1  # message streams of the ring (see Ring.start_exchange)


def last_dim_contiguous(t):
    """t as the library's ops take it: a unit stride in the last dimension (flash4.flash_attn_func makes the same
    copy; a tensor that has one is used as it is)."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def finish_exchanges(*pending):
    """Waits for the exchanges this rank has started, before an error of its own computation propagates: every
    rank started the same exchanges, so completing them leaves no message of this call in flight on the group
    (one left there can stall the group's next operation)."""
    for exchange in pending:
        if exchange is not None:
            exchange.wait()


def _usable_gradient(dout, out):
    if dout is None:
        return torch.zeros_like(out)
    if dout.stride(-1) != 1 or 0 in dout.stride():
        return dout.contiguous()
    return dout


def ring_forward(q, k, v, ring, plans, softmax_scale, softcap, deterministic):
    """(out, lse) of this rank's queries against every K/V shard of the ring; out like q with v's head dim, lse
    float32."""
    batch, local_seqlen, heads, _ = q.shape
    out_acc, lse_acc = empty_attention_accumulator(batch, local_seqlen, heads, v.shape[-1], q.device)
    kv = [k.contiguous(), v.contiguous()]
    for step, plan in enumerate(plans):
        # The next shard arrives while this one is computed on.
        pending = ring.start_exchange(kv, _TAG_KV) if step + 1 < ring.world_size else None
        k_shard, v_shard = kv
        try:
            for call in plan:
                rows = slice(call.q_lo, call.q_hi)
                keys = slice(call.k_lo, call.k_hi)
                out_part, lse_part = torch.ops.flash4.fwd(
                    q[:, rows], k_shard[:, keys], v_shard[:, keys], softmax_scale, False, call.window_left,
                    call.window_right, softcap, deterministic)
                merge_attention_partials(out_acc[:, rows], lse_acc[:, :, rows], out_part, lse_part)
        except BaseException:
            finish_exchanges(pending)
            raise
        if pending is not None:
            kv = pending.wait()
    return out_acc.to(q.dtype), lse_acc


def ring_backward(dout, q, k, v, out, lse, ring, plans, softmax_scale, softcap, deterministic):
    """(dq, dk, dv) of this rank's shards: dq from every K/V shard's blocks, dk and dv of this rank's own shard
    accumulated by every rank as the shard travels around the ring once more."""
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = [k.contiguous(), v.contiguous()]
    pending_dkv = None
    for step, plan in enumerate(plans):
        pending_kv = ring.start_exchange(kv, _TAG_KV) if step + 1 < ring.world_size else None
        k_shard, v_shard = kv
        dk_shard = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv_shard = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        try:
            for call in plan:
                rows = slice(call.q_lo, call.q_hi)
                keys = slice(call.k_lo, call.k_hi)
                # The LSE rows are copied (a few bytes per row): a view starting mid-row is not 16-byte aligned.
                dq_part, dk_part, dv_part, _ = torch.ops.flash4.bwd(  # the 4th output: dsink (no sink here)
                    dout[:, rows], q[:, rows], k_shard[:, keys], v_shard[:, keys], out[:, rows],
                    lse[:, :, rows].contiguous(), softmax_scale, False, call.window_left, call.window_right,
                    softcap, deterministic)
                dq[:, rows] += dq_part
                dk_shard[:, keys] += dk_part
                dv_shard[:, keys] += dv_part
        except BaseException:
            finish_exchanges(pending_kv, pending_dkv)
            raise
        if pending_dkv is not None:
            # The dK/dV of this shard accumulated by the ranks it visited before; ranks add in ring order.
            dk_before, dv_before = pending_dkv.wait()
            dk_shard += dk_before
            dv_shard += dv_before
        pending_dkv = ring.start_exchange([dk_shard, dv_shard], _TAG_DKV)
        if pending_kv is not None:
            kv = pending_kv.wait()
    # The last exchange brought this rank's own shard's dK/dV, complete, from the previous rank.
    dk, dv = pending_dkv.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def shard_plans(ring, layout, local_seqlen, causal, window_left, window_right):
    """For each ring step, the calls of this rank's queries against the K/V shard it holds at that step (the
    shard of rank (rank - step) mod world_size)."""
    band = global_band(causal, window_left, window_right)
    q_segments = segments(layout, ring.rank, ring.world_size, local_seqlen)
    plans = []
    for step in range(ring.world_size):
        source = (ring.rank - step) % ring.world_size
        plans.append(plan_shard_pair(q_segments, segments(layout, source, ring.world_size, local_seqlen), band))
    return plans


class RingAttention(torch.autograd.Function):
    """ring_forward and ring_backward for autograd (the LSE is returned, not differentiable)."""

    @staticmethod
    def forward(ctx, q, k, v, ring, layout, softmax_scale, causal, window_left, window_right, softcap,
                deterministic):
        plans = shard_plans(ring, layout, q.shape[1], causal, window_left, window_right)
        q = last_dim_contiguous(q)
        out, lse = ring_forward(q, k, v, ring, plans, softmax_scale, softcap, deterministic)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        ctx.plans = plans
        ctx.options = (softmax_scale, softcap, deterministic)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(_usable_gradient(dout, out), q, k, v, out, lse, ctx.ring, ctx.plans,
                                   *ctx.options)
        return (dq, dk, dv) + (None,) * 8
