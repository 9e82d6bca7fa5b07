"""flash_attn_varlen_func with block_table (flash-attn 2's paged keys and values, as serving engines call it for
decode steps and chunked prefill): sequence b's keys are in the pages of block_table's row b, as many as its
cu_seqlens_k segment (or seqused_k[b]). One flash_attn_with_kvcache call, never reading CUDA offsets on the host:
* CPU offsets that step by max_seqlen_q (every segment that long): the (batch, max_seqlen_q) view of q;
* otherwise the packed q with cu_seqlens_q: the GPU reads each sequence's queries from the offsets on the device,
  right whatever they hold (decode and verify steps on the decode kernel, longer segments on the dense kernel in
  a second launch); no host synchronisation, so a step can be captured in a CUDA graph.
Forward only, as a paged cache is in flash-attn."""

import types

from ._offsets import check_varlen_offsets, offsets_check_requested


def paged_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                           block_table, softmax_scale, causal, window_size, softcap, learnable_sink, want_lse,
                           descales):
    import torch

    from ._kvcache import flash_attn_with_kvcache

    named = dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                 block_table=block_table)
    for name, t in named.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"flash_attn_varlen_func with block_table takes torch tensors; {name} is "
                            f"{type(t).__module__}.{type(t).__qualname__}")
    if any(d is not None for d in descales):
        raise NotImplementedError("flash4 has no FP8 paged attention; q_descale, k_descale and v_descale must be "
                                  "None with block_table")
    if seqused_q is not None:
        raise NotImplementedError("flash_attn_varlen_func with block_table takes no seqused_q: every sequence "
                                  "attends with all its max_seqlen_q queries")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, learnable_sink)):
        raise NotImplementedError("flash_attn_varlen_func with block_table is forward only (no gradient through "
                                  "a paged cache); call it under torch.no_grad() or on tensors without grad")
    if cu_seqlens_q is None:
        raise ValueError("cu_seqlens_q is required: it gives the batch (cu_seqlens_q.shape[0] - 1)")
    if cu_seqlens_k is None and seqused_k is None:
        raise ValueError("with block_table, cu_seqlens_k or seqused_k gives each sequence's number of keys; both "
                         "are None")
    if q.dim() != 3:
        raise ValueError(f"q must have 3 dimensions (total_q, heads, head_dim), got shape {tuple(q.shape)}")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"cu_seqlens_q must be (batch + 1,), got shape {tuple(cu_seqlens_q.shape)}")
    batch, total_q = cu_seqlens_q.shape[0] - 1, q.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be (batch, max_pages) = ({batch}, max_pages) (batch from cu_seqlens_q), "
                         f"got shape {tuple(block_table.shape)}")
    # Only host-resident offsets are compared (no synchronisation): a batch of batch * max_seqlen_q rows may still
    # hold shorter segments and rows in none, which the packed call places by the offsets themselves.
    uniform = total_q == batch * max_seqlen_q and cu_seqlens_q.device.type == "cpu"
    if uniform:
        steps = torch.arange(batch + 1, dtype=torch.int64) * max_seqlen_q
        uniform = torch.equal(cu_seqlens_q.to(torch.int64), steps)
    if offsets_check_requested():
        _check_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, block_table)
    if seqused_k is not None:
        lengths = seqused_k
    else:
        if cu_seqlens_k.dim() != 1 or cu_seqlens_k.shape[0] != batch + 1:
            raise ValueError(f"cu_seqlens_k must be (batch + 1,) = ({batch + 1},), got shape "
                             f"{tuple(cu_seqlens_k.shape)}")
        lengths = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    lengths_from = "seqused_k" if seqused_k is not None else "cu_seqlens_k's segment lengths"
    # The LSE only when asked for (the kernels then write none).
    options = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                   return_softmax_lse=want_lse, learnable_sink=learnable_sink)
    try:
        if uniform:  # every sequence max_seqlen_q queries: q is a (batch, max_seqlen_q) view
            res = flash_attn_with_kvcache(q.unflatten(0, (batch, max_seqlen_q)), k, v, cache_seqlens=lengths,
                                          block_table=block_table, **options)
            out, lse = res if want_lse else (res, None)
            out = out.flatten(0, 1)
            if lse is not None:
                lse = lse.transpose(0, 1).reshape(lse.shape[1], total_q)  # (heads, total_q), as a packed call's
        else:  # host offsets are checked by the library, device ones clamped
            if cu_seqlens_q.device != q.device:  # host offsets of device queries: checked here, then copied over
                check_varlen_offsets(q, q, cu_seqlens_q, cu_seqlens_q, max_seqlen_q, max_seqlen_q)
                cu_seqlens_q = cu_seqlens_q.to(q.device)
            res = flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths, block_table=block_table,
                                          cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, **options)
            out, lse = res if want_lse else (res, None)
    except (ValueError, TypeError) as e:  # the KV-cache call's names, told in this call's terms
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(f"{e} (flash_attn_varlen_func with block_table runs flash_attn_with_kvcache with k_cache = "
                      f"k, v_cache = v and cache_seqlens = {lengths_from})") from None
    return (out, lse) if want_lse else out


def _check_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, block_table):
    """FLASH4_CHECK_OFFSETS=1: the offsets on the host (synchronizes). cu_seqlens_q, cu_seqlens_k and seqused_k
    are checked as a packed batch's; every sequence must fit in its row of pages (the page numbers themselves are
    clamped by the kernels and checked by flash_attn_with_kvcache's own check)."""
    import torch

    if cu_seqlens_k is not None:
        cu_k = cu_seqlens_k.detach().to("cpu", torch.int64)
        keys = types.SimpleNamespace(shape=(int(cu_k[-1]) if cu_k.numel() else 0, int(k.shape[2])))
        check_varlen_offsets(q, keys, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, seqused_k)
    else:  # the queries' offsets alone: their keys' side is given the queries' own, which pass when they do
        check_varlen_offsets(q, q, cu_seqlens_q, cu_seqlens_q, max_seqlen_q, max_seqlen_q)
    # The keys each sequence attends to: seqused_k where given (then required), else its cu_seqlens_k segment.
    lengths = seqused_k.detach().to("cpu", torch.int64) if seqused_k is not None else cu_k[1:] - cu_k[:-1]
    capacity = int(block_table.shape[1]) * int(k.shape[1])
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > capacity):
        raise ValueError(f"every sequence's number of keys must be in [0, {capacity}] (max_pages * page_size of "
                         f"block_table's rows), got {lengths.tolist()[:8]}")
