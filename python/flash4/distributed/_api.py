"""ring_flash_attn_func: the public entry point, its argument checks and the one-rank shortcut."""

import torch

from .. import _api as _flash4_api
from ._layout import check_layout, chunks_per_rank
from ._ring_attention import RingAttention
from ._ring_comm import call_signature, check_same_call, make_ring, pair_error

_NAME = "flash4.distributed.ring_flash_attn_func"


def ring_flash_attn_func(
    q,
    k,
    v,
    group=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    deterministic=False,
    return_lse=False,
    *,
    layout="zigzag",
    timeout=None,
):
    """Attention over a sequence sharded across the ranks of `group` (context parallelism, ring attention).

    Each rank passes its shard: q (batch, local_seqlen, heads, head_dim), k and v (batch, local_seqlen,
    heads_kv, head_dim), the same shapes, dtype and options on every rank; the attention is that of the
    unsharded sequence of world_size * local_seqlen tokens (self-attention: queries and keys are the same
    positions). Returns this rank's rows of the output (like q) and, with return_lse, of the LSE (batch, heads,
    local_seqlen) float32. Differentiable in q, k and v.

    group: a torch.distributed process group (None = the default group); NCCL for CUDA tensors, gloo for CPU.
    layout: how the sequence is sharded, "zigzag" (the default: rank r holds chunks r and 2W-1-r of 2W, equal
    work per rank under a causal mask) or "contiguous" (rank r holds the r-th slice); every rank's shard must
    be cut that way: flash4.distributed.shard_sequence(x, group, layout) does it, and
    flash4.distributed.sequence_positions gives the global positions (for rotary embeddings).
    softmax_scale, causal, window_size, softcap, deterministic: as flash4.flash_attn_func, for the global
    sequence (causal and windows count global positions).
    timeout: seconds (or a datetime.timedelta) each wait on the ring may take before it raises; None = the
    group's timeout (init_process_group(timeout=...)). Before any work every rank checks, with one all_gather,
    that all ranks made the same call, and raises the same ValueError on every rank when they did not.
    """
    ring = make_ring(group, timeout, _NAME)
    check_layout(layout)
    scale, left, right, cap = _flash4_api.normalize_options(softmax_scale, window_size, softcap)
    options = {"layout": layout, "softmax_scale": scale, "causal": bool(causal), "window_left": left,
               "window_right": right, "softcap": cap, "deterministic": bool(deterministic),
               "requires_grad": torch.is_grad_enabled() and any(
                   isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))}
    if ring.world_size > 1:
        device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
        check_same_call(ring, call_signature(q, k, v, options), device, _NAME)
    _check_shards(q, k, v, ring.world_size, layout)
    if ring.world_size == 1:
        # The shard is the whole sequence, in order for both layouts: the plain call.
        return _flash4_api.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=(left, right),
                                           softcap=cap, deterministic=deterministic, return_lse=return_lse)
    out, lse = RingAttention.apply(q, k, v, ring, layout, scale, bool(causal), left, right, cap, bool(deterministic))
    return (out, lse) if return_lse else out


def _check_shards(q, k, v, world_size, layout):
    """The checks that depend on one rank's arguments only (the same on every rank after check_same_call)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_NAME}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{_NAME}: {name} must have 4 dimensions (batch, local_seqlen, heads, head_dim), "
                             f"got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.shape[1] != q.shape[1]:
            raise ValueError(
                f"{_NAME}: {name}.shape[1] = {t.shape[1]} but q.shape[1] = {q.shape[1]}; ring attention is "
                "self-attention over one sharded sequence, so every rank's q, k and v shards have the same length"
            )
    error = pair_error(q, k, v) if world_size > 1 else None  # one rank: the plain call's own errors
    if error is not None:
        raise ValueError(f"{_NAME}: {error}")
    parts = chunks_per_rank(layout)
    if q.shape[1] % parts != 0:
        raise ValueError(
            f"{_NAME}: layout {layout!r} needs a local sequence length divisible by {parts}, got q.shape[1] = "
            f"{q.shape[1]} (the global sequence length must be a multiple of {parts * world_size}; pad it)"
        )
