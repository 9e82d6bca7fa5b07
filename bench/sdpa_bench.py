#!/usr/bin/env python3
"""Times attention implementations in one process on the benchmark shapes of facts.md: PyTorch SDPA backends
(cuDNN, FA2 = PyTorch's flash backend), flash4 when its Python package is importable, and FlashAttention-4
(`fa4`: the flash-attn-4 package's CuTe-DSL kernels) when `flash_attn.cute` is importable; --impls chooses
(bench/attention_impls.py). Same protocol as flash4_bench: bf16, total tokens 16k, heads*d = 2048 (heads = 2048 / d
rounded where d does not divide it: 21 at d = 96, 11 at d = 192), CUDA events
around each call (calls issued back to back, one sync at the end), warm-up, median of N runs, input sets rotated
past L2. With --rounds R every shape is timed R times per implementation, the implementations in a rotated order
each round (so clock and power drift hit all alike), and the record's ms is the median of the R round medians
(all of them in ms_rounds). Each timing starts from the implementation's own steady state (--warm-ms of warm-up
calls): the GPU runs at its power cap, and the clock a kernel starts from depends on what ran before it.
Before timing, every implementation's result on each shape is checked on NaN-poisoned outputs against an fp64
reference (bench/output_check.py); one that fails gets an error record instead of a timing.
Prints one JSON object per line: first {"meta": {...}} (library versions, GPU), then one record per
(shape, implementation). --backward times forward+backward (torch.autograd.grad) minus forward, or with
--bwd-method grad-only the backward alone on kept forward graphs. --single adds ms_single: one synchronized call
at a time (host cost included), the latency a caller that waits for each call sees."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_impls import parse_impls  # noqa: E402  (torch-free: argument errors need no GPU)


def median_ms(fn, iters, sets, warm_ms=0.0):
    """Median per-call GPU time: calls are issued back to back (the CPU runs ahead, as in a training loop), each
    bracketed by its own pair of events, with one synchronization at the end. Warm-up: 3 calls, and at least
    warm_ms of wall time of this same call: the H200 runs these kernels at its 700 W cap with the SM clock moving
    between ~1650 and 1980 MHz, so a call timed right after a lighter one would start from a higher clock."""
    import torch
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


def single_call_ms(fn, iters, sets):
    """Median time of one call issued on an idle GPU and waited for (events around it, a synchronization before
    and after): the host's launch cost is inside, as for a caller that waits for each result."""
    import torch
    times = []
    for i in range(iters):
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i % sets)
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def heads_for(d):
    """Heads of the protocol's 2048-wide model at head dim d: 2048 / d, rounded where d does not divide it."""
    return max(1, (2048 + d // 2) // d)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split(";")[0] + ".")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    # Steady state before timing (see median_ms); 0 = a 3-call warm-up.
    ap.add_argument("--warm-ms", type=float, default=150.0)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--dims", default="64,128,256")
    # v's (and out's) head dim where it differs from q / k's (e.g. 128 with --dims 192: DeepSeek's MLA); FLOPs
    # 2 b h s^2 (d + dv) forward, 2.5x that backward.
    ap.add_argument("--dv", type=int, default=0)
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--impls", default="cudnn,fa2,flash4",
                    help="comma-separated, timed in this (rotated) order: flash4, flash4_deterministic, "
                         "flash4_vpad (v zero-padded to q's width), fa4, "
                         "cudnn, fa2; the optional packages (flash4, fa4) are left out with a note when they do "
                         "not import")
    # subtract: median(forward + autograd.grad) - median(forward) (noisy below 2k: two medians);
    # grad-only: one forward per input set kept, then only autograd.grad(..., retain_graph=True) timed.
    ap.add_argument("--bwd-method", choices=("subtract", "grad-only"), default="subtract")
    ap.add_argument("--single", action="store_true", help="also time single synchronized calls (ms_single)")
    return ap


def parse_args(argv=None):
    """Parsed and validated arguments; errors name the argument and what was expected."""
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args.impls = parse_impls(args.impls)
        args.dims = [int(x) for x in args.dims.split(",")]
        args.seqlens = [int(x) for x in args.seqlens.split(",")]
    except ValueError as e:
        ap.error(str(e) if str(e).startswith("--") else f"--dims / --seqlens: expected comma-separated integers ({e})")
    for d in args.dims:
        if d <= 0 or d > 256 or d % 8:
            ap.error(f"--dims: expected head dims that are multiples of 8 in [8, 256] (heads = 2048 / d, rounded), "
                     f"got {d}")
    for s in args.seqlens:
        if s <= 0 or 16384 % s:
            ap.error(f"--seqlens: expected lengths that divide 16384 (batch * seqlen = 16k tokens), got {s}")
    if args.dv < 0 or args.dv > 256 or args.dv % 8:
        ap.error(f"--dv: expected 0 (v as wide as q) or a multiple of 8 in [8, 256], got {args.dv}")
    if args.iters < 1 or args.rounds < 1:
        ap.error(f"--iters and --rounds: expected >= 1, got {args.iters} and {args.rounds}")
    return args


def main():
    args = parse_args()
    import torch
    from attention_impls import load_impls
    from output_check import check_impl

    fns, versions = load_impls(args.impls, lambda msg: print(f"# {msg}", file=sys.stderr))
    impls = list(fns)
    if not impls:
        sys.exit("nothing to time: none of --impls imports (see the notes above)")
    versions["gpu"] = torch.cuda.get_device_name()
    print(json.dumps({"meta": versions}), flush=True)
    for d in args.dims:
        for s in args.seqlens:
            for causal in (False, True):
                b, h = 16384 // s, heads_for(d)
                dv = args.dv or d
                set_bytes = 2 * b * s * h * (d + dv) * 2
                sets = max(1, (200 << 20) // set_bytes + 1)
                gen = torch.Generator(device="cuda").manual_seed(0)
                inputs = []
                for _ in range(sets):
                    q, k, v = (torch.randn(b, s, h, w, device="cuda", dtype=torch.bfloat16, generator=gen,
                                           requires_grad=args.backward) for w in (d, d, dv))
                    dout = torch.randn(b, s, h, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
                    inputs.append((q, k, v, dout))
                flops = 2.0 * b * h * s * s * (d + dv) / (2 if causal else 1) * (2.5 if args.backward else 1)

                def measure(impl):
                    """(median ms, single-call ms or None) of this shape's pass."""
                    attn = fns[impl]

                    def fwd(i):
                        q, k, v, _ = inputs[i]
                        return attn(q, k, v, causal)

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

                        return (median_ms(bwd_only, args.iters, sets, args.warm_ms),
                                single_call_ms(bwd_only, args.iters, sets) if args.single else None)
                    if args.backward:
                        return (median_ms(fwd_bwd, args.iters, sets, args.warm_ms)
                                - median_ms(fwd, args.iters, sets, args.warm_ms),
                                single_call_ms(fwd_bwd, args.iters, sets) - single_call_ms(fwd, args.iters, sets)
                                if args.single else None)
                    with torch.no_grad():
                        return (median_ms(fwd, args.iters, sets, args.warm_ms),
                                single_call_ms(fwd, args.iters, sets) if args.single else None)

                times = {impl: [] for impl in impls}
                singles = {impl: [] for impl in impls}
                errors = {}
                for impl in impls:
                    try:
                        q, k, v, dout = inputs[0]
                        why = check_impl(fns[impl], q, k, v, dout if args.backward else None, causal)
                        if why:
                            errors[impl] = "check failed: " + why
                    except Exception as e:
                        errors[impl] = f"{type(e).__name__}: {str(e)[:200]}"
                for r in range(args.rounds):
                    # Rotated, and reversed every other round, so that each implementation follows the others.
                    order = impls[r % len(impls):] + impls[:r % len(impls)]
                    for impl in (order if r % 2 == 0 else order[::-1]):
                        if impl in errors:
                            continue
                        try:
                            ms, ms_single = measure(impl)
                            times[impl].append(ms)
                            if ms_single is not None:
                                singles[impl].append(ms_single)
                        except Exception as e:
                            errors[impl] = f"{type(e).__name__}: {str(e)[:200]}"
                for impl in impls:
                    rec = dict(impl=impl, b=b, s=s, h=h, d=d, causal=causal)
                    if dv != d:
                        rec["dv"] = dv
                    if impl == "fa4":
                        rec["version"] = versions.get("flash_attn_4")
                    if impl in errors:
                        rec["error"] = errors[impl]
                    else:
                        ms = sorted(times[impl])[len(times[impl]) // 2]
                        rec.update(ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1),
                                   pass_="backward" if args.backward else "forward",
                                   ms_rounds=[round(t, 4) for t in times[impl]])
                        if singles[impl]:
                            rec["ms_single"] = round(sorted(singles[impl])[len(singles[impl]) // 2], 4)
                    print(json.dumps(rec), flush=True)
                del inputs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
