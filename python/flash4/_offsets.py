"""The opt-in host check of a packed batch's offsets. The library checks CPU-resident cu_seqlens / seqused exactly
but never reads CUDA-resident ones (that would synchronize every call; the kernels clamp bad values instead, so
they give wrong results but no out-of-bounds access). check_varlen_offsets copies them to the host and runs the
library's own CPU validation on them; flash_attn_varlen_func calls it on every call when the environment sets
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
