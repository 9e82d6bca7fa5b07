#!/usr/bin/env python3
"""A/B table from flash4_bench JSON lines of several builds and rounds (scripts/device-check.sh ab).

Each line carries "impl" (<tag>_flash4 / <tag>_flash4_deterministic, tag "new" for the build under test) and
"round". Prints, per pass / head dim / mask / seqlen, the median TFLOP/s of each build over the rounds and the
ratio new / old; the last line counts the shapes slower than the given tolerance.
usage: ab_table.py results.jsonl [--old TAG] [--tolerance 0.02]
"""
import argparse
import json
import statistics
from collections import defaultdict

ap = argparse.ArgumentParser()
ap.add_argument("jsonl")
ap.add_argument("--old", default="old")
ap.add_argument("--tolerance", type=float, default=0.02)
a = ap.parse_args()

runs = defaultdict(list)  # (pass, impl suffix, d, causal, s, b, h, hkv, tag) -> [tflops]
for line in open(a.jsonl):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    tag, _, impl = r["impl"].partition("_")
    # b, h, hkv keep --shapes rows apart from protocol rows of the same seqlen (absent in older results: -1).
    shape = (r.get("b", -1), r.get("h", -1), r.get("hkv", r.get("h", -1)))
    runs[(r.get("pass", "forward"), impl, r["d"], r["causal"], r["s"]) + shape + (tag,)].append(r["tflops"])

keys = sorted({k[:-1] for k in runs})
print(f"{'pass':<9} {'impl':<22} {'d':>4} {'causal':>6} {'seqlen':>6} {'b x h/hkv':>12} {'new':>8} {a.old:>8} "
      f"{'new/old':>8} {'rounds':>6}")
slower = 0
for k in keys:
    new, old = runs.get(k + ("new",)), runs.get(k + (a.old,))
    if not new or not old:
        continue
    mn, mo = statistics.median(new), statistics.median(old)
    ratio = mn / mo
    flag = " <" if ratio < 1 - a.tolerance else ""
    slower += bool(flag)
    heads = f"{k[5]}x{k[6]}/{k[7]}" if k[5] >= 0 else "-"
    print(f"{k[0]:<9} {k[1]:<22} {k[2]:>4} {str(k[3]):>6} {k[4]:>6} {heads:>12} {mn:>8.1f} {mo:>8.1f} {ratio:>8.3f} "
          f"{len(new):>6}{flag}")
print(f"shapes slower than {a.tolerance:.0%}: {slower}")
