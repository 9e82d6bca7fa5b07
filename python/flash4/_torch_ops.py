"""flash4 for PyTorch: custom ops flash4::fwd and flash4::bwd (dense or packed batches, optional learnable sink)
with fake (meta) implementations, so that
torch.compile traces them without graph breaks, and autograd wired from fwd to bwd; in eager mode the same
kernels through a plain autograd.Function (_EagerAttention), whose host path is shorter. Imported (and the ops
registered) by `import flash4` wherever torch is installed."""

from typing import Optional

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode
from torch.utils.dlpack import to_dlpack

from . import _checks
from ._native import _C

Tensor = torch.Tensor

# Tensors reach the extension as DLPack capsules from torch's C++ exporter: Tensor.__dlpack__ would make the
# legacy default stream wait on the current one (Python work on every call, and an illegal cross-stream wait
# while a CUDA graph is being captured). The op orders its work on the current stream itself.


# torch.cuda.current_stream(device).cuda_stream without building a Stream object (about 25 us of host time per
# call, measured); the public call where this private one is missing.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(t: Tensor) -> int:
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(t.device.index)
    return torch.cuda.current_stream(t.device).cuda_stream


def _last_dim_contiguous(t: Tensor) -> Tensor:
    # The library takes any strides but a unit stride in the last dimension; copy only when that is missing.
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _tma_addressable(t: Tensor) -> bool:
    """Whether the GPU kernels' TMA loads can address t as it is: a 16-byte aligned start and every stride but
    the last a positive multiple of 16 bytes (size-1 dimensions included: TMA takes their strides too). While
    torch.compile traces (also AOT autograd's trace of a backward, on fake / functional tensors) or a torch.func
    transform wraps t, the start address is not known: the library checks it when the call runs."""
    traced = (torch.compiler.is_compiling() or type(t) not in _PLAIN_TENSORS or is_in_torch_dispatch_mode()
              or torch._C._functorch.is_functorch_wrapped_tensor(t))  # torch.func's wrappers have no storage
    if not traced and t.data_ptr() % 16 != 0:
        return False
    size = t.element_size()
    return all(st > 0 and st * size % 16 == 0 for st in t.stride()[:-1])


def _gpu_layout(t: Tensor) -> Tensor:
    """An attention input the GPU kernels can load: t itself where TMA can address it, else a copy with the
    standard strides (broadcast views, odd strides and offsets work as in flash-attn instead of being refused).
    CPU tensors need only a unit stride in the last dimension."""
    if not t.is_cuda:
        return _last_dim_contiguous(t)
    if t.stride(-1) == 1 and _tma_addressable(t):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


# The optional packed-batch and sink arguments, in the order the ops take them (after the dense options):
# cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, learnable_sink.
_NO_SEQUENCES = (None, None, None, None, 0, 0, None)
_NO_SEQUENCE_KWARGS = dict(cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None, max_seqlen_q=0,
                           max_seqlen_k=0, learnable_sink=None)


def _sequence_kwargs(seq):
    if seq is _NO_SEQUENCES:
        return _NO_SEQUENCE_KWARGS
    cu_q, cu_k, used_q, used_k, max_q, max_k, sink = seq
    dl = lambda t: None if t is None else to_dlpack(t)  # noqa: E731
    return dict(cu_seqlens_q=dl(cu_q), cu_seqlens_k=dl(cu_k), seqused_q=dl(used_q), seqused_k=dl(used_k),
                max_seqlen_q=int(max_q), max_seqlen_k=int(max_k), learnable_sink=dl(sink))


def _lse_shape(q, cu_seqlens_q):
    """(batch, heads, seqlen_q) for a dense q, (heads, total_q) for a packed one."""
    if cu_seqlens_q is not None:
        return (q.shape[1], q.shape[0])
    batch, seqlen_q, heads, _ = q.shape
    return (batch, heads, seqlen_q)


def _out_shape(q, v):
    """out is q's shape with v's head dim (which may differ from q's: head_dim_v)."""
    return (*q.shape[:-1], v.shape[-1])


