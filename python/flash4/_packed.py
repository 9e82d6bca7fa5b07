"""flash-attn's packed entry points: q, k, v stacked in one qkv tensor, or k, v in one kv tensor (as a fused
projection produces them). Each unstacks views (no copies) and calls flash_attn_func / flash_attn_varlen_func, so
autograd carries the gradients of the views back into the packed tensor."""

from . import _checks
from ._api import _is_torch_tensor, flash_attn_func, flash_attn_varlen_func

_QKV = "(batch, seqlen, 3, heads, head_dim)"
_KV = "(batch, seqlen_k, 2, heads_kv, head_dim)"
_QKV_VARLEN = "(total, 3, heads, head_dim)"
_KV_VARLEN = "(total_k, 2, heads_kv, head_dim)"


def unpack(x, name, layout, rank, count):
    """The `count` tensors stacked in x's dimension rank - 3, as views; TypeError unless x is an array,
    ValueError for another rank or another count."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(
            f"{name} must be an array (torch tensor, numpy array or another DLPack array) {layout}, got "
            f"{type(x).__name__}"
        )
    if len(shape) != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(shape)}")
    axis = rank - 3
    if shape[axis] != count:
        raise ValueError(f"{name}.shape[{axis}] must be {count} ({name} is {layout}), got shape {tuple(shape)}")
    if _is_torch_tensor(x):
        return x.unbind(axis)  # one autograd node whose backward stacks the views' gradients
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(count))


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    return_lse=False,
    learnable_sink=None,
):
    """flash_attn_func on qkv (batch, seqlen, 3, heads, head_dim), flash-attn's signature. Returns out (batch,
    seqlen, heads, head_dim) or, with return_lse / return_attn_probs, (out, lse); the gradient reaches qkv."""
    q, k, v = unpack(qkv, "qkv", _QKV, 5, 3)
    return flash_attn_func(q, k, v, softmax_scale, causal, window_size, softcap, deterministic, return_lse,
                           learnable_sink=learnable_sink, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                           return_attn_probs=return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    return_lse=False,
    learnable_sink=None,
):
    """flash_attn_func on q (batch, seqlen_q, heads, head_dim) and kv (batch, seqlen_k, 2, heads_kv, head_dim),
    flash-attn's signature; heads % heads_kv == 0. Returns out or (out, lse); the gradient reaches q and kv."""
    _checks.arrays(allow_meta=True, q=q, kv=kv)
    k, v = unpack(kv, "kv", _KV, 5, 2)
    return flash_attn_func(q, k, v, softmax_scale, causal, window_size, softcap, deterministic, return_lse,
                           learnable_sink=learnable_sink, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                           return_attn_probs=return_attn_probs)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    return_lse=False,
    learnable_sink=None,
):
    """flash_attn_varlen_func on a packed batch qkv (total, 3, heads, head_dim) whose queries and keys share
    cu_seqlens (int32 (batch + 1,)) and max_seqlen, flash-attn's signature. Returns out (total, heads, head_dim)
    or (out, lse) with lse (heads, total); the gradient reaches qkv."""
    q, k, v = unpack(qkv, "qkv", _QKV_VARLEN, 4, 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale, causal,
                                  window_size, softcap, deterministic, return_lse, learnable_sink=learnable_sink,
                                  dropout_p=dropout_p, alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    return_lse=False,
    seqused_q=None,
    seqused_k=None,
    learnable_sink=None,
):
    """flash_attn_varlen_func on q (total_q, heads, head_dim) and kv (total_k, 2, heads_kv, head_dim),
    flash-attn's signature. Returns out or (out, lse); the gradient reaches q and kv."""
    _checks.arrays(allow_meta=True, q=q, kv=kv)
    k, v = unpack(kv, "kv", _KV_VARLEN, 4, 2)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                  causal, window_size, softcap, deterministic, return_lse, seqused_q, seqused_k,
                                  learnable_sink, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                                  return_attn_probs=return_attn_probs)
