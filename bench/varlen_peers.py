#!/usr/bin/env python3
"""Packed (variable-length) batches in one process: flash4's flash_attn_varlen_func without and with a learnable
sink (`flash4`, `flash4_sink`), FlashAttention-4's varlen kernels (`fa4`, `fa4_sink`: flash_attn.cute's
flash_attn_varlen_func from the flash-attn-4 package, left out with a note when it does not import), and the dense
batch of the same FLOPs through flash4's flash_attn_func (`flash4_dense`) and cuDNN (`cudnn_dense`, torch SDPA).

Shapes as `flash4_bench --varlen` (bench/varlen_bench.cuh): --tokens (16k) tokens in sequences whose lengths come
from --min-len..--max-len (128..4096) by the same linear congruential sequence and seed, the last cut to fit;
heads = 2048 / d, heads_kv = heads / --gqa, bf16, standard normal inputs, causal (bottom-right) and not. The dense
batch is n sequences of the lengths' root-mean-square, rounded to a multiple of 8. FLOPs: forward
4 * sum(L_q * L_k) * d * heads, half under causal (as Packed::flops; L_q = L_k here); backward 2.5x the forward.
Timing: sdpa_bench.median_ms (CUDA events around each call, calls issued back to back, --warm-ms of warm-up
first), the median of --iters calls, rotating input sets that together exceed --rotate-mb (past L2). The forward
runs under no_grad; the backward is torch.autograd.grad(..., retain_graph=True) alone on one kept forward graph per
input set (gradients of q, k, v and the sink where there is one), so no forward time is subtracted. Each
(pass, d, mask) is timed --rounds times, the implementations rotated and reversed every other round; a record's ms
is the median of its round medians. Before timing, per (d, mask): flash4 vs FA4 outputs (also with the sink) and
flash4's packed output on the first sequence vs flash4 dense on that sequence alone, max abs diff printed, a warning
above 2e-2; an implementation that raises there gets an error record instead of timings.
stdout: one JSON line per (impl, pass, d, causal); stderr: notes, checks and a summary table (TFLOP/s; flash4/FA4
and packed/dense as TFLOP/s ratios; sink cost as time with the sink / time without). --out FILE writes one JSON
document (date, GPU, versions, lengths, checks, rows). --device cpu --smoke runs all of it on a tiny batch on the
CPU, timed by the wall clock."""
import argparse
import datetime
import json
import math
import os
import sys
import time
from collections import namedtuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdpa_bench import heads_for, median_ms  # noqa: E402

IMPL_NAMES = ("flash4", "flash4_sink", "fa4", "fa4_sink", "flash4_dense", "cudnn_dense")
# batch: the input sets it takes ("packed" or "dense"); sink: whether the sink is an input (and a gradient).
Impl = namedtuple("Impl", "batch sink fn")
Inputs = namedtuple("Inputs", "q k v dout sink cu max_len")
WARN_DIFF = 2e-2


def draw_lengths(seed, total, lo, hi):
    """Lengths in lo..hi from varlen_bench.cuh's linear congruential sequence until `total` tokens, the last one
    cut to fit (seed 2026 with 16384, 128, 4096 gives flash4_bench --varlen's lengths)."""
    lens = []
    while sum(lens) < total:
        seed = (seed * 1664525 + 1013904223) & 0xFFFFFFFF
        lens.append(min(lo + (seed >> 8) % (hi - lo + 1), total - sum(lens)))
    return lens


def rms_length(lens):
    """Root-mean-square length rounded half up to a multiple of 8 (at least 8), as varlen_bench.cuh's lround."""
    return max(8, int(math.floor(math.sqrt(sum(n * n for n in lens) / len(lens)) / 8 + 0.5)) * 8)


def attention_flops(lens, heads, d, causal, backward):
    """Matmul FLOPs of self-attention over sequences of these lengths (L_q = L_k = L each)."""
    flops = sum(4.0 * n * n * d * heads for n in lens) / (2 if causal else 1)
    return flops * (2.5 if backward else 1)