def _run_forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap, seq=_NO_SEQUENCES,
                 want_lse=True):
    """out, lse of the library's forward, allocated here (the body of flash4::fwd and of _EagerAttention; lse None
    when not want_lse, for calls nothing differentiates). (The allocations are spelled for the host's sake:
    empty_like and new_empty parse fewer arguments than torch.empty.)"""
    if v.shape[-1] == q.shape[-1]:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    else:
        out = q.new_empty(_out_shape(q, v))
    lse = q.new_empty(_lse_shape(q, seq[0]), dtype=torch.float32) if want_lse else None
    # The library switches to q's device for the call itself; the outputs are allocated there explicitly. A dense
    # call passes no keywords (the binding's defaults): parsing them costs host time on every call.
    args = (to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), None if lse is None else to_dlpack(lse),
            softmax_scale, causal, window_left, window_right, softcap, _stream(q))
    if seq is _NO_SEQUENCES:
        _C.forward(*args)
    else:
        _C.forward(*args, **_sequence_kwargs(seq))
    return out, lse


def _run_backward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                  seq=_NO_SEQUENCES, empty_dsink=True):
    """dq, dk, dv, dsink of the library's backward, allocated here (the body of flash4::bwd and of
    _EagerAttention). Without a sink dsink is an empty float32 tensor (the op's schema returns a tensor), or None
    when not empty_dsink."""
    contiguous = torch.contiguous_format
    dq, dk, dv = (torch.empty_like(q, memory_format=contiguous), torch.empty_like(k, memory_format=contiguous),
                  torch.empty_like(v, memory_format=contiguous))
    sink = seq[6]
    if sink is not None:
        dsink = q.new_empty((sink.shape[0],), dtype=torch.float32)
    else:
        dsink = q.new_empty((0,), dtype=torch.float32) if empty_dsink else None
    args = (to_dlpack(dout), to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), to_dlpack(lse), to_dlpack(dq),
            to_dlpack(dk), to_dlpack(dv), softmax_scale, causal, window_left, window_right, softcap, deterministic,
            _stream(q))
    if seq is _NO_SEQUENCES:  # a dense call without a sink: the binding's defaults, no keywords to parse
        _C.backward(*args)
    else:
        _C.backward(*args, **_sequence_kwargs(seq), dsink=None if sink is None else to_dlpack(dsink))
    return dq, dk, dv, dsink


def _usable_gradient(dout, out):
    """The upstream gradient as the library takes it: zeros when autograd passes None, a copy when the last
    dimension is not contiguous or a stride is 0 (e.g. the broadcast gradient of a sum())."""
    if dout is None:
        return torch.zeros_like(out)
    if dout.is_cuda:
        return _gpu_layout(dout)
    if dout.stride(-1) != 1 or 0 in dout.stride():
        return dout.contiguous()
    return dout


@torch.library.custom_op("flash4::fwd", mutates_args=())
def fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    seqused_q: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    learnable_sink: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """out, lse = attention(q, k, v). `deterministic` is for the backward (kept here so autograd sees it). With
    cu_seqlens_q/k: a packed batch, q (total_q, heads, head_dim) and lse (heads, total_q)."""
    return _run_forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                        (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, learnable_sink))


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic, cu_seqlens_q=None,
              cu_seqlens_k=None, seqused_q=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0, learnable_sink=None):
    out = q.new_empty(_out_shape(q, v))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flash4::bwd", mutates_args=())
def bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    seqused_q: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    learnable_sink: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv, dsink of attention for the upstream gradient dout, given fwd's out and lse (dsink: empty
    without a sink)."""
    return _run_backward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                         deterministic,
                         (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, learnable_sink))


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic,
              cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0,
              learnable_sink=None):
    dsink = q.new_empty((0 if learnable_sink is None else learnable_sink.shape[0],), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


_N_DENSE_INPUTS = 9  # q, k, v and the six options; the sequence arguments follow


def _setup_context(ctx, inputs, output, lse_is_output=True):
    q, k, v = inputs[:3]
    out, lse = output
    if len(inputs) == _N_DENSE_INPUTS:  # a dense call without a sink (sequence_args gave ())
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.present = None
    else:
        seq = tuple(inputs[_N_DENSE_INPUTS:]) + _NO_SEQUENCES[len(inputs) - _N_DENSE_INPUTS:]
        tensors = [t for t in (seq[0], seq[1], seq[2], seq[3], seq[6]) if t is not None]
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        ctx.present = tuple(t is not None for t in (seq[0], seq[1], seq[2], seq[3], seq[6]))
        ctx.max_seqlens = (seq[4], seq[5])
    ctx.options = tuple(inputs[3:_N_DENSE_INPUTS])
    ctx.n_inputs = len(inputs)
    # The LSE is returned for inspection; gradients do not flow through it (as in flash-attn).
    if lse_is_output:
        ctx.mark_non_differentiable(lse)


def _saved(ctx):
    """q, k, v, out, lse and the sequence arguments tuple, from what _setup_context saved."""
    if ctx.present is None:
        q, k, v, out, lse = ctx.saved_tensors
        return q, k, v, out, lse, _NO_SEQUENCES
    q, k, v, out, lse, *rest = ctx.saved_tensors
    it = iter(rest)
    cu_q, cu_k, used_q, used_k, sink = (next(it) if present else None for present in ctx.present)
    return q, k, v, out, lse, (cu_q, cu_k, used_q, used_k, ctx.max_seqlens[0], ctx.max_seqlens[1], sink)


def _input_gradients(ctx, dq, dk, dv, dsink, sink):
    grads = [dq, dk, dv] + [None] * (ctx.n_inputs - 3)
    if sink is not None:
        grads[_N_DENSE_INPUTS + 6] = dsink
    return tuple(grads)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, seq = _saved(ctx)
    dq, dk, dv, dsink = torch.ops.flash4.bwd(_usable_gradient(dout, out), q, k, v, out, lse, *ctx.options, *seq)
    return _input_gradients(ctx, dq, dk, dv, dsink, seq[6])


fwd.register_autograd(_backward, setup_context=_setup_context)


class _NotTwiceDifferentiable(torch.autograd.Function):
    """The gradients of the library's backward, marked: autograd sees them as constants, so a second derivative
    through attention (create_graph=True, e.g. a gradient penalty) would silently lose attention's part of it.
    Differentiating them raises instead. `anchor` is an input of the attention that requires grad, so that
    the outputs get this node as their grad_fn."""

    @staticmethod
    def forward(ctx, anchor, *grads):
        return tuple(g.clone() for g in grads)

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            "flash4's attention backward is not differentiable: a second derivative through flash4 attention "
            "(create_graph=True, e.g. a gradient penalty) is not supported")


def _guard_second_derivative(grads, *inputs):
    """grads unchanged, or marked by _NotTwiceDifferentiable when the backward itself is being recorded
    (create_graph=True) and depends on an input that requires grad."""
    if not torch.is_grad_enabled():
        return grads
    anchor = next((t for t in inputs if isinstance(t, Tensor) and t.requires_grad), None)
    return grads if anchor is None else _NotTwiceDifferentiable.apply(anchor, *grads)


def _eager_forward(ctx, inputs, lse_is_output):
    """The forward of _EagerAttention and _EagerAttentionOut: inputs are apply()'s arguments (q, k, v, the six
    options, then the sequence arguments given); out, lse."""
    given = inputs[_N_DENSE_INPUTS:]
    seq = tuple(given) + _NO_SEQUENCES[len(given):] if given else _NO_SEQUENCES
    out, lse = _run_forward(*inputs[:8], seq)
    # A dense call saves its five tensors alone (_setup_context's short form).
    _setup_context(ctx, inputs if not given else tuple(inputs[:_N_DENSE_INPUTS]) + seq, (out, lse), lse_is_output)
    ctx.n_inputs = len(inputs)  # backward returns one gradient per argument of apply()
    return out, lse


class _EagerAttention(torch.autograd.Function):
    """The same forward and backward as the custom ops, called directly, for eager mode: the custom ops'
    dispatch and autograd wrapping cost the host about 500 us per layer (forward + backward, measured on the
    H200 machine: bench/host_overhead.py), more than the attention kernels of a small model take on the GPU.
    torch.compile still sees the custom ops (attention() picks them while compiling)."""

    @staticmethod
    def forward(ctx, *inputs):
        return _eager_forward(ctx, inputs, lse_is_output=True)

    @staticmethod
    def backward(ctx, dout, _dlse=None):
        q, k, v, out, lse, seq = _saved(ctx)
        dout = _usable_gradient(dout, out)
        if through_custom_op(dout=dout, q=q, k=k, v=v):  # e.g. compiled autograd tracing this backward
            dq, dk, dv, dsink = torch.ops.flash4.bwd(dout, q, k, v, out, lse, *ctx.options, *seq)
        else:
            dq, dk, dv, dsink = _run_backward(dout, q, k, v, out, lse, *ctx.options, seq, empty_dsink=False)
        if seq[6] is None:
            dq, dk, dv = _guard_second_derivative((dq, dk, dv), dout, q, k, v)
        else:
            dq, dk, dv, dsink = _guard_second_derivative((dq, dk, dv, dsink), dout, q, k, v, seq[6])
        return _input_gradients(ctx, dq, dk, dv, dsink, seq[6])


class _EagerAttentionOut(torch.autograd.Function):
    """_EagerAttention returning out alone (calls without return_lse): one output less for autograd to track per
    call (a few microseconds of host time). The LSE is still saved for the backward."""

    @staticmethod
    def forward(ctx, *inputs):
        return _eager_forward(ctx, inputs, lse_is_output=False)[0]

    @staticmethod
    def backward(ctx, dout):
        return _EagerAttention.backward(ctx, dout)


# Tensor types that hold their data as they are: nn.Parameter too (a learnable_sink is one), which keeps the eager
# shortcut.
_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


def through_custom_op(**named):
    """Whether a call must go through the custom op rather than its eager shortcut (_EagerAttention, or the
    op's body called directly): under torch.compile, under a torch dispatch mode (FakeTensorMode,
    FlopCounterMode, ...), for tensor subclasses (fake tensors) and for meta tensors. Those have no data for the
    library to read; the op's fake implementation gives their outputs' shapes, dtypes and strides. ValueError
    for meta tensors mixed with others (named tensors; None entries are skipped), which the op would answer
    with meta outputs, or the KV-cache op with no append."""
    plain, any_meta = True, False
    for t in named.values():
        if t is not None:
            plain = plain and type(t) in _PLAIN_TENSORS
            any_meta = any_meta or t.is_meta
    if any_meta:
        tensors = {name: t for name, t in named.items() if t is not None}
        meta = [name for name, t in tensors.items() if t.is_meta]
        if len(meta) < len(tensors):
            other = next(name for name in tensors if name not in meta)
            raise ValueError(f"{meta[0]} is on the meta device but {other} is on {tensors[other].device}; meta "
                             "tensors (output shapes only) must not be mixed with tensors that hold data")
        return True
    return not plain or torch.compiler.is_compiling() or is_in_torch_dispatch_mode()


def int32_indices(t, name):
    """An index tensor with torch's default int64 converted to the library's int32 (other dtypes unchanged, for
    the library to name). The cast would wrap values beyond int32, so those of a CPU tensor are checked first;
    device tensors are not read (that would synchronize), nor traced or fake ones."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (int32), got {type(t).__name__}")
    if t.dtype != torch.int64:
        return t
    if t.device.type == "cpu" and t.numel() > 0 and not through_custom_op(**{name: t}):
        for value in (int(t.min()), int(t.max())):
            if not _checks.INT32_MIN <= value <= _checks.INT32_MAX:
                raise ValueError(f"{name} holds {value}, outside int32's range (the library's index type)")
    return t.to(torch.int32)


