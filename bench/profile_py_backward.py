#!/usr/bin/env python3
"""Where the time of flash4's backward goes when called through PyTorch autograd: torch.profiler's per-kernel
CUDA times of forward + backward for one shape (flash4 and cuDNN), to compare with flash4_bench's C++ timing.

    python3 bench/profile_py_backward.py [--d 128] [--s 8192] [--causal] [--iters 10]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flash4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    b, h, s, d = 16384 // args.s, 2048 // args.d, args.s, args.d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)

    def run(impl):
        if impl == "flash4":
            out = flash4.flash_attn_func(q, k, v, causal=args.causal)
        else:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=args.causal).transpose(1, 2)
        out.backward(dout)

    for impl in ("flash4", "cudnn"):
        for _ in range(3):
            run(impl)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                run(impl)
            torch.cuda.synchronize()
        print(f"== {impl} d={d} s={s} causal={args.causal}: CUDA kernel time per call (us)")
        for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]:
            print(f"{e.device_time_total / args.iters:10.1f}  x{e.count // args.iters:<3} {e.key[:110]}")


if __name__ == "__main__":
    main()