def first(result):
    """The output of a call that returns out or (out, lse, ...)."""
    return result[0] if isinstance(result, (tuple, list)) else result


def build_impls(names, flash4, fa4_varlen, dense_fns):
    """{name: Impl} for the requested names that can run; fa4_varlen None = FA4 absent."""
    def flash4_packed(with_sink):
        return lambda x, causal: flash4.flash_attn_varlen_func(
            x.q, x.k, x.v, x.cu, x.cu, x.max_len, x.max_len, causal=causal,
            learnable_sink=x.sink if with_sink else None)

    def fa4_packed(with_sink):
        # Keywords only: flash-attn-4 4.0 put qv before cu_seqlens_q, so the positions differ between releases.
        # The sink is flash4's float32 one: 4.0 takes float16, bfloat16 or float32 (earlier releases bfloat16 only).
        return lambda x, causal: first(fa4_varlen(
            x.q, x.k, x.v, cu_seqlens_q=x.cu, cu_seqlens_k=x.cu, max_seqlen_q=x.max_len, max_seqlen_k=x.max_len,
            causal=causal, learnable_sink=x.sink if with_sink else None))

    table = {"flash4": Impl("packed", False, flash4_packed(False)),
             "flash4_sink": Impl("packed", True, flash4_packed(True))}
    if fa4_varlen is not None:
        table.update(fa4=Impl("packed", False, fa4_packed(False)), fa4_sink=Impl("packed", True, fa4_packed(True)))
    for name, key in (("flash4_dense", "flash4"), ("cudnn_dense", "cudnn")):
        if key in dense_fns:
            table[name] = Impl("dense", False, lambda x, causal, f=dense_fns[key]: f(x.q, x.k, x.v, causal))
    return {n: table[n] for n in names if n in table}


