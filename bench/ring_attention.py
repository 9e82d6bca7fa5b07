#!/usr/bin/env python3
"""Context parallelism (flash4.distributed.ring_flash_attn_func) on NCCL: weak scaling and the 1-rank overhead.

Weak scaling: every GPU holds --tokens-per-gpu tokens (default 32k) of one sequence of W x that many tokens,
bf16, head dim 128, causal, zigzag layout; forward + backward (torch.autograd.grad) timed with CUDA events,
median over --iters calls. Reports TFLOP/s per GPU (FlashAttention's FLOP count of the whole sequence's
attention divided by W) next to the 1-GPU kernel's TFLOP/s (flash4.flash_attn_func on one GPU's tokens alone,
the same per-GPU memory), and their ratio: the share of the kernel's speed the ring keeps.

    torchrun --nproc_per_node=8 bench/ring_attention.py                # weak scaling on 8 GPUs
    torchrun --nproc_per_node=1 bench/ring_attention.py --tokens-per-gpu 16384   # 1 rank: ring vs plain call

With one rank the ring is the plain call (no communication), and the ratio is the ring's overhead (target:
within 3 %). Rank 0 prints one JSON object per configuration; --out FILE also appends it there.
--device cpu runs the same on CPU processes with gloo (fp32, wall-clock timing): a smoke test of this script.
"""
import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

import flash4
import flash4.distributed as f4d


def attention_flops(batch, heads, seqlen, head_dim, causal, backward):
    """FlashAttention's count: 4 b h s^2 d for the forward (halved by a causal mask), x 3.5 with the backward."""
    fwd = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return fwd * (3.5 if backward else 1.0)


def median_ms(fn, iters, warmup, device):
    """Median milliseconds per call: CUDA events around each call (issued back to back, one synchronization at
    the end); on the CPU the wall clock."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[len(times) // 2]
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn()
        stops[i].record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(starts, stops))
    return times[len(times) // 2]


def fwd_bwd(attend, q, k, v, dout, backward):
    def step():
        out = attend(q, k, v)
        if backward:
            torch.autograd.grad(out, (q, k, v), dout)
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens-per-gpu", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", type=int, default=0, help="0 = --heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--layout", choices=f4d.LAYOUTS, default="zigzag")
    ap.add_argument("--forward-only", dest="backward", action="store_false")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(minutes=5)
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        dtype = torch.bfloat16
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
        dtype = torch.float32
    rank, world = dist.get_rank(), dist.get_world_size()
    heads_kv = args.heads_kv or args.heads
    tokens = args.tokens_per_gpu
    g = torch.Generator(device=device).manual_seed(1234 + rank)

    def randn(heads):
        return torch.randn(args.batch, tokens, heads, args.head_dim, generator=g, device=device,
                           dtype=dtype).requires_grad_()

    q, k, v = randn(args.heads), randn(heads_kv), randn(heads_kv)
    dout = torch.randn_like(q)

    def ring(q, k, v):
        return f4d.ring_flash_attn_func(q, k, v, causal=args.causal, layout=args.layout)

    def plain(q, k, v):
        return flash4.flash_attn_func(q, k, v, causal=args.causal)

    dist.barrier()
    ring_ms = median_ms(fwd_bwd(ring, q, k, v, dout, args.backward), args.iters, args.warmup, device)
    dist.barrier()
    # The 1-GPU kernel on this GPU's tokens alone (every rank runs it; rank 0 reports its own).
    plain_ms = median_ms(fwd_bwd(plain, q, k, v, dout, args.backward), args.iters, args.warmup, device)
    # The slowest rank sets the ring's time.
    slowest = torch.tensor([ring_ms], device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    ring_ms = float(slowest)
    ring_flops = attention_flops(args.batch, args.heads, world * tokens, args.head_dim, args.causal, args.backward)
    plain_flops = attention_flops(args.batch, args.heads, tokens, args.head_dim, args.causal, args.backward)
    ring_tflops = ring_flops / world / ring_ms / 1e9
    plain_tflops = plain_flops / plain_ms / 1e9
    if rank == 0:
        record = dict(
            bench="ring_attention", gpus=world,
            gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", dtype=str(dtype)[6:],
            tokens_per_gpu=tokens, seqlen=world * tokens, batch=args.batch, heads=args.heads, heads_kv=heads_kv,
            head_dim=args.head_dim, causal=args.causal, layout=args.layout,
            pass_="forward+backward" if args.backward else "forward", ring_ms=round(ring_ms, 3),
            ring_tflops_per_gpu=float(f"{ring_tflops:.4g}"), one_gpu_ms=round(plain_ms, 3),
            one_gpu_tflops=float(f"{plain_tflops:.4g}"), ratio=round(ring_tflops / plain_tflops, 4),
            flash4_commit=os.environ.get("FLASH4_COMMIT", ""),
        )
        line = json.dumps(record)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
