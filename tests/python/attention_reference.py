"""Test-side attention math in numpy: the fp64 reference, the naive same-dtype baseline and the tolerance rule.

The rule (FlashAttention 3's, as in src/check/tolerance.h):  max|impl - ref| <= 2 * max|naive - ref| + atol,
ref = fp64 attention on the same (dtype-valued) inputs, naive = a plain unfused implementation in the dtype
(every materialized intermediate rounded to it), atol = a per-dtype fraction of max|ref|.
"""

import math

import numpy as np

# atol as a fraction of max|ref| (src/check/tolerance.cpp): fp32 leaves room for fp32 sums over thousands of terms;
# fp16/bf16 the dtype's unit roundoff, the rounding every implementation gives its output.
ATOL_RELATIVE = {"float32": 2.0**-16, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# Unit roundoff of each dtype (as src/check/naive_attention.cpp), for bounds of one rounding step.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# Relative error of the library's polynomial exp2; an implementation using it may move outputs by about twice
# this times max|out| and the LSE by this much, which no same-dtype baseline shows (matters for fp32 only).
EXP2_POLY_RELATIVE_ERROR = 1e-4


def allowed_keys(seqlen_q, seqlen_k, causal=False, window=(-1, -1)):
    """Boolean (seqlen_q, seqlen_k): query i may see key j. Bottom-right aligned causal mask and window."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    diag = i + seqlen_k - seqlen_q
    ok = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def _scores(q, k, scale, softcap):
    """fp64 scores (batch, heads, seqlen_q, seqlen_k) with K/V heads repeated for GQA."""
    group = q.shape[2] // k.shape[2]
    kk = np.repeat(k.astype(np.float64), group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), kk) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    return s


def _round(x, dtype):
    if dtype is None:
        return x
    return x.astype(dtype).astype(np.float64)


def attention(q, k, v, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, round_to=None):
    """(out, lse) in fp64. round_to=None: the exact reference; round_to=np.float16 etc.: the naive same-dtype
    baseline (P and O rounded to that dtype). Fully masked rows give out 0 and lse -inf."""
    scale = 1.0 / math.sqrt(q.shape[3]) if not softmax_scale else softmax_scale
    s = _scores(q, k, scale, softcap)
    ok = allowed_keys(q.shape[1], k.shape[1], causal, window)
    s = np.where(ok, s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    p = np.exp(s - row_max)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(total > 0, p / total, 0.0)
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + row_max[..., 0], -np.inf)
    p = _round(p, round_to)
    group = q.shape[2] // v.shape[2]
    vv = np.repeat(v.astype(np.float64), group, axis=2)
    out = np.einsum("bhqk,bkhd->bqhd", p, vv)
    out = _round(out, round_to)
    if round_to is not None:
        lse = lse.astype(np.float32).astype(np.float64)
    return out, lse


def max_abs_error(a, b):
    """Largest |a - b|; inf for NaN or for an infinity not matched by the same infinity."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or np.isnan(a).any() or np.isnan(b).any():
        return math.inf
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if (inf_a != inf_b).any() or (a[inf_a] != b[inf_b]).any():
        return math.inf
    finite = ~inf_a
    return float(np.abs(a[finite] - b[finite]).max()) if finite.any() else 0.0


def check_tolerance(what, impl, ref, naive, dtype_name, extra_atol=0.0):
    """Asserts the tolerance rule; the message shows the numbers either way."""
    err = max_abs_error(impl, ref)
    base = max_abs_error(naive, ref)
    ref = np.asarray(ref, dtype=np.float64)
    finite = ref[np.isfinite(ref)]
    # Floored at 1, as in the C++ tests (src/check/tolerance.h): a gradient that is exactly 0 in exact
    # arithmetic (one key: dS = dP - D = 0) still carries fp32 rounding.
    scale = max(float(np.abs(finite).max()) if finite.size else 0.0, 1.0)
    atol = ATOL_RELATIVE[dtype_name] * scale + extra_atol
    tol = 2.0 * base + atol
    assert err <= tol, (
        f"{what} ({dtype_name}): max error {err:.3g} > tolerance {tol:.3g} (naive {base:.3g}, atol {atol:.3g})"
    )