def make_sets(q_shape, kv_shape, heads, device, gen, rotate_bytes, cu=None, max_len=None):
    """Input sets (standard normal bf16 q, k, v, dout; float32 sink), enough of them to exceed rotate_bytes."""
    import torch
    numel = math.prod(q_shape) * 2 + math.prod(kv_shape) * 2
    sets = []
    for _ in range(max(1, rotate_bytes // (2 * numel) + 1)):
        q, k, v = (torch.randn(s, device=device, dtype=torch.bfloat16, generator=gen, requires_grad=True)
                   for s in (q_shape, kv_shape, kv_shape))
        dout = torch.randn(q_shape, device=device, dtype=torch.bfloat16, generator=gen)
        sink = torch.randn(heads, device=device, dtype=torch.float32, generator=gen).requires_grad_()
        sets.append(Inputs(q, k, v, dout, sink, cu, max_len))
    return sets


def wall_median_ms(fn, iters, sets, warm_ms=0.0):
    """The CPU's stand-in for median_ms: one warm-up call, then the wall time of each call, median."""
    fn(0)
    times = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn(i % sets)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def measure(impl, sets, causal, backward, timer, args):
    """Median ms of one pass of impl over the rotated input sets."""
    import torch
    if not backward:
        with torch.no_grad():
            return timer(lambda i: impl.fn(sets[i], causal), args.iters, len(sets), args.warm_ms)
    outs = [impl.fn(x, causal) for x in sets]

    def bwd(i):
        x = sets[i]
        # autograd.grad, not backward(): no accumulation into .grad, which is not the attention backward's work.
        torch.autograd.grad(outs[i], (x.q, x.k, x.v) + ((x.sink,) if impl.sink else ()), x.dout, retain_graph=True)
    return timer(bwd, args.iters, len(sets), args.warm_ms)


def run_checks(impls, flash4, x, causal, log):
    """(check records, {impl: error}) for one packed set: FA4 against flash4, and flash4 packed against flash4
    dense on the first sequence alone."""
    import torch
    outs, errors, records = {}, {}, []
    with torch.no_grad():
        for name in ("flash4", "flash4_sink", "fa4", "fa4_sink"):
            if name in impls:
                try:
                    outs[name] = impls[name].fn(x, causal).float()
                except Exception as e:
                    errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
        end = int(x.cu[1])
        first_seq = [t[:end].unsqueeze(0) for t in (x.q, x.k, x.v)]  # the first sequence as a batch of one
        for ours, theirs, sink in (("flash4", "fa4", False), ("flash4_sink", "fa4_sink", True)):
            pairs = [(f"{ours} vs {theirs}", outs.get(ours), outs.get(theirs))]
            if ours in outs:
                dense = flash4.flash_attn_func(*first_seq, causal=causal,
                                               learnable_sink=x.sink if sink else None)
                pairs.append((f"{ours} first sequence vs flash4 dense", outs[ours][:end], dense[0].float()))
            for what, a, b in pairs:
                if a is not None and b is not None:
                    diff = (a - b).abs().max().item()
                    records.append(dict(check=what, causal=causal, max_abs_diff=diff))
                    log(f"{'WARNING ' if not diff <= WARN_DIFF else ''}check d={x.q.shape[-1]} causal={causal} "
                        f"{what}: max abs diff {diff:.3g}")
    return records, errors


def summary(rows, log):
    """The table on stderr: TFLOP/s per implementation and the ratios of the module docstring."""
    by, names = {}, []
    for r in rows:
        by.setdefault((r["pass"], r["d"], r["causal"]), {})[r["impl"]] = r
        names += [r["impl"]] if r["impl"] not in names else []

    def ratio(cell, a, b, key):
        ra, rb = cell.get(a, {}), cell.get(b, {})
        return f"{ra[key] / rb[key]:.3f}" if key in ra and key in rb and rb[key] else "-"
    log(f"{'pass':<9}{'d':>3}  {'causal':<6} " + "".join(f"{n:>13}" for n in names)
        + f"{'f4/fa4':>9}{'pack/dense':>11}{'sink f4':>9}{'sink fa4':>9}")
    for (pass_, d, causal), cell in by.items():
        log(f"{pass_:<9}{d:>3}  {str(causal):<6} " + "".join(f"{cell.get(n, {}).get('tflops', '-'):>13}" for n in names)
            + f"{ratio(cell, 'flash4', 'fa4', 'tflops'):>9}{ratio(cell, 'flash4', 'flash4_dense', 'tflops'):>11}"
            + f"{ratio(cell, 'flash4_sink', 'flash4', 'ms'):>9}{ratio(cell, 'fa4_sink', 'fa4', 'ms'):>9}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--gqa", type=int, default=1, help="query heads per key/value head")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-ms", type=float, default=150.0, help="warm-up wall time per timing (sdpa_bench)")
    ap.add_argument("--impls", default=",".join(IMPL_NAMES), help="comma-separated subset of " + ",".join(IMPL_NAMES))
    ap.add_argument("--passes", default="forward,backward")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--min-len", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--rotate-mb", type=int, default=200, help="input sets rotated until they exceed this")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes for testing: 256 tokens, d 64, 2 iters")
    ap.add_argument("--out", help="also write one JSON document here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.tokens, args.min_len, args.max_len, args.dims = 256, 64, 160, "64"
        args.iters, args.rounds, args.warm_ms, args.rotate_mb = 2, 2, 0.0, 8
    try:
        args.dims = [int(x) for x in args.dims.split(",")]
    except ValueError:
        ap.error(f"--dims: expected comma-separated integers, got {args.dims!r}")
    args.impls = [n.strip() for n in args.impls.split(",") if n.strip()]
    args.passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    if not args.impls or set(args.impls) - set(IMPL_NAMES):
        ap.error(f"--impls: expected a subset of {','.join(IMPL_NAMES)}, got {','.join(args.impls)}")
    if not args.passes or set(args.passes) - {"forward", "backward"}:
        ap.error(f"--passes: expected forward and/or backward, got {','.join(args.passes)}")
    for d in args.dims:
        if d <= 0 or d > 256 or d % 8 or heads_for(d) % args.gqa:
            ap.error(f"--dims / --gqa: expected head dims that are multiples of 8 in [8, 256] whose heads "
                     f"(2048 / d) --gqa divides, got d = {d}, gqa = {args.gqa}")
    if not 0 < args.min_len <= args.max_len or args.tokens <= 0 or args.iters < 1 or args.rounds < 1:
        ap.error("expected 0 < --min-len <= --max-len, --tokens > 0, --iters >= 1 and --rounds >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch
    import flash4
    from attention_impls import load_impls

    def log(msg):
        print(f"# {msg}", file=sys.stderr, flush=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device (use --device cpu --smoke on a CPU machine)")
    wanted = ["flash4"] + (["fa4"] if {"fa4", "fa4_sink"} & set(args.impls) else [])
    if "cudnn_dense" in args.impls and args.device == "cuda":
        wanted.append("cudnn")
    elif "cudnn_dense" in args.impls:
        log("cudnn_dense left out: cuDNN runs on CUDA devices only")
    dense_fns, versions = load_impls(wanted, log)
    fa4_varlen = None
    if "fa4" in dense_fns:
        import flash_attn.cute as fa4_cute
        fa4_varlen = getattr(fa4_cute, "flash_attn_varlen_func", None)
        if fa4_varlen is None:
            log("fa4 left out: this flash_attn.cute has no flash_attn_varlen_func")
    impls = build_impls(args.impls, flash4, fa4_varlen, dense_fns)
    names = list(impls)
    timer = median_ms if args.device == "cuda" else wall_median_ms
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    lens = draw_lengths(args.seed, args.tokens, args.min_len, args.max_len)
    rms, n = rms_length(lens), len(lens)
    log(f"lengths {lens}; dense batch {n} x {rms}; timing {', '.join(names)}")
    cu = torch.tensor([sum(lens[:i]) for i in range(n + 1)], dtype=torch.int32, device=args.device)
    rows, checks = [], []
    for d in args.dims:
        h = heads_for(d)
        hk = h // args.gqa
        gen = torch.Generator(device=args.device).manual_seed(0)
        rotate = args.rotate_mb << 20
        sets = {"packed": make_sets((args.tokens, h, d), (args.tokens, hk, d), h, args.device, gen, rotate,
                                    cu, max(lens)),
                "dense": make_sets((n, rms, h, d), (n, rms, hk, d), h, args.device, gen, rotate)}
        log(f"d={d}: heads {h}, heads_kv {hk}; input sets rotated: {len(sets['packed'])} packed, "
            f"{len(sets['dense'])} dense")
        shape = {"packed": (args.tokens, n, lens), "dense": (n * rms, n, [rms] * n)}
        for causal in (False, True):
            found, check_errors = run_checks(impls, flash4, sets["packed"][0], causal, log)
            checks += [dict(c, d=d) for c in found]
            for pass_ in args.passes:
                backward = pass_ == "backward"
                errors, times = dict(check_errors), {name: [] for name in names}
                for r in range(args.rounds):
                    # Rotated, and reversed every other round, so that each implementation follows the others.
                    order = names[r % len(names):] + names[:r % len(names)]
                    for name in order if r % 2 == 0 else order[::-1]:
                        if name in errors:
                            continue
                        try:
                            times[name].append(measure(impls[name], sets[impls[name].batch], causal, backward,
                                                       timer, args))
                        except Exception as e:
                            errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
                for name in names:
                    tokens, segments, seq_lens = shape[impls[name].batch]
                    row = {"impl": name, "pass": pass_, "d": d, "causal": causal, "heads": h, "heads_kv": hk,
                           "tokens": tokens, "segments": segments}
                    if name in errors:
                        row["error"] = errors[name]
                    else:
                        ms = sorted(times[name])[len(times[name]) // 2]
                        flops = attention_flops(seq_lens, h, d, causal, backward)
                        row.update(ms=round(ms, 4), tflops=float(f"{flops / ms / 1e9:.4g}"),
                                   ms_rounds=[round(t, 4) for t in times[name]])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        del sets
        if args.device == "cuda":
            torch.cuda.empty_cache()
    summary(rows, log)
    if args.out:
        doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": gpu,
               "versions": versions, "args": vars(args), "lengths": lens, "dense_length": rms, "checks": checks,
               "rows": rows}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
