#!/usr/bin/env python3
"""Benchmark bookkeeping: merge measured JSON lines into one results file, and render it for docs/.

  report.py collect --out results.json --gpu "..." --commit SHA [--forward a.jsonl ...] [--backward ...]
                    [--ablation ...]
  report.py render results.json --markdown tables.md [--plot-prefix docs/img/perf]

Records are the JSON lines printed by bench/flash4_bench and bench/sdpa_bench.py (impl, b, s, h, d, causal,
ms, tflops); sdpa_bench.py's {"meta": ...} lines (library versions: torch, cuDNN, flash4, FlashAttention-4) are
merged into the results' "versions". Nothing here measures anything: it only files and formats what the device
printed.
"""
import argparse
import datetime
import json
from collections import defaultdict


def read_jsonl(paths):
    out = []
    for path in paths or []:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                rec = json.loads(line)
                if "tflops" in rec:
                    out.append(rec)
    return out


def read_versions(paths):
    """Union of the {"meta": {...}} lines' entries (the GPU name stays out: the results file has its own)."""
    versions = {}
    for path in paths or []:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                meta = json.loads(line).get("meta")
                if meta:
                    versions.update({k: v for k, v in meta.items() if k != "gpu"})
    return versions


def collect(args):
    results = {
        "date": args.date or datetime.date.today().isoformat(),
        "gpu": args.gpu,
        "commit": args.commit,
        "versions": read_versions((args.forward or []) + (args.backward or []) + (args.ablation or [])),
        "protocol": "bf16, total tokens b*s = 16k, heads*d = 2048, CUDA events, 3 warm-up + median of N runs, "
                    "input sets rotated past 200 MB (> L2); forward FLOPs 4*b*h*s*s*d (causal: half), "
                    "backward 2.5x; backward time = (forward+backward) - forward for SDPA backends; records "
                    "with ms_rounds: the median of that many rounds, implementations in a rotated order per round; "
                    "sdpa_bench.py checks each implementation's outputs (NaN-poisoned first) against an fp64 "
                    "reference before timing it; ms_single: one synchronized call at a time",
        "forward": read_jsonl(args.forward),
        "backward": read_jsonl(args.backward),
        "ablation": read_jsonl(args.ablation),
    }
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}: {len(results['forward'])} forward, {len(results['backward'])} backward, "
          f"{len(results['ablation'])} ablation records")


def table(records, impls, ratio_to=("cudnn", "fa4")):
    """Markdown table of TFLOP/s per (d, causal, seqlen), then flash4 over each of ratio_to that has records."""
    rows = defaultdict(dict)
    for r in records:
        rows[(r["d"], r["causal"], r["s"])][r["impl"]] = r["tflops"]
    impls = [i for i in impls if any(i in v for v in rows.values())]
    peers = [p for p in ratio_to if p in impls]
    lines = ["| d | causal | seqlen | " + " | ".join(impls) + "".join(f" | flash4 / {p}" for p in peers) + " |",
             "|---" * (len(impls) + len(peers) + 3) + "|"]
    for key in sorted(rows):
        v = rows[key]
        ratios = [v["flash4"] / v[p] if v.get("flash4") and v.get(p) else float("nan") for p in peers]
        cells = [f"{v[i]:.0f}" if i in v else "-" for i in impls]
        lines.append(f"| {key[0]} | {'yes' if key[1] else 'no'} | {key[2]} | " + " | ".join(cells)
                     + "".join(f" | {x:.2f}" for x in ratios) + " |")
    return "\n".join(lines)


def plot(records, impls, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharey=True)
    for col, d in enumerate((64, 128, 256)):
        for row, causal in enumerate((False, True)):
            ax = axes[row][col]
            for impl in impls:
                pts = sorted((r["s"], r["tflops"]) for r in records
                             if r["impl"] == impl and r["d"] == d and r["causal"] == causal)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"d={d} {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("seqlen")
            ax.grid(alpha=0.3)
            if col == 0:
                ax.set_ylabel("TFLOP/s")
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def render(args):
    res = json.load(open(args.results))
    impls = ["flash4", "flash4_deterministic", "fa4", "cudnn", "fa2"]
    versions = res.get("versions") or {}
    named = ", ".join(f"{k} {versions[k]}" for k in ("flash_attn_4", "torch", "cudnn") if versions.get(k))
    parts = [f"Measured {res['date']} on {res['gpu']}, commit {res['commit']}" + (f" ({named})." if named else "."),
             ""]
    if res["forward"]:
        parts += ["### Forward (TFLOP/s)", "", table(res["forward"], impls), ""]
    if res["backward"]:
        parts += ["### Backward (TFLOP/s)", "", table(res["backward"], impls), ""]
    if res["ablation"]:
        abl = defaultdict(dict)
        for r in res["ablation"]:
            abl[(r["d"], r["causal"])][r["impl"]] = r["tflops"]
        names = []
        for v in abl.values():
            names += [n for n in v if n not in names]
        parts += ["### Ablation at seqlen 8k (TFLOP/s; median of 3 interleaved rounds)", "",
                  "| variant | " + " | ".join(f"d{d}{' causal' if c else ''}" for d, c in sorted(abl)) + " |",
                  "|---" * (len(abl) + 1) + "|"]
        for n in names:
            parts.append(f"| {n} | " + " | ".join(f"{abl[k].get(n, float('nan')):.0f}" for k in sorted(abl)) + " |")
        parts.append("")
    with open(args.markdown, "w") as f:
        f.write("\n".join(parts))
    if args.plot_prefix:
        if res["forward"]:
            plot(res["forward"], impls, args.plot_prefix + "-forward.png", f"flash4 forward, {res['gpu']}")
        if res["backward"]:
            plot(res["backward"], impls, args.plot_prefix + "-backward.png", f"flash4 backward, {res['gpu']}")
    print(f"wrote {args.markdown}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--out", required=True)
    c.add_argument("--gpu", required=True)
    c.add_argument("--commit", required=True)
    c.add_argument("--date")
    c.add_argument("--forward", nargs="*")
    c.add_argument("--backward", nargs="*")
    c.add_argument("--ablation", nargs="*")
    r = sub.add_parser("render")
    r.add_argument("results")
    r.add_argument("--markdown", required=True)
    r.add_argument("--plot-prefix")
    args = ap.parse_args()
    collect(args) if args.cmd == "collect" else render(args)


if __name__ == "__main__":
    main()
