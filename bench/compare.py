#!/usr/bin/env python3
"""Merges benchmark JSON lines (flash4_bench, sdpa_bench.py) into one table: TFLOP/s per impl, then flash4 over
each peer that is present (cuDNN, FlashAttention-4), and the records that carry an error instead of a timing."""
import json
import sys
from collections import defaultdict

# flash4 / peer ratio columns, in this order, for the peers present in the records.
RATIO_PEERS = ("cudnn", "fa4")


def read_records(paths):
    """The JSON records of the files' lines (other lines, e.g. notes, are skipped)."""
    out = []
    for path in paths:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def format_table(records):
    rows = defaultdict(dict)
    impls, errors = [], []
    for r in records:
        if "impl" not in r:
            continue  # the {"meta": ...} line
        if "error" in r:
            errors.append(f"error: {r['impl']} d={r['d']} causal={r['causal']} s={r['s']}: {r['error']}")
            continue
        if "tflops" not in r:
            continue
        rows[(r["d"], r["causal"], r["s"])][r["impl"]] = r["tflops"]
        if r["impl"] not in impls:
            impls.append(r["impl"])
    peers = [p for p in RATIO_PEERS if p in impls]
    lines = [f"{'d':>4} {'causal':>6} {'seqlen':>6} " + " ".join(f"{i:>14}" for i in impls)
             + "".join(f"  {'flash4/' + p:>12}" for p in peers)]
    for key in sorted(rows):
        d, causal, s = key
        vals = rows[key]
        cells = " ".join(f"{vals.get(i, float('nan')):>14.1f}" for i in impls)
        ratios = "".join(f"  {vals['flash4'] / vals[p] if vals.get('flash4') and vals.get(p) else float('nan'):>12.2f}"
                         for p in peers)
        lines.append(f"{d:>4} {str(causal):>6} {s:>6} {cells}{ratios}")
    return "\n".join(lines + errors)


if __name__ == "__main__":
    print(format_table(read_records(sys.argv[1:])))
