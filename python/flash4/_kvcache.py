"""flash4.flash_attn_with_kvcache: KV-cache attention for inference with flash-attn's signature (the C++ entry
point is flash4::forward_kvcache, include/flash4/kvcache.h; docs/kvcache.md). torch tensors only; the work runs
through the custom op flash4::fwd_kvcache (python/flash4/_torch_kvcache.py) under torch.compile, which traces it,
and as a plain call in eager mode."""

from . import _checks
from ._api import _is_torch_tensor, normalize_options, refuse_unimplemented
from ._offsets import check_kvcache_indices, offsets_check_requested

_torch_kvcache = None  # flash4._torch_kvcache once loaded (it imports torch and registers the op)


def _torch_side():
    global _torch_kvcache
    if _torch_kvcache is None:
        from . import _torch_kvcache as module

        _torch_kvcache = module
    return _torch_kvcache


def _compiling():
    import torch

    return torch.compiler.is_compiling()


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    learnable_sink=None,
    cu_seqlens_q=None,
    max_seqlen_q=None,
    page_table=None,
):
    """Attention of new queries to a key/value cache, flash-attn's flash_attn_with_kvcache (forward only).

    q: (batch, seqlen_q, heads, head_dim). k_cache, v_cache: (batch_cache, seqlen_cache, heads_kv, head_dim), or
    with block_table (int32 (batch, max_pages)) a paged pool (num_pages, page_size, heads_kv, head_dim).
    k, v: None or (batch, seqlen_new, heads_kv, head_dim): written into the caches IN PLACE at positions
    cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before attending. rotary_cos, rotary_sin:
    (seqlen_ro, rotary_dim / 2), q's dtype, only with k: rotate the new keys at their positions and q at
    cache_seqlens + i (causal or windowed) or at cache_seqlens (otherwise); rotary_interleaved picks the
    pairs (0, 1), (2, 3), ... or GPT-NeoX's (i, i + rotary_dim / 2). cache_seqlens: int or int32 (batch,) keys
    already cached (None = the whole cache). cache_batch_idx: int32 (batch,) cache rows of a contiguous cache.
    cache_leftpad: int32 (batch,), contiguous caches only (flash-attn's): sequence b's keys are rows
    cache_leftpad[b] .. cache_seqlens[b] - 1 of its cache row (rotary angles at the rows, padding included).
    int64 index tensors are converted to int32.
    causal is aligned bottom-right (the queries are the last positions); window_size (left, right), -1 =
    unbounded; softcap 0 = off; num_splits 0 = automatic (1 .. 128: split the keys in that many parts, merged
    by their LSE); learnable_sink: None or a float tensor (heads,), used in float32. Returns out (like q) or
    (out, lse) with lse (batch, heads, seqlen_q) float32 when return_softmax_lse. alibi_slopes (flash-attn's) is
    not implemented and must be None. CUDA tensors (bf16 / fp16, head_dim a multiple of 8 up
    to 256, sm_90) run the split-KV decode kernel, or the dense forward kernel for chunked prefill, without a
    host synchronisation (CUDA-graph capturable); other GPU configurations raise NotImplementedError with the
    reason.

    cu_seqlens_q (int32 (batch + 1,), FlashAttention-3's) with max_seqlen_q: packed queries, a different count per
    sequence (decode beside speculative verify steps or prefill chunks; on the GPU the segments of up to 16 queries
    run on the decode kernel, longer ones on the dense kernel): q (total_q, heads, head_dim), sequence b's queries rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (its last positions), at most max_seqlen_q each; out like q, lse
    (heads, total_q); rows in no segment get 0 / -inf. Not with k, v or rotary. Offsets on the GPU are not read
    on the host (clamped), so the call stays graph-capturable. page_table: FlashAttention-3's name for block_table.
    CUDA index tensors are clamped by the kernels, not read; FLASH4_CHECK_OFFSETS=1 (or check_kvcache_indices)
    checks their values on the host first (synchronizes).
    """
    if page_table is not None:
        if block_table is not None:
            raise ValueError("block_table and page_table are both set; they are one argument (flash-attn 2's and 3's "
                             "names), give one")
        block_table = page_table
    refuse_unimplemented(alibi_slopes=alibi_slopes)
    if not _is_torch_tensor(q):
        raise TypeError("flash_attn_with_kvcache takes torch tensors (the caches are modified in place)")
    packed = cu_seqlens_q is not None
    if packed:  # the outputs are allocated from q's shape before the library sees it
        if q.dim() != 3:
            raise ValueError(f"with cu_seqlens_q, q must have 3 dimensions (total_q, heads, head_dim), got shape "
                             f"{tuple(q.shape)}")
        if max_seqlen_q is None:
            raise ValueError("cu_seqlens_q is set but max_seqlen_q is not; give the most queries a sequence has")
        max_seqlen_q = _checks.integer("max_seqlen_q", max_seqlen_q, 0)
    elif q.dim() != 4:
        raise ValueError(f"q must have 4 dimensions (batch, seqlen_q, heads, head_dim), got shape {tuple(q.shape)}")
    elif max_seqlen_q is not None:
        raise ValueError("max_seqlen_q is set but cu_seqlens_q is not; it only bounds packed queries")
    _checks.arrays(allow_meta=True, q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, rotary_cos=rotary_cos,
                   rotary_sin=rotary_sin, cache_batch_idx=cache_batch_idx, block_table=block_table,
                   cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q)
    torch_side = _torch_side()
    scale, left, right, cap = normalize_options(softmax_scale, window_size, softcap)
    # The library's range check names num_splits; here only its type (and the binding's int range).
    num_splits = _checks.integer("num_splits", num_splits, _checks.INT32_MIN)
    if cache_seqlens is None:
        seqlens, seqlen = None, -1
    elif _is_torch_tensor(cache_seqlens):
        seqlens, seqlen = cache_seqlens, -1
    else:  # one length for every sequence; the library's -1 ("the whole cache") is None here
        kind = "an int or an int32 torch.Tensor (batch,)"
        seqlens, seqlen = None, _checks.integer("cache_seqlens", cache_seqlens, 0, kind=kind)
    # int64 index tensors (torch's default integer type) are converted, as flash_attn_varlen_func does.
    int32_indices = torch_side.int32_indices
    if seqlens is not None:
        seqlens = int32_indices(seqlens, "cache_seqlens")
    if cache_batch_idx is not None:
        cache_batch_idx = int32_indices(cache_batch_idx, "cache_batch_idx")
    if block_table is not None:
        block_table = int32_indices(block_table, "block_table")
    if cache_leftpad is not None:
        cache_leftpad = int32_indices(cache_leftpad, "cache_leftpad")
    if packed:
        cu_seqlens_q = int32_indices(cu_seqlens_q, "cu_seqlens_q")
    # The sink in float32, as flash_attn_func takes it (a bf16 / fp16 parameter is cast).
    if learnable_sink is not None:
        learnable_sink = torch_side.sink_tensor(learnable_sink)
    if q.device.type == "cuda" and offsets_check_requested() and not _compiling():
        # The debugging aid: device-resident index values checked on the host as the library checks CPU ones.
        check_kvcache_indices(q, k_cache, v_cache, k, v, rotary_cos, seqlens, seqlen, cache_batch_idx,
                              cache_leftpad, block_table, causal, (left, right), cu_seqlens_q, max_seqlen_q)
    out, lse = torch_side.call(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, seqlens, seqlen, cache_batch_idx, block_table,
        cache_leftpad, learnable_sink, scale, bool(causal), left, right, cap, bool(rotary_interleaved), num_splits,
        cu_seqlens_q, max_seqlen_q if packed else 0, want_lse=bool(return_softmax_lse))
    return (out, lse) if return_softmax_lse else out
