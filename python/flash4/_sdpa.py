"""flash4.scaled_dot_product_attention: a stand-in for torch's SDPA on flash4's kernels (SDPA's layout and
top-left causal mask, expressed as flash_attn_func's bottom-right window)."""

from ._api import _is_torch_tensor, flash_attn_func


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """A stand-in for torch.nn.functional.scaled_dot_product_attention on torch tensors in SDPA's layout
    (batch, heads, seqlen, head_dim). No attn_mask, no dropout. is_causal is SDPA's top-left aligned mask, which
    flash4 expresses as a window; seqlen_q < seqlen_k with is_causal is not supported. GQA (fewer key/value
    heads) is always allowed, as with enable_gqa=True."""
    if attn_mask is not None:
        raise NotImplementedError("flash4.scaled_dot_product_attention takes no attn_mask; use is_causal or "
                                  "flash_attn_func's window_size")
    if dropout_p != 0.0:
        raise NotImplementedError("flash4 has no attention dropout; dropout_p must be 0")
    for name, t in (("query", query), ("key", key), ("value", value)):  # named in SDPA's layout, before the views
        if not _is_torch_tensor(t):
            raise TypeError(f"{name} must be a torch.Tensor (batch, heads, seqlen, head_dim), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, heads, seqlen, head_dim), got shape "
                             f"{tuple(t.shape)}")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # views in flash4's (batch, seqlen, heads, dim)
    window = (-1, -1)
    causal = False
    if is_causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        if seqlen_q == seqlen_k:
            causal = True
        elif seqlen_q > seqlen_k:
            window = (-1, seqlen_q - seqlen_k)  # top-left: key j visible to query i iff j <= i
        else:
            raise NotImplementedError(
                "is_causal with seqlen_q < seqlen_k (top-left aligned) is not expressible in flash4's "
                "bottom-right aligned masks; use flash_attn_func(causal=True) for bottom-right alignment"
            )
    if scale is not None and scale == 0:
        # SDPA's scale = 0 gives every visible key the same weight; flash4's softmax_scale 0 means the default,
        # so the scores are zeroed through q instead (their gradient, dq, is then 0 as SDPA's).
        q, scale = q * 0, 1.0
    out = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window)
    return out.transpose(1, 2)
