"""flash4 as PyTorch custom ops: flash4::fwd and flash4::bwd with fake (meta) implementations, so that
torch.compile traces them without graph breaks, and autograd wired from fwd to bwd. Imported (and the ops
registered) the first time flash4 sees a torch tensor."""

import torch
from torch.utils.dlpack import to_dlpack

from ._native import _C

Tensor = torch.Tensor

# Tensors reach the extension as DLPack capsules from torch's C++ exporter: Tensor.__dlpack__ would make the
# legacy default stream wait on the current one (Python work on every call, and an illegal cross-stream wait
# while a CUDA graph is being captured). The op orders its work on the current stream itself.


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _last_dim_contiguous(t: Tensor) -> Tensor:
    # The library takes any strides but a unit stride in the last dimension; copy only when that is missing.
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


class _OnDevice:
    """Makes t's GPU the current CUDA device for the call (a no-op for CPU tensors)."""

    def __init__(self, t: Tensor):
        self._guard = torch.cuda.device(t.device) if t.is_cuda else None

    def __enter__(self):
        if self._guard is not None:
            self._guard.__enter__()

    def __exit__(self, *exc):
        if self._guard is not None:
            self._guard.__exit__(*exc)


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
    batch, seqlen_q, heads, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    with _OnDevice(q):
        _C.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), to_dlpack(lse), softmax_scale, causal,
                   window_left, window_right, softcap, _stream(q))
    return out, lse


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
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    with _OnDevice(q):
        _C.backward(*(to_dlpack(t) for t in (dout, q, k, v, out, lse, dq, dk, dv)), softmax_scale, causal,
                    window_left, window_right, softcap, deterministic, _stream(q))
    return dq, dk, dv


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
    if dout is None:
        dout = torch.zeros_like(out)
    elif dout.stride(-1) != 1 or 0 in dout.stride():
        dout = dout.contiguous()  # e.g. the broadcast gradient of a sum(): stride 0 everywhere
    dq, dk, dv = torch.ops.flash4.bwd(dout, q, k, v, out, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None


fwd.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic, return_lse):
    """flash_attn_func for torch tensors, with the options already normalized."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor like q, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, seqlen, heads, head_dim), got shape "
                             f"{tuple(t.shape)}")
    out, lse = torch.ops.flash4.fwd(_last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v),
                                    softmax_scale, causal, window_left, window_right, softcap, deterministic)
    return (out, lse) if return_lse else out
