"""Checks, before timing, that an implementation computes attention: its outputs are NaN-poisoned first (so an
element it never writes fails) and then judged on two (batch, head) slices against an fp64 reference under the
project's tolerance rule (src/check/tolerance.h, FlashAttention 3's):

    max |impl - ref| <= 2 * max |naive - ref| + 2^-9 * max(max |ref|, 1)        (bf16; fp16: 2^-12)

naive is plain attention in the input dtype (matmuls rounded to it, softmax in fp32 then rounded). A timing of an
implementation that fails is not reported: a wrong kernel's speed means nothing.

Poisoning: the implementations allocate their outputs through PyTorch's caching allocator, which hands out the
best-fitting free block, so NaN-filled blocks of each output's size are allocated and freed just before the call
(enough of them to cover every free block of that size, as each allocation takes one).
"""
import torch

BASELINE_FACTOR = 2.0
ATOL_FRACTION = {torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -12}
POISON_BLOCKS = 16


def poison_allocator(like, count=POISON_BLOCKS):
    """Leaves the caching allocator's free blocks of like's size NaN-filled (see the module docstring)."""
    blocks = [torch.full_like(like, float("nan")) for _ in range(count)]
    del blocks


def _slice_attention(q, k, v, causal, dtype, dout=None):
    """Attention of one (seqlen, d) slice in `dtype` (fp64: the reference; bf16/fp16: the naive baseline); with
    dout, also its gradients. Returns [out] or [out, dq, dk, dv] in fp64."""
    q, k, v = (x.detach().to(dtype).requires_grad_(dout is not None) for x in (q, k, v))
    s = torch.matmul(q, k.transpose(0, 1)) * (q.shape[-1] ** -0.5)
    if causal:  # seqlen_q == seqlen_k here: key j is visible to query i when j <= i
        keep = torch.ones(s.shape, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.to(torch.float64 if dtype == torch.float64 else torch.float32), dim=-1).to(dtype)
    out = torch.matmul(p, v)
    if dout is None:
        return [out.detach().double()]
    grads = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
    return [out.detach().double()] + [g.double() for g in grads]


def _judge(name, got, ref, naive, dtype):
    """None when within the rule, else a one-line reason with the numbers."""
    got = got.double()
    if not torch.isfinite(got).all():
        return f"{name}: non-finite values (unwritten elements stay NaN)"
    err = (got - ref).abs().max().item()
    base = (naive - ref).abs().max().item()
    limit = BASELINE_FACTOR * base + ATOL_FRACTION[dtype] * max(ref.abs().max().item(), 1.0)
    if err > limit:
        return f"{name}: max error {err:.3g} > tolerance {limit:.3g} (naive baseline {base:.3g})"
    return None


def poisoned_results(fwd, q, k, v, dout, causal):
    """[out] (or [out, dq, dk, dv] when dout is given) of one call of fwd on NaN-poisoned output blocks."""
    for x in (q, k, v):
        x.grad = None
    poison_allocator(q)
    if dout is None:
        with torch.no_grad():
            return [fwd(q, k, v, causal)]
    out = fwd(q, k, v, causal)
    poison_allocator(q)
    return [out.detach()] + list(torch.autograd.grad(out, (q, k, v), dout))


def check_impl(fwd, q, k, v, dout, causal):
    """Runs fwd once on poisoned outputs and judges out (and dq, dk, dv when dout is given) on the first and the
    last (batch, head) slice; q, k, v have the same heads (the benchmark's shapes; no GQA). Returns None when
    correct, else the reasons."""
    results = poisoned_results(fwd, q, k, v, dout, causal)
    names = ["out", "dq", "dk", "dv"][:len(results)]
    problems = []
    b_last, h_last = q.shape[0] - 1, q.shape[2] - 1
    for b, h in ((0, 0), (b_last, h_last)):
        sl = [x[b, :, h, :] for x in (q, k, v)]
        d_sl = None if dout is None else dout[b, :, h, :]
        ref = _slice_attention(*sl, causal, torch.float64, d_sl)
        naive = _slice_attention(*sl, causal, q.dtype, d_sl)
        for i, name in enumerate(names):
            why = _judge(f"{name}[b={b},h={h}]", results[i][b, :, h, :], ref[i], naive[i], q.dtype)
            if why:
                problems.append(why)
    del results
    return "; ".join(problems) if problems else None
