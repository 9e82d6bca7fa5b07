"""ring_flash_attn_varlen_func: the packed (variable-length) form of ring attention, its argument checks and the
one-rank shortcut."""

import hashlib
import struct

import torch

from .. import _api as _flash4_api
from ._layout import check_layout
from ._ring_comm import call_signature, check_same_call, make_ring, pair_error
from ._varlen_layout import VarlenLayout, read_cu_seqlens
from ._varlen_ring import VarlenRingAttention, varlen_ring_plans

_NAME = "flash4.distributed.ring_flash_attn_varlen_func"


def ring_flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens,
    max_seqlen,
    group=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    deterministic=False,
    return_lse=False,
    learnable_sink=None,
    *,
    layout="zigzag",
    timeout=None,
):
    """Attention over a packed batch of documents (one token stream, as flash4.flash_attn_varlen_func takes it)
    sharded across the ranks of `group`, each document cut per rank (context parallelism, ring attention).

    cu_seqlens: the running offsets (batch + 1,) of the documents in the **unsharded** packed stream, the same
    on every rank (an integer tensor on any device, or a list of ints; a CUDA tensor is copied to the host
    once per call). max_seqlen: the longest document's length (None: computed). q (local_total, heads,
    head_dim), k and v (local_total, heads_kv, head_dim): this rank's shard of the packed stream, cut with
    flash4.distributed.shard_varlen(x, cu_seqlens, group, layout) (rank r holds chunks r and 2W-1-r of every
    document under "zigzag", chunk r of W under "contiguous"); local_total differs from rank to rank by up to
    two tokens. flash4.distributed.varlen_positions gives each token's position in its document (rotary).
    Self-attention within each document; masks (causal, window_size) count positions inside the document, as
    flash_attn_varlen_func with cu_seqlens_q = cu_seqlens_k = cu_seqlens.

    softmax_scale, causal, window_size, softcap, deterministic, learnable_sink: as flash_attn_varlen_func. The
    sink's gradient is this rank's rows' share (the ranks' shares add up to the unsharded gradient).
    Returns this rank's rows of the output (like q) and, with return_lse, the LSE (heads, local_total) float32.
    Differentiable in q, k, v and the sink. timeout: as ring_flash_attn_func.
    """
    ring = make_ring(group, timeout, _NAME)
    check_layout(layout)
    scale, left, right, cap = _flash4_api.normalize_options(softmax_scale, window_size, softcap)
    cu, local_error = None, None
    try:
        cu = read_cu_seqlens(cu_seqlens)
        layout_ = VarlenLayout(cu, ring.world_size, layout)
        local_error = _local_error(q, k, v, layout_, max_seqlen, learnable_sink, ring.rank)
    except (TypeError, ValueError) as error:
        local_error = str(error)
    tensors = (q, k, v) + ((learnable_sink,) if learnable_sink is not None else ())
    options = {
        "layout": layout, "softmax_scale": scale, "causal": bool(causal), "window_left": left,
        "window_right": right, "softcap": cap, "deterministic": bool(deterministic),
        "cu_seqlens (documents)": len(cu) - 1 if cu is not None else -1,
        "cu_seqlens (total tokens)": cu[-1] if cu is not None else -1,
        "cu_seqlens (digest)": _digest(cu),
        "learnable_sink given": learnable_sink is not None,
        "requires_grad": torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in tensors),
    }
    if ring.world_size > 1:
        device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
        # The token count of a shard differs between ranks; the other dimensions must agree.
        check_same_call(ring, call_signature(q, k, v, options, shape_dims=(1, 2, 3)), device, _NAME, local_error)
    elif local_error is not None:
        raise ValueError(f"{_NAME}: {local_error}")
    max_seqlen = _longest(cu) if max_seqlen is None else int(max_seqlen)
    if ring.world_size == 1:
        # The shard is the whole packed stream, in order for both layouts: the plain call.
        if not isinstance(cu_seqlens, torch.Tensor):
            cu_seqlens = torch.tensor(cu, dtype=torch.int32, device=q.device)
        return _flash4_api.flash_attn_varlen_func(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale=scale, causal=causal,
            window_size=(left, right), softcap=cap, deterministic=deterministic, return_lse=return_lse,
            learnable_sink=learnable_sink)
    plans = varlen_ring_plans(ring, layout_, bool(causal), left, right, q.device)
    # The shard that arrives for step t + 1 is that of rank (rank - t - 1) mod W.
    receive_rows = [layout_.rows[(ring.rank - step - 1) % ring.world_size] for step in range(ring.world_size)]
    sink = None
    if learnable_sink is not None:  # float32 (the cast is differentiable, so any parameter dtype gets its grad)
        sink = learnable_sink.to(torch.float32) if learnable_sink.dtype != torch.float32 else learnable_sink
    out, lse = VarlenRingAttention.apply(q, k, v, sink, ring, plans, receive_rows, scale, cap, bool(deterministic))
    return (out, lse) if return_lse else out


def _digest(cu):
    """63 bits of a hash of cu_seqlens: the ranks compare it instead of every offset."""
    if cu is None:
        return -1
    data = struct.pack(f"<{len(cu)}q", *cu)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def _longest(cu):
    return max((cu[b + 1] - cu[b] for b in range(len(cu) - 1)), default=0)


def _local_error(q, k, v, layout_, max_seqlen, sink, rank):
    """The message of the first check of this rank's own arguments that fails, or None."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {type(t).__name__}"
        if t.dim() != 3:
            return f"{name} must have 3 dimensions (local_total, heads, head_dim), got shape {tuple(t.shape)}"
    want = layout_.rows[rank]
    if q.shape[0] != want:
        return (f"q.shape[0] = {q.shape[0]} but this rank's share of cu_seqlens (layout {layout_.layout!r}, "
                f"{layout_.world_size} ranks) is {want} tokens; cut the packed batch with "
                "flash4.distributed.shard_varlen")
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != q.shape[0]:
            return (f"{name}.shape[0] = {t.shape[0]} but q.shape[0] = {q.shape[0]}; ring attention is "
                    "self-attention, so q, k and v shards hold the same tokens")
    error = pair_error(q, k, v) if layout_.world_size > 1 else None  # one rank: the plain call's own errors
    if error is not None:
        return error
    if max_seqlen is not None and int(max_seqlen) < _longest(layout_.cu):
        return f"max_seqlen = {int(max_seqlen)} but cu_seqlens has a document of {_longest(layout_.cu)} tokens"
    if sink is not None and (not isinstance(sink, torch.Tensor) or tuple(sink.shape) != (q.shape[1],)):
        shape = tuple(sink.shape) if isinstance(sink, torch.Tensor) else type(sink).__name__
        return f"learnable_sink must be a tensor of shape (heads,) = ({q.shape[1]},), got {shape}"
    if sink is not None and not sink.is_floating_point() and layout_.world_size > 1:
        return f"learnable_sink has dtype {sink.dtype} but must be a floating point tensor (heads,)"
    return None
