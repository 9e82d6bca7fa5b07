#!/usr/bin/env python3
"""Host time per flash4 call, next to SDPA's: tiny shapes (the GPU work is negligible, so the loop measures the
host path: Python, the custom op, DLPack, argument checks, allocation, launches). Each layer of a training step
pays this once forward and once backward; a small model whose step is host-bound pays it in tokens/s.

    python3 bench/host_overhead.py [--calls 2000]

Prints microseconds per call for: flash4 fwd op, flash4 bwd op, _C.forward / _C.backward directly (no torch
op), SDPA forward and autograd backward; with and without a synchronize between calls (the default memory
pool returns freed memory to the OS at a synchronization, so the next allocation maps it again).
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.dlpack import to_dlpack

import flash4
import flash4._torch_ops  # noqa: F401  (registers torch.ops.flash4 now: flash4 does it at its first torch call)
from flash4._native import _C


def per_call_us(fn, calls, sync_every):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn()
        if sync_every and i % sync_every == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    b, s, h, d = 1, 128, 2, 64
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = torch.ops.flash4.fwd(q, k, v, d**-0.5, True, -1, 0, 0.0, False)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    stream = torch.cuda.current_stream().cuda_stream
    caps_fwd = [to_dlpack(t) for t in (q, k, v, out, lse)]

    def c_forward():
        _C.forward(*(to_dlpack(t) for t in (q, k, v, out, lse)), d**-0.5, True, -1, 0, 0.0, stream)

    def c_backward():
        _C.backward(*(to_dlpack(t) for t in (dout, q, k, v, out, lse, dq, dk, dv)), d**-0.5, True, -1, 0, 0.0, False,
                    stream)

    def op_fwd():
        torch.ops.flash4.fwd(q, k, v, d**-0.5, True, -1, 0, 0.0, False)

    def op_bwd():
        torch.ops.flash4.bwd(dout, q, k, v, out, lse, d**-0.5, True, -1, 0, 0.0, False)

    def flash4_fwd_bwd():
        o = flash4.flash_attn_func(qg, kg, vg, causal=True)
        torch.autograd.grad(o, (qg, kg, vg), dout)

    def sdpa_fwd_bwd():
        o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2), is_causal=True)
        torch.autograd.grad(o, (qg, kg, vg), dout.transpose(1, 2))

    def dlpack_only():
        for t in (dout, q, k, v, out, lse, dq, dk, dv):
            to_dlpack(t)

    del caps_fwd
    rows = [("to_dlpack x9", dlpack_only), ("_C.forward", c_forward), ("_C.backward", c_backward),
            ("torch.ops.flash4.fwd", op_fwd), ("torch.ops.flash4.bwd", op_bwd),
            ("flash4 fwd+bwd (autograd)", flash4_fwd_bwd), ("SDPA fwd+bwd (autograd)", sdpa_fwd_bwd)]
    print(f"{'host us per call':<28} {'no sync':>9} {'sync every 10':>14}")
    for name, fn in rows:
        print(f"{name:<28} {per_call_us(fn, args.calls, 0):9.1f} {per_call_us(fn, args.calls // 4, 10):14.1f}",
              flush=True)


if __name__ == "__main__":
    main()
