#!/usr/bin/env python3
"""The Python layer's own host time per call: flash_attn_func forward (inputs that require grad, and inputs
that do not: inference), and forward + backward through autograd, and a flash_attn_with_kvcache decode step,
with the native calls (_C.forward / _C.backward / _C.forward_kvcache) replaced by no-ops, beside a bare
torch.autograd.Function that only allocates the same outputs (the floor any Python autograd path pays). Runs on
any machine (CPU tensors, or CUDA ones with --device cuda); what it measures is the wrapper's argument handling,
not the kernels.

    python3 bench/python_host_path.py [--device cpu] [--calls 5000]
"""
import argparse
import json
import timeit

import torch

import flash4
from flash4 import _torch_kvcache, _torch_ops


class _NoNative:
    """Stands in for the extension: accepts the calls, does nothing."""

    def forward(self, *args, **kwargs):
        pass

    def backward(self, *args, **kwargs):
        pass

    def forward_kvcache(self, *args, **kwargs):
        pass


class _Floor(torch.autograd.Function):
    """out, lse allocated in the forward and dq, dk, dv in the backward, nothing else."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def best_us(fn, calls, repeats=7):
    fn()
    return min(timeit.repeat(fn, number=calls, repeat=repeats)) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    _torch_ops._C = _torch_kvcache._C = _NoNative()
    make = lambda: torch.randn(1, 128, 2, 64, device=args.device, dtype=torch.bfloat16,  # noqa: E731
                               requires_grad=True)
    q, k, v = make(), make(), make()
    q0, k0, v0 = (x.detach() for x in (q, k, v))
    dout = torch.randn_like(q)
    # A decode step: 8 sequences, GQA 32 / 8, d = 128, int32 cache lengths.
    q1 = torch.randn(8, 1, 32, 128, device=args.device, dtype=torch.bfloat16)
    k_cache = torch.randn(8, 1024, 8, 128, device=args.device, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    cache_seqlens = torch.full((8,), 1000, device=args.device, dtype=torch.int32)
    rows = {
        "flash4 forward": lambda: flash4.flash_attn_func(q, k, v, causal=True),
        "flash4 forward, inputs without grad (inference)": lambda: flash4.flash_attn_func(q0, k0, v0, causal=True),
        "flash4 forward + backward": lambda: flash4.flash_attn_func(q, k, v, causal=True).backward(dout),
        "flash4 with_kvcache decode step": lambda: flash4.flash_attn_with_kvcache(q1, k_cache, v_cache,
                                                                                 cache_seqlens=cache_seqlens),
        "floor forward": lambda: _Floor.apply(q, k, v),
        "floor forward + backward": lambda: _Floor.apply(q, k, v)[0].backward(dout),
    }
    for name, fn in rows.items():
        print(json.dumps({"what": name, "device": args.device, "us_per_call": round(best_us(fn, args.calls), 2)}))


if __name__ == "__main__":
    main()
