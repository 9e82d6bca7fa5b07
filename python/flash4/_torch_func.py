"""flash4 attention under torch.func's transforms (grad, vjp, jacrev, vmap), for dense batches in eager mode.

The eager path (_torch_ops._EagerAttention) is an autograd.Function of the old style, whose apply() costs least
host time; torch.func needs the new style (forward without ctx, setup_context), whose apply() binds every call's
arguments to the forward's signature (about 25 us more per call, measured on the build machine). So
_torch_ops.attention() takes FuncAttention only when a transform wraps one of its tensors. vmap folds the mapped
dimension into flash4's batch: one call computes every sample."""

import torch

from ._torch_ops import (_N_DENSE_INPUTS, _NO_SEQUENCES, _NotTwiceDifferentiable, _input_gradients, _run_backward,
                         _run_forward, _saved, _setup_context, _usable_gradient)


def wrapped(*tensors) -> bool:
    """Whether a torch.func transform wraps one of the tensors (None entries are skipped). A plain loop: a
    generator's setup costs more than the check on the eager path's three tensors."""
    is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    for t in tensors:
        if t is not None and is_wrapped(t):
            return True
    return False


def _folded(info, in_dims, tensors):
    """Each tensor with its mapped dimension moved into the batch dimension (an unmapped one expanded to every
    sample)."""
    n = info.batch_size
    folded = []
    for t, dim in zip(tensors, in_dims):
        t = t.unsqueeze(0).expand(n, *t.shape) if dim is None else t.movedim(dim, 0)
        folded.append(t.reshape(n * t.shape[1], *t.shape[2:]))
    return folded


def _refuse_unfoldable(in_dims, n_tensors, seq):
    """Packed batches (offsets index the tensors' rows) and the learnable sink (its gradient is a sum over the
    batch) do not fold into the batch."""
    if any(d is not None for d in in_dims[n_tensors:]) or any(x is not None for x in seq[:4] + seq[6:]):
        raise NotImplementedError("torch.func.vmap over flash4 attention takes dense batches without a "
                                  "learnable_sink (packed batches and the sink's summed gradient do not fold "
                                  "into the batch)")


class AttentionGradients(torch.autograd.Function):
    """The library's backward as a function the transforms can run: under grad / vjp on the tensors they wrap,
    under vmap (jacrev, per-sample gradients) folded into the batch. Not differentiable itself: a second
    derivative through attention raises, as in eager mode."""

    @staticmethod
    def forward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                *seq):
        return _run_backward(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                             deterministic, seq)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *_):
        return _NotTwiceDifferentiable.backward(ctx)

    @staticmethod
    def vmap(info, in_dims, dout, q, k, v, out, lse, *options_and_seq):
        _refuse_unfoldable(in_dims, 6, options_and_seq[6:])
        n = info.batch_size
        tensors = _folded(info, in_dims, (dout, q, k, v, out, lse))
        dq, dk, dv, dsink = AttentionGradients.apply(*tensors, *options_and_seq)
        return (dq.unflatten(0, (n, -1)), dk.unflatten(0, (n, -1)), dv.unflatten(0, (n, -1)), dsink), (0, 0, 0, None)


class FuncAttention(torch.autograd.Function):
    """_EagerAttention's forward and backward in the form torch.func takes, with a vmap rule."""

    @staticmethod
    def forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic, *given):
        seq = tuple(given) + _NO_SEQUENCES[len(given):]
        return _run_forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap, seq)

    @staticmethod
    def setup_context(ctx, inputs, output):
        given = tuple(inputs[_N_DENSE_INPUTS:])
        _setup_context(ctx, tuple(inputs[:_N_DENSE_INPUTS]) + given + _NO_SEQUENCES[len(given):], output)
        ctx.n_inputs = len(inputs)  # backward returns one gradient per argument of apply()

    @staticmethod
    def vmap(info, in_dims, q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
             *given):
        _refuse_unfoldable(in_dims, _N_DENSE_INPUTS, tuple(given) + _NO_SEQUENCES[len(given):])
        n = info.batch_size
        q, k, v = _folded(info, in_dims, (q, k, v))
        out, lse = FuncAttention.apply(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                                       deterministic, *given)
        return (out.unflatten(0, (n, -1)), lse.unflatten(0, (n, -1))), (0, 0)

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, seq = _saved(ctx)
        dq, dk, dv, dsink = AttentionGradients.apply(_usable_gradient(dout, out), q, k, v, out, lse, *ctx.options,
                                                     *seq)
        return _input_gradients(ctx, dq, dk, dv, dsink, seq[6])
