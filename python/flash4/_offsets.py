"""The opt-in host check of device-resident index values. The library checks CPU-resident cu_seqlens / seqused and
KV-cache indices exactly but never reads CUDA-resident ones (that would synchronize every call; the kernels clamp
bad values instead, so they give wrong results but no out-of-bounds access). check_varlen_offsets and
check_kvcache_indices copy them to the host and run the library's own CPU validation on them;
flash_attn_varlen_func and flash_attn_with_kvcache call them on every call when the environment sets
FLASH4_CHECK_OFFSETS=1 (a debugging aid: it synchronizes the stream)."""

import os

import numpy

from ._native import _C


def offsets_check_requested():
    return os.environ.get("FLASH4_CHECK_OFFSETS", "0") not in ("", "0")


def _host_int32(x):
    if x is None:
        return None
    if hasattr(x, "detach"):  # a torch tensor, possibly on a GPU
        x = x.detach().to("cpu").numpy()
    return numpy.ascontiguousarray(numpy.asarray(x), dtype=numpy.int32)


def _stand_in(rows, heads, head_dim):
    """A float32 (rows, heads, head_dim) input array of head_dim real elements (zero strides elsewhere):
    validation reads shapes and strides, never the attention data."""
    return numpy.lib.stride_tricks.as_strided(numpy.zeros(max(head_dim, 1), numpy.float32), (rows, heads, head_dim),
                                              (0, 0, 4))


def _output_stand_in(rows, heads, head_dim):
    """The same for `out`, which validation requires to have no zero stride (a broadcast output): every stride
    one element, rows + heads + head_dim real elements."""
    return numpy.lib.stride_tricks.as_strided(numpy.zeros(max(rows + heads + head_dim, 1), numpy.float32),
                                              (rows, heads, head_dim), (4, 4, 4))


def check_varlen_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                         seqused_k=None):
    """Raises ValueError (naming the argument) unless the offsets describe a valid packed batch for q (total_q,
    heads, head_dim) and k (total_k, heads_kv, head_dim): cu[0] = 0, non-decreasing, cu[batch] <= total, every
    segment <= max_seqlen, seqused in [0, its segment]. Copies the offsets to the host (synchronizes)."""
    total_q, heads, dim = (int(n) for n in q.shape)
    total_k, heads_kv = int(k.shape[0]), int(k.shape[1])
    q_, out = _stand_in(total_q, heads, dim), _output_stand_in(total_q, heads, dim)
    k_ = _stand_in(total_k, heads_kv, dim)
    _C.can_implement_forward(q_, k_, k_, out, None, 0.0, False, -1, -1, 0.0,
                             cu_seqlens_q=_host_int32(cu_seqlens_q), cu_seqlens_k=_host_int32(cu_seqlens_k),
                             seqused_q=_host_int32(seqused_q), seqused_k=_host_int32(seqused_k),
                             max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k))


def _stand_in_shaped(shape, distinct=False):
    """A float32 array of `shape` holding a handful of real elements (validation reads shapes, strides and, on
    the host, only the index tensors): zero strides but the last, or with `distinct` every stride one element
    (validation refuses zero strides in outputs and in caches that are appended to)."""
    shape = tuple(int(n) for n in shape)
    strides = tuple(4 if distinct or i == len(shape) - 1 else 0 for i in range(len(shape)))
    return numpy.lib.stride_tricks.as_strided(numpy.zeros(max(sum(shape), 1), numpy.float32), shape, strides)


def check_kvcache_indices(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, cache_seqlens=None,
                          cache_seqlen=-1, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                          causal=False, window_size=(-1, -1), cu_seqlens_q=None, max_seqlen_q=0):
    """Raises ValueError (naming the argument) unless the index tensors of a flash_attn_with_kvcache call hold
    values the call can use: cache lengths (plus the append) within the cache, cache_batch_idx within batch_cache,
    the block-table entries each sequence uses within the pool, cache_leftpad within its sequence, rotary
    positions within the tables, cu_seqlens_q a valid packing of q. Copies them to the host (synchronizes)."""
    appends = k is not None
    tensors = [_stand_in_shaped(q.shape), _stand_in_shaped(k_cache.shape, distinct=appends),
               _stand_in_shaped(v_cache.shape, distinct=appends)]
    tensors += [None if t is None else _stand_in_shaped(t.shape) for t in (k, v)]
    tables = [None, None] if rotary_cos is None else [_stand_in_shaped(rotary_cos.shape)] * 2
    left, right = window_size
    length = -1 if cache_seqlen is None else int(cache_seqlen)
    _C.can_implement_kvcache(*tensors, *tables, _host_int32(cache_seqlens), length, _host_int32(cache_batch_idx),
                             _host_int32(block_table), _host_int32(cache_leftpad),
                             _stand_in_shaped(q.shape, distinct=True), None, None, 0.0, bool(causal), int(left),
                             int(right), 0.0, True, 0, cu_seqlens_q=_host_int32(cu_seqlens_q),
                             max_seqlen_q=int(max_seqlen_q or 0))
