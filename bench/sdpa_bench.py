#!/usr/bin/env python3
"""Times PyTorch SDPA backends (cuDNN, FA2 = PyTorch's flash backend) on the benchmark shapes of facts.md, and
flash4 in the same process when the flash4 Python package is importable. Same protocol as flash4_bench:
bf16, total tokens 16k, heads*d = 2048, CUDA events around each call (calls issued back to back, one sync at
the end), warm-up, median of N runs, input sets rotated past L2. With --rounds R every shape is timed R times per
implementation, the implementations in a rotated order each round (so clock and power drift hit all alike), and
the record's ms is the median of the R round medians (all of them in ms_rounds). Each timing starts from the
implementation's own steady state (--warm-ms of warm-up calls): the GPU runs at its power cap, and the clock a
kernel starts from depends on what ran before it.
Prints one JSON object per line; --backward times forward+backward (torch.autograd.grad) minus forward, or with
--bwd-method grad-only the backward alone on kept forward graphs."""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, iters, sets, warm_ms=0.0):
    """Median per-call GPU time: calls are issued back to back (the CPU runs ahead, as in a training loop), each
    bracketed by its own pair of events, with one synchronization at the end. Warm-up: 3 calls, and at least
    warm_ms of wall time of this same call: the H200 runs these kernels at its 700 W cap with the SM clock moving
    between ~1650 and 1980 MHz, so a call timed right after a lighter one would start from a higher clock."""
    t0 = time.perf_counter()
    i = 0
    while i < 3 or (time.perf_counter() - t0) * 1e3 < warm_ms:
        fn(i % sets)
        i += 1
        if i % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i % sets)
        stops[i].record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(starts, stops))
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    # Steady state before timing (see median_ms); 0 = a 3-call warm-up.
    ap.add_argument("--warm-ms", type=float, default=150.0)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--impls", default="cudnn,fa2,flash4")
    # subtract: median(forward + autograd.grad) - median(forward) (noisy below 2k: two medians);
    # grad-only: one forward per input set kept, then only autograd.grad(..., retain_graph=True) timed.
    ap.add_argument("--bwd-method", choices=("subtract", "grad-only"), default="subtract")
    args = ap.parse_args()
    try:
        import flash4  # noqa: F401
        have_flash4 = True
    except Exception as e:  # the package is optional here
        print(f"# flash4 python package not importable: {e}", file=sys.stderr)
        have_flash4 = False

    impls = [i for i in args.impls.split(",") if have_flash4 or not i.startswith("flash4")]
    if not impls:
        sys.exit("nothing to time: --impls names only flash4 implementations and the package is not importable")
    for d in [int(x) for x in args.dims.split(",")]:
        for s in [int(x) for x in args.seqlens.split(",")]:
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                set_bytes = 4 * b * s * h * d * 2
                sets = max(1, (200 << 20) // set_bytes + 1)
                gen = torch.Generator(device="cuda").manual_seed(0)
                inputs = []
                for _ in range(sets):
                    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen,
                                           requires_grad=args.backward) for _ in range(3))
                    inputs.append((q, k, v, torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)))
                flops = 4.0 * b * h * s * s * d / (2 if causal else 1) * (2.5 if args.backward else 1)
                def measure(impl):
                    def fwd(i):
                        q, k, v, _ = inputs[i]
                        if impl.startswith("flash4"):  # flash4, flash4_deterministic
                            return flash4.flash_attn_func(q, k, v, causal=causal,
                                                          deterministic=impl == "flash4_deterministic")
                        backend = SDPBackend.CUDNN_ATTENTION if impl == "cudnn" else SDPBackend.FLASH_ATTENTION
                        with sdpa_kernel(backend):
                            # SDPA wants (b, h, s, d); transposes are views.
                            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                  v.transpose(1, 2), is_causal=causal).transpose(1, 2)

                    def fwd_bwd(i):
                        # autograd.grad, not backward(): no accumulation into .grad (three extra elementwise
                        # adds per call that are not the attention backward's work).
                        q, k, v, dout = inputs[i]
                        torch.autograd.grad(fwd(i), (q, k, v), dout)

                    if args.backward and args.bwd_method == "grad-only":
                        outs = [fwd(i) for i in range(sets)]

                        def bwd_only(i):
                            q, k, v, dout = inputs[i]
                            torch.autograd.grad(outs[i], (q, k, v), dout, retain_graph=True)

                        return median_ms(bwd_only, args.iters, sets, args.warm_ms)
                    if args.backward:
                        return (median_ms(fwd_bwd, args.iters, sets, args.warm_ms)
                                - median_ms(fwd, args.iters, sets, args.warm_ms))
                    with torch.no_grad():
                        return median_ms(fwd, args.iters, sets, args.warm_ms)

                times = {impl: [] for impl in impls}
                errors = {}
                for r in range(args.rounds):
                    # Rotated, and reversed every other round, so that each implementation follows the others.
                    order = impls[r % len(impls):] + impls[:r % len(impls)]
                    for impl in (order if r % 2 == 0 else order[::-1]):
                        if impl in errors:
                            continue
                        try:
                            times[impl].append(measure(impl))
                        except Exception as e:
                            errors[impl] = str(e)[:200]
                for impl in impls:
                    if impl in errors:
                        rec = dict(impl=impl, b=b, s=s, h=h, d=d, causal=causal, error=errors[impl])
                    else:
                        ms = sorted(times[impl])[len(times[impl]) // 2]
                        rec = dict(impl=impl, b=b, s=s, h=h, d=d, causal=causal, ms=round(ms, 4),
                                   tflops=round(flops / ms / 1e9, 1), pass_="backward" if args.backward else "forward",
                                   ms_rounds=[round(t, 4) for t in times[impl]])
                    print(json.dumps(rec), flush=True)
                del inputs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
