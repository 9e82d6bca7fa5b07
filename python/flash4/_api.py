"""Framework-neutral entry points: argument normalization, dispatch to the torch custom ops for torch tensors,
and the forward for any other DLPack array (numpy, cupy, ...), whose outputs are allocated with the input's own
array library."""

import sys
from typing import NamedTuple

import numpy

from . import _checks
from ._native import _C
from ._offsets import check_varlen_offsets, offsets_check_requested

_LAYOUT = "(batch, seqlen, heads, head_dim)"
_EXP2_MODES = {"auto": 0, "exact": 1, "polynomial": 2}

_torch_backend_module = None  # flash4._torch_ops once loaded (it imports torch and registers the ops)
_torch_fp8_module = None  # flash4._torch_fp8 once loaded (the FP8 forward op)


class Support(NamedTuple):
    """Result of can_implement: `ok`, or the `reason` the device cannot run the configuration."""

    ok: bool
    reason: str

    def __bool__(self):
        return self.ok


def _torch_backend():
    global _torch_backend_module
    if _torch_backend_module is None:
        from . import _torch_ops

        _torch_backend_module = _torch_ops
    return _torch_backend_module


def _torch_fp8():
    global _torch_fp8_module
    if _torch_fp8_module is None:
        from . import _torch_fp8

        _torch_fp8_module = _torch_fp8
    return _torch_fp8_module


def _fp8_requested(q, descales):
    """Whether a torch call takes the FP8 path: float8_e4m3fn q, or a descale factor given (which that path
    refuses for other dtypes, naming the factor)."""
    return any(d is not None for d in descales) or q.dtype == sys.modules["torch"].float8_e4m3fn


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")  # x cannot be a torch tensor unless torch was imported
    return torch is not None and isinstance(x, torch.Tensor)


def normalize_options(softmax_scale, window_size, softcap):
    """(softmax_scale, window_left, window_right, softcap) as the native layer takes them. A softmax_scale of
    None becomes 0.0, the library's "1/sqrt(head_dim)". Types and ranges are checked here (_checks), the values'
    meaning (finite, >= 0) by the library."""
    scale = 0.0 if softmax_scale is None else _checks.real("softmax_scale", softmax_scale)
    left, right = _checks.window(window_size)
    return scale, left, right, _checks.real("softcap", softcap)


def check_attention_shape(x, name):
    """TypeError unless x is an array; ValueError unless it is 4-D. Returns its shape as a tuple."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(
            f"{name} must be an array (torch tensor, numpy array or another DLPack array), got {type(x).__name__}"
        )
    if len(shape) != 4:
        raise ValueError(f"{name} must have 4 dimensions {_LAYOUT}, got shape {tuple(shape)}")
    return tuple(shape)


def _empty(like, shape, float32=False):
    """An uninitialized array of `shape` on like's device, with like's dtype (or float32)."""
    if isinstance(like, numpy.ndarray):
        return numpy.empty(shape, dtype=numpy.float32 if float32 else like.dtype)
    namespace = getattr(like, "__array_namespace__", None)
    if namespace is None:
        raise TypeError(
            f"cannot allocate outputs for an array of type {type(like).__name__}: pass torch tensors, numpy arrays "
            "or arrays with __array_namespace__, or call flash4.forward with preallocated outputs"
        )
    xp = namespace()
    return xp.empty(shape, dtype=xp.float32 if float32 else like.dtype, device=like.device)


def _stream_for(x, stream):
    """The stream to run on: the given one, else torch's current stream for a torch CUDA tensor, else 0."""
    if stream is not None:
        return int(stream)
    if _is_torch_tensor(x) and x.is_cuda:
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    return 0


def _exported(*arrays):
    """torch tensors as DLPack capsules (no implicit stream synchronization, gradients ignored); other arrays
    as they are (None stays None)."""
    if not any(_is_torch_tensor(a) for a in arrays):
        return arrays
    from torch.utils.dlpack import to_dlpack

    return tuple(to_dlpack(a) if _is_torch_tensor(a) else a for a in arrays)


def refuse_unimplemented(dropout_p=0.0, alibi_slopes=None):
    """NotImplementedError for the flash-attn arguments flash4 takes (for signature compatibility) but lacks."""
    if dropout_p != 0.0:
        raise NotImplementedError("flash4 has no attention dropout; dropout_p must be 0")
    if alibi_slopes is not None:
        raise NotImplementedError("flash4 does not implement ALiBi; alibi_slopes must be None")


