#!/usr/bin/env python3
"""Where a training step's time goes, flash4 vs SDPA: the small causal transformer of
tests/python/train_compare.py, profiled over a few steps with torch.profiler. Per step: wall time, the sum of
CUDA kernel times (GPU busy), the rest (GPU idle: launch overhead, host work, allocations), the top kernels and
the CUDA runtime calls on the host.

    python3 bench/profile_train_step.py [--steps 10] [--warmup 10] [train_compare model options, e.g. --seqlen 1024]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import train_compare as tc  # noqa: E402  (the model and data of the training comparison)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="profiled steps")
    ap.add_argument("--warmup", type=int, default=10, help="steps before profiling")
    own, rest = ap.parse_known_args()
    args = tc.parse_args(rest)  # the model and data options (--layers, --dim, --seqlen, ...) of train_compare
    args.steps, args.warmup = own.steps, own.warmup
    device = torch.device("cuda")
    data = tc.CopyMarkovData(args.vocab, args.seqlen, args.batch, 0, device)
    batches = [data.batch_for(i) for i in range(args.warmup + args.steps)]

    for name in ("flash4", "sdpa"):
        torch.manual_seed(0)
        model = tc.TinyGPT(args.vocab, args.dim, args.heads, args.layers, args.seqlen, tc.ATTENTION[name]).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

        def step(i):
            inputs, targets = batches[i]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(inputs)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), targets.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()  # as train_compare does (it reads the loss every step)

        for i in range(args.warmup):
            step(i)
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(args.warmup, args.warmup + args.steps):
                step(i)
        wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
        events = prof.key_averages()
        gpu_ms = sum(e.self_device_time_total for e in events) / 1e3 / args.steps
        print(f"== {name}: {wall_ms:.2f} ms/step wall (profiled), {gpu_ms:.2f} ms CUDA kernels+memcpy/memset, "
              f"{wall_ms - gpu_ms:.2f} ms GPU idle")
        print("   top device time per step (us):")
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:14]:
            if e.self_device_time_total <= 0:
                break
            print(f"   {e.self_device_time_total / args.steps:9.1f}  x{e.count // args.steps:<4} {e.key[:100]}")
        print("   host: CUDA runtime calls and flash4 ops per step (us, count):")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total):
            if e.key.startswith(("cuda", "flash4")) or "Malloc" in e.key or "Free" in e.key:
                print(f"   {e.self_cpu_time_total / args.steps:9.1f}  x{e.count // args.steps:<4} {e.key[:100]}")


if __name__ == "__main__":
    main()
