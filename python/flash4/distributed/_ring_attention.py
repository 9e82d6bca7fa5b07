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
from ._ring_comm import start_exchange

_TAG_KV, _TAG_DKV = 0, 1  # message streams of the ring (see start_exchange)


def _usable_gradient(dout, out):
    if dout is None:
        return torch.zeros_like(out)
    if dout.stride(-1) != 1 or 0 in dout.stride():
        return dout.contiguous()
    return dout


def _shard_plans(ring, layout, local_seqlen, band):
    """For each ring step, the calls of this rank's queries against the K/V shard it holds at that step (the
    shard of rank (rank - step) mod world_size)."""
    q_segments = segments(layout, ring.rank, ring.world_size, local_seqlen)
    plans = []
    for step in range(ring.world_size):
        source = (ring.rank - step) % ring.world_size
        plans.append(plan_shard_pair(q_segments, segments(layout, source, ring.world_size, local_seqlen), band))
    return plans


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, layout, softmax_scale, causal, window_left, window_right, softcap,
                deterministic):
        batch, local_seqlen, heads, head_dim = q.shape
        band = global_band(causal, window_left, window_right)
        plans = _shard_plans(ring, layout, local_seqlen, band)
        out_acc, lse_acc = empty_attention_accumulator(batch, local_seqlen, heads, head_dim, q.device)
        kv = [k.contiguous(), v.contiguous()]
        for step, plan in enumerate(plans):
            # The next shard arrives while this one is computed on.
            pending = start_exchange(ring, kv, _TAG_KV) if step + 1 < ring.world_size else None
            k_shard, v_shard = kv
            for call in plan:
                rows = slice(call.q_lo, call.q_hi)
                keys = slice(call.k_lo, call.k_hi)
                out_part, lse_part = torch.ops.flash4.fwd(
                    q[:, rows], k_shard[:, keys], v_shard[:, keys], softmax_scale, False, call.window_left,
                    call.window_right, softcap, deterministic)
                merge_attention_partials(out_acc[:, rows], lse_acc[:, :, rows], out_part, lse_part)
            if pending is not None:
                kv = pending.wait()
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc)
        ctx.ring = ring
        ctx.plans = plans
        ctx.options = (softmax_scale, softcap, deterministic)
        ctx.mark_non_differentiable(lse_acc)
        return out, lse_acc

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ring, plans = ctx.ring, ctx.plans
        softmax_scale, softcap, deterministic = ctx.options
        dout = _usable_gradient(dout, out)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = [k.contiguous(), v.contiguous()]
        pending_dkv = None
        for step, plan in enumerate(plans):
            pending_kv = start_exchange(ring, kv, _TAG_KV) if step + 1 < ring.world_size else None
            k_shard, v_shard = kv
            dk_shard = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
            dv_shard = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
            for call in plan:
                rows = slice(call.q_lo, call.q_hi)
                keys = slice(call.k_lo, call.k_hi)
                dq_part, dk_part, dv_part = torch.ops.flash4.bwd(
                    dout[:, rows], q[:, rows], k_shard[:, keys], v_shard[:, keys], out[:, rows], lse[:, :, rows],
                    softmax_scale, False, call.window_left, call.window_right, softcap, deterministic)
                dq[:, rows] += dq_part
                dk_shard[:, keys] += dk_part
                dv_shard[:, keys] += dv_part
            if pending_dkv is not None:
                # The dK/dV of this shard accumulated by the ranks it visited before; ranks add in ring order.
                dk_before, dv_before = pending_dkv.wait()
                dk_shard += dk_before
                dv_shard += dv_before
            pending_dkv = start_exchange(ring, [dk_shard, dv_shard], _TAG_DKV)
            if pending_kv is not None:
                kv = pending_kv.wait()
        # The last exchange brought this rank's own shard's dK/dV, complete, from the previous rank.
        dk, dv = pending_dkv.wait()
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)) + (None,) * 8
