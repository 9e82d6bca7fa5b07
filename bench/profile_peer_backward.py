#!/usr/bin/env python3
"""--warmup + 1 backward passes of one implementation at one shape, for Nsight Compute to profile flash4 and its
peers (FA4, cuDNN) at the same shape with the same sections. Both flash4 and FA4 launch three kernels per backward
whose names match "bwd" or "backward" (preprocess, main kernel, postprocess), so the last pass is

    ncu -k 'regex:(?i)bwd|backward' -s 9 -c 3 --section ... python3 bench/profile_peer_backward.py --impl fa4 --d 128

(an NVTX range would not do: autograd runs the backward on its own thread). The protocol's shapes: batch x seqlen =
16k tokens, heads x head_dim = 2048, bf16. FA4 compiles its kernels during the warm-up passes.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_impls import load_impls, parse_impls  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", default="flash4", help="one name: the launch count above assumes one implementation")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    if "," in args.impl:
        raise SystemExit("--impl: expected one implementation (the ncu launch count assumes one), got " + args.impl)
    fns, versions = load_impls(parse_impls(args.impl), lambda m: print(m, file=sys.stderr))
    print(versions, file=sys.stderr)
    b, h, s, d = max(1, 16384 // args.s), 2048 // args.d, args.s, args.d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    for name, fwd in fns.items():
        out = fwd(q, k, v, args.causal)
        for _ in range(args.warmup):
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
        print(f"{name}: d {d} s {s} causal {args.causal} done", file=sys.stderr)


if __name__ == "__main__":
    main()
