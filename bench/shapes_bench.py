#!/usr/bin/env python3
"""Times attention implementations in one process on shapes off the 16k-token protocol: odd lengths, GQA and
MQA (also with few KV heads per GPU, as tensor-parallel training leaves them), one long sequence, many heads over
short sequences. Same timing as sdpa_bench.py (CUDA events around calls issued back to back, steady-state
warm-up, median, input sets rotated past L2, rounds in rotated order); same implementations (--impls, from
bench/attention_impls.py). Before timing, each implementation's output (and with --backward its dq, dk, dv) is
computed into NaN-poisoned buffers and judged on the first and last (batch, KV head) against an fp64 reference
under the tests' tolerance rule, GQA included (dk, dv summed over the group). Causal shapes have seqlen_q ==
seqlen_k, where every implementation's causal mask means the same thing.

--shapes is a comma-separated list of b:s:h:hkv:d[:c] (c = causal); the default is the list in DEFAULT_SHAPES.
Prints one JSON object per line: {"meta": ...}, then one record per (shape, pass, implementation)."""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_impls import parse_impls  # noqa: E402
from sdpa_bench import median_ms  # noqa: E402

DEFAULT_SHAPES = ",".join([
    "1:4096:8:1:128", "1:4096:8:1:128:c",        # MQA after 8-way tensor parallelism (a 64-head, 8-KV-head model)
    "1:8192:8:1:128:c", "1:2048:32:2:128:c",     # the same, longer; GQA 16:1
    "1:4096:32:4:128", "1:4096:32:4:128:c",      # GQA 8:1, one sequence
    "2:8192:32:8:128:c", "4:4096:16:4:64:c",     # GQA 4:1
    "1:8192:8:2:256:c",                          # GQA 4:1 at d = 256
    "4:3001:16:16:128", "4:3001:16:16:128:c",    # lengths that are not a multiple of any tile
    "16:1000:32:32:64:c", "8:1531:16:16:96:c",   # odd lengths at d = 64 and a native 96
    "1:32768:16:16:128:c",                       # one long sequence
    "64:256:32:32:64:c", "128:128:16:16:128",    # many heads over short sequences
])


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) not in (5, 6) or (len(parts) == 6 and parts[5] != "c"):
                raise ValueError
            b, s, h, hkv, d = (int(x) for x in parts[:5])
        except ValueError:
            raise ValueError(f"--shapes: expected b:s:h:hkv:d[:c] items, got {item!r}")
        if min(b, s, h, hkv, d) <= 0 or h % hkv or d % 8 or d > 256:
            raise ValueError(f"--shapes: {item!r}: expected positive sizes, h divisible by hkv, d a multiple of 8 "
                             "up to 256")
        shapes.append((b, s, h, hkv, d, len(parts) == 6))
    return shapes


def reference(q, k, v, dout, causal, dtype):
    """Attention of one (batch, KV head) with its group of query heads, in `dtype`: [out, dq, dk, dv] (fp64) with
    q, out, dq (s, group, d) and k, v, dk, dv (s, d); softmax in fp32 below fp64, as the naive baseline."""
    import torch
    q, k, v = (x.detach().to(dtype).requires_grad_(dout is not None) for x in (q, k, v))
    s = torch.einsum("igd,jd->gij", q, k) * (q.shape[-1] ** -0.5)
    if causal:
        keep = torch.ones(s.shape[1:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.to(torch.float64 if dtype == torch.float64 else torch.float32), dim=-1).to(dtype)
    out = torch.einsum("gij,jd->igd", p, v)
    if dout is None:
        return [out.detach().double()]
    grads = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
    return [out.detach().double()] + [g.double() for g in grads]


def check(fn, q, k, v, dout, causal):
    """None when out (and dq, dk, dv) are within the tolerance rule on the first and last (batch, KV head)."""
    import torch
    from output_check import _judge, poisoned_results
    results = poisoned_results(fn, q, k, v, dout, causal)
    hkv, group = k.shape[2], q.shape[2] // k.shape[2]
    problems = []
    for b, g in ((0, 0), (q.shape[0] - 1, hkv - 1)):
        qs, dos = (x[b, :, g * group:(g + 1) * group, :] for x in (q, dout if dout is not None else q))
        ks, vs = k[b, :, g, :], v[b, :, g, :]
        ref = reference(qs, ks, vs, dos if dout is not None else None, causal, torch.float64)
        naive = reference(qs, ks, vs, dos if dout is not None else None, causal, q.dtype)
        got = [results[0][b, :, g * group:(g + 1) * group, :]]
        if dout is not None:
            got += [results[1][b, :, g * group:(g + 1) * group, :], results[2][b, :, g, :], results[3][b, :, g, :]]
        for name, x, r, n in zip(("out", "dq", "dk", "dv"), got, ref, naive):
            why = _judge(f"{name}[b={b},hkv={g}]", x, r, n, q.dtype)
            if why:
                problems.append(why)
    return "; ".join(problems) if problems else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split(";")[0] + ".")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--impls", default="flash4,fa4,cudnn")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-ms", type=float, default=100.0)
    ap.add_argument("--backward", action="store_true", help="also time the backward (forward+grad minus forward)")
    args = ap.parse_args()
    try:
        impls = parse_impls(args.impls)
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        ap.error(str(e))
    import torch
    from attention_impls import load_impls
    fns, versions = load_impls(impls, lambda msg: print(f"# {msg}", file=sys.stderr))
    names = list(fns)
    versions["gpu"] = torch.cuda.get_device_name()
    print(json.dumps({"meta": versions}), flush=True)
    for b, s, h, hkv, d, causal in shapes:
        set_bytes = 2 * b * s * (h + 2 * hkv) * d * 2
        sets = max(1, (200 << 20) // set_bytes + 1)
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = []
        for _ in range(sets):
            q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
            dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            inputs.append([x.requires_grad_(args.backward) if x is not dout else x for x in (q, k, v, dout)])
        fwd_flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        passes = ["forward"] + (["backward"] if args.backward else [])
        errors = {}
        for name in names:
            try:
                q, k, v, dout = inputs[0]
                why = check(fns[name], q, k, v, dout if args.backward else None, causal)
                if why:
                    errors[name] = "check failed: " + why
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
        times = {(n, p): [] for n in names for p in passes}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in (order if r % 2 == 0 else order[::-1]):
                if name in errors:
                    continue
                fn = fns[name]

                def fwd(i, fn=fn):
                    q, k, v, _ = inputs[i]
                    return fn(q, k, v, causal)

                def fwd_bwd(i, fn=fn):
                    q, k, v, dout = inputs[i]
                    torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout)
                try:
                    with torch.no_grad():
                        t_fwd = median_ms(fwd, args.iters, sets, args.warm_ms)
                    times[(name, "forward")].append(t_fwd)
                    if args.backward:
                        t_grad = median_ms(fwd_bwd, args.iters, sets, args.warm_ms)
                        times[(name, "backward")].append(t_grad - median_ms(fwd, args.iters, sets, args.warm_ms))
                except Exception as e:
                    errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
        for p in passes:
            for name in names:
                rec = dict(impl=name, pass_=p, b=b, s=s, h=h, hkv=hkv, d=d, causal=causal)
                if name in errors:
                    rec["error"] = errors[name]
                elif times[(name, p)]:
                    t = statistics.median(times[(name, p)])
                    flops = fwd_flops * (2.5 if p == "backward" else 1.0)
                    rec.update(ms=round(t, 4), tflops=round(flops / t / 1e9, 1),
                               ms_rounds=[round(x, 4) for x in times[(name, p)]])
                print(json.dumps(rec), flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
