#!/usr/bin/env python3
"""Emulates the roundings of flash4's GPU backward for dQ (numpy, CPU) and compares them with the tolerance rule.

The question it answers (docs/numerics.md, "The GPU backward's dS"): how much of dQ's error comes from computing
dS = P (dP - D) with P read back from its 16-bit copy, while D = rowsum(dO * O) measures the exact P?

Per seed it builds one attention problem (dtype-valued N(0, 1) inputs), computes dQ three ways and reports
max |dq - ref| of the kernel emulation against the rule's 2 * max |naive - ref| + atol:
  ref    fp64, exact softmax gradient;
  naive  src/check/naive_attention.h: P, dP and dS rounded to the dtype, D = rowsum(P dP) of those values;
  kernel fp32 P, P rounded to the dtype for dV, fp32 dP, D from the dtype-rounded O, dS from the 16-bit P
         (--p-fp32: from the fp32 P; --d-exact: D from the exact P and dP), dS rounded to the dtype, fp32 dQ.

Usage: scripts/emulate_bwd_rounding.py [--seeds 200] [--sq 130 --sk 100 --heads 2 --dim 64 --dtype fp16]
       [--no-causal] [--p-fp32] [--d-exact]
"""
import argparse

import numpy as np


def emulate(rng, sq, sk, heads, dim, dtype, causal, p_fp32, d_exact):
    def to_dtype(x):
        return x.astype(dtype).astype(np.float64)

    def to_f32(x):
        return x.astype(np.float32).astype(np.float64)

    q, k, v, dout = (to_dtype(rng.standard_normal((heads, n, dim))) for n in (sq, sk, sk, sq))
    scale = 1.0 / np.sqrt(dim)
    rows, cols = np.arange(sq)[:, None], np.arange(sk)[None, :]
    visible = cols <= rows + (sk - sq) if causal else np.ones((sq, sk), bool)  # bottom-right causal
    scores = np.where(visible, np.einsum("hid,hjd->hij", q, k) * scale, -np.inf)
    row_max = scores.max(-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(scores - row_max)
    total = e.sum(-1, keepdims=True)
    p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    out = p @ v
    dp = np.einsum("hid,hjd->hij", dout, v)
    dq_ref = (p * (dp - (p * dp).sum(-1, keepdims=True))) @ k * scale

    p_n, dp_n = to_dtype(p), to_dtype(dp)
    ds_n = to_dtype(p_n * (dp_n - (p_n * dp_n).sum(-1, keepdims=True)))
    dq_naive = to_dtype(ds_n @ k * scale)

    p_f32, dp_f32 = to_f32(p), to_f32(dp)
    d = to_f32((p * dp).sum(-1, keepdims=True)) if d_exact else to_f32((dout * to_dtype(out)).sum(-1, keepdims=True))
    p_in_ds = p_f32 if p_fp32 else to_dtype(p_f32)
    ds = to_dtype(to_f32(p_in_ds * (dp_f32 - d)))
    dq_kernel = to_dtype(to_f32(ds @ k) * scale)

    err = np.abs(dq_kernel - dq_ref).max()
    base = np.abs(dq_naive - dq_ref).max()
    atol = (2.0**-12 if dtype == np.float16 else 2.0**-9) * max(np.abs(dq_ref).max(), 1.0)
    return err, base, err / (2 * base + atol)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--sq", type=int, default=130)
    ap.add_argument("--sk", type=int, default=100)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["fp16"], default="fp16", help="numpy has no bf16; fp16 only")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--p-fp32", action="store_true", help="dS from the fp32 P instead of the 16-bit copy")
    ap.add_argument("--d-exact", action="store_true", help="D = rowsum(P dP) exactly instead of rowsum(dO O)")
    a = ap.parse_args()
    results = [emulate(np.random.default_rng(seed), a.sq, a.sk, a.heads, a.dim, np.float16, not a.no_causal,
                       a.p_fp32, a.d_exact) for seed in range(a.seeds)]
    ratio = np.array([err / base for err, base, _ in results])
    margin = np.array([m for _, _, m in results])
    print(f"{a.seeds} seeds: dq error / naive error median {np.median(ratio):.2f}, max {ratio.max():.2f}; "
          f"error / tolerance max {margin.max():.2f}; rule failed {(margin > 1).sum()} times")


if __name__ == "__main__":
    main()