def _index_tensor(t, name):
    """cu_seqlens / seqused as the library takes them: int32, contiguous (flash-attn passes int32; int64 is
    converted rather than refused)."""
    return None if t is None else int32_indices(t, name).contiguous()


def _sink_tensor(sink):
    """learnable_sink in float32 (the library's type); the cast is differentiable, so the sink's gradient
    reaches a parameter of any float dtype."""
    if sink is None:
        return None
    if not isinstance(sink, Tensor):
        raise TypeError(f"learnable_sink must be a torch.Tensor of shape (heads,), got {type(sink).__name__}")
    if not sink.is_floating_point():  # an integer sink would be cast silently and could take no gradient
        raise TypeError(f"learnable_sink has dtype {sink.dtype} but must be a floating point tensor (heads,)")
    return sink.to(torch.float32).contiguous() if sink.dtype != torch.float32 else sink.contiguous()


def checked_inputs(q, k, v, packed):
    """q, k, v as the library takes them (_gpu_layout); TypeError unless they are torch tensors, ValueError
    unless of rank 4 (dense) or 3 (packed)."""
    rank, layout = (3, "(total, heads, head_dim)") if packed else (4, "(batch, seqlen, heads, head_dim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor like q, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(t.shape)}")
    return _gpu_layout(q), _gpu_layout(k), _gpu_layout(v)


