"""FP8 (float8_e4m3fn) attention forward for torch tensors: the custom op flash4::fwd_fp8, with a fake (meta)
implementation so that torch.compile traces it, and the direct call used in eager mode. Forward only (the library
has no FP8 backward), so inputs that would need gradients are refused before the call."""

from typing import Optional

import torch
from torch.utils.dlpack import to_dlpack

from ._native import _C
from ._torch_ops import (_NO_SEQUENCES, _lse_shape, _out_shape, _sequence_kwargs, _stream, checked_inputs,
                         _sequence_tensors, sequence_args, through_custom_op)

Tensor = torch.Tensor

FP8 = torch.float8_e4m3fn
# FlashAttention 3's output dtype for FP8 inputs (the library also writes fp16, chosen by out's dtype).
OUT_DTYPE = torch.bfloat16
_DESCALES = ("q_descale", "k_descale", "v_descale")


def _run(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right, softcap,
         seq=_NO_SEQUENCES, want_lse=True):
    """out (bf16) and lse of the library's FP8 forward, allocated here (the body of flash4::fwd_fp8); lse None
    when not want_lse (the kernel then writes none)."""
    out = torch.empty(_out_shape(q, v), dtype=OUT_DTYPE, device=q.device)
    lse = torch.empty(_lse_shape(q, seq[0]), dtype=torch.float32, device=q.device) if want_lse else None
    dl = lambda t: None if t is None else to_dlpack(t)  # noqa: E731
    _C.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), dl(lse), softmax_scale, causal,
               window_left, window_right, softcap, _stream(q), **_sequence_kwargs(seq), q_descale=dl(q_descale),
               k_descale=dl(k_descale), v_descale=dl(v_descale))
    return out, lse


@torch.library.custom_op("flash4::fwd_fp8", mutates_args=())
def fwd_fp8(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_descale: Optional[Tensor],
    k_descale: Optional[Tensor],
    v_descale: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    seqused_q: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    learnable_sink: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """out (bf16), lse = attention of float8_e4m3fn q, k, v, each scaled by its descale factor (float32 (batch,
    heads_kv); None = 1). Dense or packed as flash4::fwd."""
    return _run(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right, softcap,
                (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, learnable_sink))


@fwd_fp8.register_fake
def _fwd_fp8_fake(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right,
                  softcap, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None, max_seqlen_q=0,
                  max_seqlen_k=0, learnable_sink=None):
    out = q.new_empty(_out_shape(q, v), dtype=OUT_DTYPE)
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    return out, lse


def _no_backward(ctx, dout, dlse):
    raise NotImplementedError("flash4::fwd_fp8 has no backward: flash4's FP8 (float8_e4m3fn) attention is forward "
                              "only")


# Reached only through the op called directly on tensors that require grad (attention() refuses them first).
fwd_fp8.register_autograd(_no_backward)


def _check_forward_only(named):
    """NotImplementedError naming the first tensor that requires grad while grad mode is on: there is no FP8
    backward to give it a gradient."""
    if not torch.is_grad_enabled():
        return
    for name, t in named.items():
        if isinstance(t, Tensor) and t.requires_grad:
            raise NotImplementedError(
                f"flash4's FP8 (float8_e4m3fn) attention is forward only, but {name} requires grad: detach it, or "
                "call under torch.no_grad() or torch.inference_mode()"
            )


def attention(q, k, v, descales, softmax_scale, causal, window_left, window_right, softcap, return_lse,
              learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
              max_seqlen_q=0, max_seqlen_k=0):
    """flash_attn_func / flash_attn_varlen_func for torch tensors with float8_e4m3fn q or a descale factor given
    (descales: q_descale, k_descale, v_descale), options already normalized. Returns bf16 out, or (out, lse)."""
    q, k, v = checked_inputs(q, k, v, cu_seqlens_q is not None or cu_seqlens_k is not None)
    for name, t in zip(_DESCALES, descales):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (float32, (batch, heads_kv)), got {type(t).__name__}")
        if t is not None and q.dtype != FP8:
            raise TypeError(f"{name} is given but q.dtype is {q.dtype}; descale factors belong to "
                            "float8_e4m3fn q, k, v")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != FP8:
            raise TypeError(f"{name}.dtype is {t.dtype} but q.dtype is {FP8}; FP8 attention takes q, k and v all "
                            "float8_e4m3fn")
    # Descales in any strides (FlashAttention 3 takes them so: vLLM passes a scalar expanded to (batch, heads_kv));
    # the library takes a unit stride in the last dimension, and they are tiny.
    descales = tuple(None if t is None else t.contiguous() for t in descales)
    _check_forward_only(dict(q=q, k=k, v=v, **dict(zip(_DESCALES, descales)), learnable_sink=learnable_sink))
    seq = sequence_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                        learnable_sink)
    options = (softmax_scale, causal, window_left, window_right, softcap)
    if through_custom_op(q=q, k=k, v=v, **dict(zip(_DESCALES, descales)), **_sequence_tensors(seq)):
        out, lse = torch.ops.flash4.fwd_fp8(q, k, v, *descales, *options, *seq)
    else:  # the op's body without its dispatch, whose host time would dominate small calls
        out, lse = _run(q, k, v, *descales, *options, tuple(seq) + _NO_SEQUENCES[len(seq):], want_lse=return_lse)
    return (out, lse) if return_lse else out
