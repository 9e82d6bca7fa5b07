#!/usr/bin/env python3
"""Merges benchmark JSON lines (flash4_bench, sdpa_bench.py) into one table: TFLOP/s per impl and flash4/cuDNN."""
import json
import sys
from collections import defaultdict

rows = defaultdict(dict)
impls = []
for path in sys.argv[1:]:
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "tflops" not in r:
            continue
        key = (r["d"], r["causal"], r["s"])
        rows[key][r["impl"]] = r["tflops"]
        if r["impl"] not in impls:
            impls.append(r["impl"])
print(f"{'d':>4} {'causal':>6} {'seqlen':>6} " + " ".join(f"{i:>14}" for i in impls) + "  flash4/cudnn")
for key in sorted(rows):
    d, causal, s = key
    vals = rows[key]
    ratio = vals.get("flash4", 0) / vals["cudnn"] if vals.get("cudnn") else float("nan")
    print(f"{d:>4} {str(causal):>6} {s:>6} " + " ".join(f"{vals.get(i, float('nan')):>14.1f}" for i in impls)
          + f"  {ratio:>6.2f}")
