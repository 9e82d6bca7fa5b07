"""flash_attn_varlen_func with block_table (flash-attn 2's paged keys and values, as serving engines call it for
decode steps): a packed batch whose segments all hold max_seqlen_q queries is flash_attn_with_kvcache's problem
on the (batch, max_seqlen_q) view of q, with the keys of sequence b in the pages of block_table's row b and
their count from cu_seqlens_k (or seqused_k). Forward only, as a paged cache is in flash-attn."""

import types

from ._offsets import check_varlen_offsets, offsets_check_requested


def paged_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                           block_table, softmax_scale, causal, window_size, softcap, learnable_sink, want_lse,
                           descales):
    import torch

    from ._kvcache import flash_attn_with_kvcache

    if not isinstance(q, torch.Tensor):
        raise TypeError("flash_attn_varlen_func with block_table takes torch tensors")
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
    if total_q != batch * max_seqlen_q:
        raise NotImplementedError(
            f"flash_attn_varlen_func with block_table runs batches whose sequences all have max_seqlen_q queries "
            f"(decode and speculative-decode steps: total_q = batch * max_seqlen_q); got total_q = {total_q}, "
            f"batch = {batch}, max_seqlen_q = {max_seqlen_q}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be (batch, max_pages) = ({batch}, max_pages) (batch from cu_seqlens_q), "
                         f"got shape {tuple(block_table.shape)}")
    if offsets_check_requested():
        _check_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, block_table)
    if seqused_k is not None:
        lengths = seqused_k
    else:
        if cu_seqlens_k.dim() != 1 or cu_seqlens_k.shape[0] != batch + 1:
            raise ValueError(f"cu_seqlens_k must be (batch + 1,) = ({batch + 1},), got shape "
                             f"{tuple(cu_seqlens_k.shape)}")
        lengths = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    out, lse = flash_attn_with_kvcache(
        q.unflatten(0, (batch, max_seqlen_q)), k, v, cache_seqlens=lengths, block_table=block_table,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
        return_softmax_lse=True, learnable_sink=learnable_sink)
    out = out.flatten(0, 1)
    if not want_lse:
        return out
    return out, lse.transpose(0, 1).reshape(lse.shape[1], total_q)  # (heads, total_q), as a packed call's


def _check_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, block_table):
    """FLASH4_CHECK_OFFSETS=1: the offsets on the host (synchronizes). cu_seqlens_q must step by max_seqlen_q;
    cu_seqlens_k and seqused_k are checked as a packed batch's; every sequence must fit in its row of pages (the
    page numbers themselves are clamped by the kernels and checked by flash_attn_with_kvcache's own check)."""
    import torch

    cu_q = cu_seqlens_q.detach().to("cpu", torch.int64)
    if not torch.equal(cu_q, torch.arange(cu_q.shape[0], dtype=torch.int64) * max_seqlen_q):
        raise ValueError(f"cu_seqlens_q must be 0, {max_seqlen_q}, 2 * {max_seqlen_q}, ... with block_table (every "
                         f"sequence max_seqlen_q queries), got {cu_q.tolist()[:8]}")
    if cu_seqlens_k is not None:
        cu_k = cu_seqlens_k.detach().to("cpu", torch.int64)
        keys = types.SimpleNamespace(shape=(int(cu_k[-1]) if cu_k.numel() else 0, int(k.shape[2])))
        check_varlen_offsets(q, keys, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, seqused_k)
    # The keys each sequence attends to: seqused_k where given (then required), else its cu_seqlens_k segment.
    lengths = seqused_k.detach().to("cpu", torch.int64) if seqused_k is not None else cu_k[1:] - cu_k[:-1]
    capacity = int(block_table.shape[1]) * int(k.shape[1])
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > capacity):
        raise ValueError(f"every sequence's number of keys must be in [0, {capacity}] (max_pages * page_size of "
                         f"block_table's rows), got {lengths.tolist()[:8]}")