def _sequence_tensors(seq):
    """The tensors of sequence_args' result by name, for through_custom_op."""
    names = ("cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k", None, None, "learnable_sink")
    return {name: t for name, t in zip(names, seq) if name is not None}


def sequence_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, learnable_sink):
    """The ops' optional packed-batch and sink arguments as the library takes them; () for a dense call without
    a sink, which keeps the ops' short argument list."""
    seq = (_index_tensor(cu_seqlens_q, "cu_seqlens_q"), _index_tensor(cu_seqlens_k, "cu_seqlens_k"),
           _index_tensor(seqused_q, "seqused_q"), _index_tensor(seqused_k, "seqused_k"), max_seqlen_q,
           max_seqlen_k, _sink_tensor(learnable_sink))
    if (seq[0] is None and seq[1] is None and seq[2] is None and seq[3] is None and seq[6] is None and seq[4] == 0
            and seq[5] == 0):
        return ()
    return seq


def attention(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic, return_lse,
              learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
              max_seqlen_q=0, max_seqlen_k=0):
    """flash_attn_func (dense, rank 4) and flash_attn_varlen_func (packed, rank 3: cu_seqlens given) for torch
    tensors, with the options already normalized."""
    q, k, v = checked_inputs(q, k, v, cu_seqlens_q is not None or cu_seqlens_k is not None)
    options = (softmax_scale, causal, window_left, window_right, softcap, deterministic)
    seq = sequence_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                        learnable_sink)
    if through_custom_op(q=q, k=k, v=v, **_sequence_tensors(seq)):
        out, lse = torch.ops.flash4.fwd(q, k, v, *options, *seq)
    elif _torch_func.wrapped(q, k, v, *(seq[6:] if seq else ())):  # inside torch.func.grad, vmap, ...
        out, lse = _torch_func.FuncAttention.apply(q, k, v, *options, *seq)
    elif not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                           or (seq and seq[6] is not None and seq[6].requires_grad))):
        # Nothing to differentiate (inference, torch.no_grad): the library call without autograd's bookkeeping,
        # and no LSE unless it is asked for (a third less host time per call).
        out, lse = _run_forward(q, k, v, *options[:5], seq or _NO_SEQUENCES, want_lse=return_lse)
    else:
        if not return_lse:
            return _EagerAttentionOut.apply(q, k, v, *options, *seq)
        out, lse = _EagerAttention.apply(q, k, v, *options, *seq)
    return (out, lse) if return_lse else out


from . import _torch_func  # noqa: E402  (it builds on the functions above)
