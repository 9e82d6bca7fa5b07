"""flash4 for PyTorch: custom ops flash4::fwd and flash4::bwd with fake (meta) implementations, so that
torch.compile traces them without graph breaks, and autograd wired from fwd to bwd; in eager mode the same
kernels through a plain autograd.Function (_EagerAttention), whose host path is shorter. Imported (and the ops
registered) the first time flash4 sees a torch tensor."""

import torch
from torch.utils.dlpack import to_dlpack

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


def _run_forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap):
    """out, lse of the library's forward, allocated here (the body of flash4::fwd and of _EagerAttention)."""
    batch, seqlen_q, heads, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    # The library switches to q's device for the call itself; the outputs are allocated there explicitly.
    _C.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), to_dlpack(lse), softmax_scale, causal,
               window_left, window_right, softcap, _stream(q))
    return out, lse


def _run_backward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    """dq, dk, dv of the library's backward, allocated here (the body of flash4::bwd and of _EagerAttention)."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _C.backward(*(to_dlpack(t) for t in (dout, q, k, v, out, lse, dq, dk, dv)), softmax_scale, causal,
                window_left, window_right, softcap, deterministic, _stream(q))
    return dq, dk, dv


def _usable_gradient(dout, out):
    """The upstream gradient as the library takes it: zeros when autograd passes None, a copy when the last
    dimension is not contiguous or a stride is 0 (e.g. the broadcast gradient of a sum())."""
    if dout is None:
        return torch.zeros_like(out)
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
) -> tuple[Tensor, Tensor]:
    """out, lse = attention(q, k, v). `deterministic` is for the backward (kept here so autograd sees it)."""
    return _run_forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap)


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    batch, seqlen_q, heads, _ = q.shape
    out = q.new_empty(q.shape)
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
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
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of attention for the upstream gradient dout, given fwd's out and lse."""
    return _run_backward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                         deterministic)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (softmax_scale, causal, window_left, window_right, softcap, deterministic)
    # The LSE is returned for inspection; gradients do not flow through it (as in flash-attn).
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.flash4.bwd(_usable_gradient(dout, out), q, k, v, out, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None


fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The same forward and backward as the custom ops, called directly, for eager mode: the custom ops'
    dispatch and autograd wrapping cost the host about 500 us per layer (forward + backward, measured on the
    H200 machine: bench/host_overhead.py), more than the attention kernels of a small model take on the GPU.
    torch.compile still sees the custom ops (attention() picks them while compiling)."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic):
        out, lse = _run_forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap)
        _setup_context(ctx, (q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic),
                       (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _run_backward(_usable_gradient(dout, out), q, k, v, out, lse, *ctx.options)
        return dq, dk, dv, None, None, None, None, None, None


def attention(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic, return_lse):
    """flash_attn_func for torch tensors, with the options already normalized."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor like q, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, seqlen, heads, head_dim), got shape "
                             f"{tuple(t.shape)}")
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    options = (softmax_scale, causal, window_left, window_right, softcap, deterministic)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.flash4.fwd(q, k, v, *options)
    else:
        out, lse = _EagerAttention.apply(q, k, v, *options)
    return (out, lse) if return_lse else out
