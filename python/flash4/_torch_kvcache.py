"""The torch custom op flash4::fwd_kvcache behind flash4.flash_attn_with_kvcache: it mutates k_cache and v_cache
(the append) and returns out and lse; its fake implementation lets torch.compile trace it without a graph
break. Imported the first time flash_attn_with_kvcache sees torch tensors."""

from typing import Optional

import torch
from torch.utils.dlpack import to_dlpack

from ._native import _C
from ._torch_ops import _gpu_layout, _last_dim_contiguous, _stream, through_custom_op
from ._torch_ops import _sink_tensor as sink_tensor, int32_indices  # noqa: F401  (flash_attn_with_kvcache's)

Tensor = torch.Tensor


def _dl(t):
    return None if t is None else to_dlpack(t)


def run_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen, cache_batch_idx,
                block_table, cache_leftpad, learnable_sink, softmax_scale, causal, window_left, window_right,
                softcap, rotary_interleaved, num_splits, cu_seqlens_q=None, max_seqlen_q=0, want_lse=True):
    """The call itself: out, lse (None when not want_lse: the kernels then write none). Eager callers use it
    directly (the custom op's dispatch costs host time on every decode step) and bump the caches' versions when
    they append, as the op's mutates_args would."""
    # Inputs need a unit stride in the last dimension, and on the GPU 16-byte aligned rows (copied where they
    # lack them, _gpu_layout); the caches are written in place, so they are not copied (the library refuses them
    # if their layout does not fit).
    q = _gpu_layout(q)
    if k is not None:
        k = _gpu_layout(k)
    if v is not None:
        v = _gpu_layout(v)
    if rotary_cos is not None:
        rotary_cos = _last_dim_contiguous(rotary_cos)
    if rotary_sin is not None:
        rotary_sin = _last_dim_contiguous(rotary_sin)
    cache_seqlens, cache_batch_idx, block_table, cache_leftpad, learnable_sink, cu_seqlens_q = [
        None if t is None else t.contiguous()
        for t in (cache_seqlens, cache_batch_idx, block_table, cache_leftpad, learnable_sink, cu_seqlens_q)]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32) if want_lse else None
    _C.forward_kvcache(to_dlpack(q), to_dlpack(k_cache), to_dlpack(v_cache), _dl(k), _dl(v), _dl(rotary_cos),
                       _dl(rotary_sin), _dl(cache_seqlens), cache_seqlen, _dl(cache_batch_idx), _dl(block_table),
                       _dl(cache_leftpad), to_dlpack(out), _dl(lse), _dl(learnable_sink), softmax_scale, causal,
                       window_left, window_right, softcap, rotary_interleaved, num_splits, _stream(q),
                       _dl(cu_seqlens_q), max_seqlen_q)
    return out, lse


def _lse_shape(q, cu_seqlens_q):
    """(batch, heads, seqlen_q), or (heads, total_q) for packed queries."""
    return (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[2], q.shape[1])


@torch.library.custom_op("flash4::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    cache_seqlen: int,
    cache_batch_idx: Optional[Tensor],
    block_table: Optional[Tensor],
    cache_leftpad: Optional[Tensor],
    learnable_sink: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
) -> tuple[Tensor, Tensor]:
    return run_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
                       cache_batch_idx, block_table, cache_leftpad, learnable_sink, softmax_scale, causal, window_left,
                       window_right, softcap, rotary_interleaved, num_splits, cu_seqlens_q, max_seqlen_q)


# The tensor arguments of flash4::fwd_kvcache, first in its order; four after a gap (cache_seqlen); cu_seqlens_q
# after the scalars.
_TENSOR_ARGUMENTS = ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", None,
                     "cache_batch_idx", "block_table", "cache_leftpad", "learnable_sink")
_CU_SEQLENS_Q = 20  # its position


def call(*args, want_lse=True):
    """flash4::fwd_kvcache where through_custom_op says (torch.compile, fake and meta tensors, dispatch modes)
    and for inputs that require grad (the op's autograd then says it has no backward); the plain call otherwise,
    with the version bump of the caches an append makes, and lse None when not want_lse."""
    q, k_cache, v_cache, k = args[0], args[1], args[2], args[3]
    if (through_custom_op(**dict(zip(_TENSOR_ARGUMENTS[:8], args[:8])), **dict(zip(_TENSOR_ARGUMENTS[9:], args[9:13])),
                          cu_seqlens_q=args[_CU_SEQLENS_Q] if len(args) > _CU_SEQLENS_Q else None)
            or (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args[:5]))):
        return fwd_kvcache(*args)
    out_lse = run_kvcache(*args, want_lse=want_lse)
    if k is not None:
        torch.autograd.graph.increment_version((k_cache, v_cache))
    return out_lse


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
                      cache_batch_idx, block_table, cache_leftpad, learnable_sink, softmax_scale, causal, window_left,
                      window_right, softcap, rotary_interleaved, num_splits, cu_seqlens_q=None, max_seqlen_q=0):
    out = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    return out, lse