def check_schedule_hints(num_splits, pack_gqa, sm_margin):
    """FlashAttention-3 / 4's scheduling keywords, taken so that their call sites run unchanged: checked for
    type and range, then left to flash4's own schedule (the results do not depend on them)."""
    _checks.integer("num_splits", num_splits, 0)
    _checks.integer("sm_margin", sm_margin, 0)
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"pack_gqa must be None, True or False, got {type(pack_gqa).__name__}")


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    deterministic=False,
    return_lse=False,
    *,
    learnable_sink=None,
    dropout_p=0.0,
    alibi_slopes=None,
    return_attn_probs=False,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    num_splits=1,
    pack_gqa=None,
    sm_margin=0,
):
    """Exact attention, keyword-compatible with flash-attn's flash_attn_func.

    q: (batch, seqlen_q, heads, head_dim); k: (batch, seqlen_k, heads_kv, head_dim); v: (batch, seqlen_k, heads_kv,
    head_dim_v), heads % heads_kv == 0; head_dim_v, taken from v, may differ from head_dim (e.g. 192 and 128).
    softmax_scale: None (or 0) = 1/sqrt(head_dim). causal: bottom-right aligned. window_size: (left, right), -1 =
    unbounded. softcap: 0 = off. deterministic: bit-identical gradients. return_lse (or flash-attn's
    return_attn_probs): also return the log-sum-exp (batch, heads, seqlen_q), float32, natural log.
    learnable_sink: None or (heads,) logits (gpt-oss attention sinks), one per head, added to every row's softmax
    denominator with no value; differentiable (its gradient is computed in float32).
    FP8 (FlashAttention 3's interface): q, k, v all torch.float8_e4m3fn, forward only, out bfloat16;
    q_descale / k_descale / v_descale (float32 (batch, heads_kv), None = 1) give the real inputs, e.g.
    q[b, :, h] * q_descale[b, h // (heads // heads_kv)]. num_splits, pack_gqa, sm_margin: FlashAttention-3 / 4's
    scheduling keywords, checked and otherwise left to flash4's own schedule (results do not depend on them).

    torch tensors (CPU or CUDA): differentiable, runs on the current CUDA stream, traceable by torch.compile.
    Other DLPack arrays (numpy: float32 and float16): forward only, on the CPU, or on the default stream for GPU
    arrays. Returns out (like q, with v's head dim) or (out, lse).
    """
    refuse_unimplemented(dropout_p=dropout_p, alibi_slopes=alibi_slopes)
    if num_splits != 1 or pack_gqa is not None or sm_margin != 0:
        check_schedule_hints(num_splits, pack_gqa, sm_margin)
    want_lse = bool(return_lse or return_attn_probs)
    scale, left, right, cap = normalize_options(softmax_scale, window_size, softcap)
    descales = (q_descale, k_descale, v_descale)
    _checks.arrays(allow_meta=True, q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if _is_torch_tensor(q):
        if _fp8_requested(q, descales):
            return _torch_fp8().attention(q, k, v, descales, scale, bool(causal), left, right, cap, want_lse,
                                          learnable_sink=learnable_sink)
        return _torch_backend().attention(q, k, v, scale, bool(causal), left, right, cap, bool(deterministic), want_lse,
                                          learnable_sink=learnable_sink)

    shape = check_attention_shape(q, "q")
    check_attention_shape(k, "k")
    v_shape = check_attention_shape(v, "v")
    _checks.dlpack(learnable_sink=learnable_sink, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    batch, seqlen_q, heads, _ = shape
    out = _empty(q, shape[:3] + v_shape[3:])  # v's head dim
    lse = _empty(q, (batch, heads, seqlen_q), float32=True)
    _C.forward(q, k, v, out, lse, scale, bool(causal), left, right, cap, 0, learnable_sink=learnable_sink,
               q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    return (out, lse) if want_lse else out


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    deterministic=False,
    return_lse=False,
    seqused_q=None,
    seqused_k=None,
    learnable_sink=None,
    *,
    dropout_p=0.0,
    alibi_slopes=None,
    return_attn_probs=False,
    block_table=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    page_table=None,
    num_splits=1,
    pack_gqa=None,
    sm_margin=0,
):
    """Exact attention over a packed batch of sequences of different lengths, keyword-compatible with
    flash-attn's flash_attn_varlen_func.

    q: (total_q, heads, head_dim); k: (total_k, heads_kv, head_dim); v: (total_k, heads_kv, head_dim_v), out
    (total_q, heads, head_dim_v). cu_seqlens_q / cu_seqlens_k: int32
    (batch + 1,) running offsets, cu[0] = 0 (int64 torch tensors are converted): sequence b is rows
    cu[b] .. cu[b + 1] - 1. max_seqlen_q / max_seqlen_k: ints bounding the lengths. Masks apply per sequence
    (causal bottom-right in each). seqused_q / seqused_k: optional int32 (batch,): use only the first n tokens of
    each sequence. Rows in no sequence get out 0 (lse -inf) and zero gradients. Other options as in
    flash_attn_func (FP8 too: the descales' batch is the number of sequences); lse is (heads, total_q).
    block_table (int32 (batch, max_pages)): flash-attn 2's paged k, v (num_pages, page_size, heads_kv, head_dim),
    forward only (page_table: FlashAttention-3 / 4's name for it); cu_seqlens_k or seqused_k gives the keys per
    sequence (flash_attn_with_kvcache's problem). Batches mixing query counts run as one call with packed queries
    while max_seqlen_q <= 16 (speculative verify steps beside decode); with longer segments (prefill chunks beside
    decode steps) they read cu_seqlens_q on the host once.
    CPU offsets are checked; CUDA ones are clamped by the kernels (see docs/python.md); set FLASH4_CHECK_OFFSETS=1
    to check them on the host too (check_varlen_offsets).
    """
    max_seqlen_q = _checks.integer("max_seqlen_q", max_seqlen_q, 0)
    max_seqlen_k = _checks.integer("max_seqlen_k", max_seqlen_k, 0)
    if num_splits != 1 or pack_gqa is not None or sm_margin != 0:
        check_schedule_hints(num_splits, pack_gqa, sm_margin)
    if page_table is not None:  # FlashAttention-3 / 4's name for block_table
        if block_table is not None:
            raise ValueError("block_table and page_table are both set; they are one argument (flash-attn 2's and "
                             "3's names), give one")
        block_table = page_table
    want_lse = bool(return_lse or return_attn_probs)
    if block_table is not None:  # flash-attn 2's paged keys and values (decode batches)
        refuse_unimplemented(dropout_p=dropout_p, alibi_slopes=alibi_slopes)
        from ._paged_varlen import paged_varlen_attention

        return paged_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                                      seqused_k, block_table, softmax_scale, causal, window_size, softcap,
                                      learnable_sink, want_lse, (q_descale, k_descale, v_descale))
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        given, missing = ("cu_seqlens_k", "cu_seqlens_q") if cu_seqlens_q is None else ("cu_seqlens_q", "cu_seqlens_k")
        raise ValueError(f"{given} is set but {missing} is not; a packed batch needs both")
    if offsets_check_requested():
        check_varlen_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k)
    refuse_unimplemented(dropout_p=dropout_p, alibi_slopes=alibi_slopes)
    scale, left, right, cap = normalize_options(softmax_scale, window_size, softcap)
    descales = (q_descale, k_descale, v_descale)
    _checks.arrays(allow_meta=True, q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if _is_torch_tensor(q):
        sequences = dict(learnable_sink=learnable_sink, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         seqused_q=seqused_q, seqused_k=seqused_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k)
        if _fp8_requested(q, descales):
            return _torch_fp8().attention(q, k, v, descales, scale, bool(causal), left, right, cap, want_lse,
                                          **sequences)
        return _torch_backend().attention(q, k, v, scale, bool(causal), left, right, cap, bool(deterministic),
                                          want_lse, **sequences)

    _checks.dlpack(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_q=seqused_q,
                   seqused_k=seqused_k, learnable_sink=learnable_sink, q_descale=q_descale, k_descale=k_descale,
                   v_descale=v_descale)
    shape = getattr(q, "shape", None)
    if shape is None or len(shape) != 3:
        raise ValueError(f"q must have 3 dimensions (total_q, heads, head_dim), got shape {shape}")
    total_q, heads, _ = shape
    out = _empty(q, tuple(shape[:2]) + tuple(getattr(v, "shape", shape)[-1:]))  # v's head dim
    lse = _empty(q, (heads, total_q), float32=True)
    _C.forward(q, k, v, out, lse, scale, bool(causal), left, right, cap, 0, cu_seqlens_q=cu_seqlens_q,
               cu_seqlens_k=cu_seqlens_k, seqused_q=seqused_q, seqused_k=seqused_k, max_seqlen_q=max_seqlen_q,
               max_seqlen_k=max_seqlen_k, learnable_sink=learnable_sink, q_descale=q_descale,
               k_descale=k_descale, v_descale=v_descale)
    return (out, lse) if want_lse else out


def forward(
    q,
    k,
    v,
    out,
    lse=None,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    stream=None,
    exp2="auto",
    conditional_rescale=True,
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """Low-level forward into preallocated `out` (like q, with v's head dim) and optional `lse`
    ((batch, heads, seqlen_q) float32), for any DLPack arrays (writable). No autograd. stream: a cudaStream_t as
    int; None = torch's current stream for torch CUDA tensors, else the default stream. exp2 ("auto", "exact",
    "polynomial") and conditional_rescale are the library's tuning knobs, for ablations. float8_e4m3fn q, k, v
    take q/k/v_descale and a bf16 or fp16 out."""
    if exp2 not in _EXP2_MODES:
        raise ValueError(f"exp2 must be one of {sorted(_EXP2_MODES)}, got {exp2!r}")
    scale, left, right, cap = normalize_options(softmax_scale, window_size, softcap)
    _checks.arrays(q=q, k=k, v=v, out=out, lse=lse, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    _checks.dlpack(q=q, k=k, v=v, out=out, lse=lse, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    _checks.writable(out=out, lse=lse)
    stream = _stream_for(q, stream)
    q, k, v, out, lse, q_descale, k_descale, v_descale = _exported(q, k, v, out, lse, q_descale, k_descale,
                                                                   v_descale)
    _C.forward(q, k, v, out, lse, scale, bool(causal), left, right, cap, stream, _EXP2_MODES[exp2],
               bool(conditional_rescale), q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    dq,
    dk,
    dv,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    deterministic=False,
    stream=None,
):
    """Low-level backward into preallocated dq, dk, dv (like q, k, v; dout like out), for any DLPack arrays
    (the outputs writable). `out` and `lse` are the forward's results for the same options."""
    scale, left, right, cap = normalize_options(softmax_scale, window_size, softcap)
    for name, x in (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse), ("dq", dq),
                    ("dk", dk), ("dv", dv)):
        if x is None:
            raise ValueError(f"{name} is required" + (" (the forward's log-sum-exp, float32 (batch, heads, "
                                                      "seqlen_q))" if name == "lse" else ""))
    _checks.arrays(dout=dout, q=q, k=k, v=v, out=out, lse=lse, dq=dq, dk=dk, dv=dv)
    _checks.dlpack(dout=dout, q=q, k=k, v=v, out=out, lse=lse, dq=dq, dk=dk, dv=dv)
    _checks.writable(dq=dq, dk=dk, dv=dv)
    stream = _stream_for(q, stream)
    _C.backward(*_exported(dout, q, k, v, out, lse, dq, dk, dv), scale, bool(causal), left, right, cap,
                bool(deterministic), stream)


def can_implement(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    deterministic=False,
    backward=False,
):
    """Support(ok, reason): whether the device q lives on can run this attention (the forward, or with
    backward=True the backward). Raises ValueError/TypeError for invalid arguments, like the entry points.
    Allocates (uninitialized) outputs of the problem's size to describe it to the library."""
    scale, left, right, cap = normalize_options(softmax_scale, window_size, softcap)
    _checks.arrays(q=q, k=k, v=v)
    shape = check_attention_shape(q, "q")
    check_attention_shape(k, "k")
    v_shape = check_attention_shape(v, "v")
    batch, seqlen_q, heads, _ = shape
    if _is_torch_tensor(q):
        import torch

        empty_like = lambda t: torch.empty(t.shape, dtype=t.dtype, device=t.device)  # noqa: E731
        lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
        out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype  # FP8 writes bf16
        out = torch.empty(shape[:3] + v_shape[3:], dtype=out_dtype, device=q.device)
    else:
        empty_like = lambda t: _empty(t, tuple(t.shape))  # noqa: E731
        lse = _empty(q, (batch, heads, seqlen_q), float32=True)
        out = _empty(q, shape[:3] + v_shape[3:])
    if backward:
        arrays = _exported(empty_like(out), q, k, v, out, lse, empty_like(q), empty_like(k), empty_like(v))
        ok, reason = _C.can_implement_backward(*arrays, scale, bool(causal), left, right, cap, bool(deterministic))
    else:
        ok, reason = _C.can_implement_forward(*_exported(q, k, v, out, lse), scale, bool(causal), left, right, cap)
    return Support(ok, reason)


def cuda_available(device_index=0):
    """True when flash4 was built with its CUDA kernels and GPU `device_index` is one they run on (sm_90)."""
    return bool(_C.cuda_available(int(device_index)))
