#!/usr/bin/env python3
"""The SASS instructions of one kernel with the most warp stall samples, from Nsight Compute's source page.

    ncu ... --section SourceCounters --import-source no -o rep -f <program>
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/stall_sites.py sass.csv [--top 40] [--json out.json]

Prints, per instruction: its offset, its share of all stall samples, how often it executed (the execution count
tells the roles apart: a consumer warp's per-tile code runs once per tile per consumer warp, the producer's and a
dQ writer's once per tile), and the instruction. Then the share of samples per execution count, which is a
per-role total.
"""
import argparse
import csv
import json
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header_at = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    header, data = rows[header_at], [r for r in rows[header_at + 1:] if len(r) == len(rows[header_at])]
    col = {name: header.index(name) for name in ("Address", "Source", "Warp Stall Sampling (All Samples)",
                                                 "Instructions Executed")}

    def samples(r):
        return float(r[col["Warp Stall Sampling (All Samples)"]] or 0)

    def executed(r):
        return int(float(r[col["Instructions Executed"]] or 0))

    total = sum(samples(r) for r in data)
    if total == 0:
        raise SystemExit(f"{args.csv}: no stall samples (was the SourceCounters section collected?)")
    top = sorted(data, key=samples, reverse=True)[:args.top]
    sites = [{"offset": r[col["Address"]][-5:], "share_pct": round(samples(r) / total * 100, 2),
              "executions": executed(r), "sass": r[col["Source"]].strip()} for r in top]
    print(f"{len(data)} instructions, {total:.0f} samples")
    for s in sites:
        print(f"{s['offset']:>6} {s['share_pct']:6.2f} % {s['executions']:>10}  {s['sass'][:100]}")
    by_count = defaultdict(float)
    for r in data:
        by_count[executed(r)] += samples(r)
    print("samples by execution count:")
    for count, v in sorted(by_count.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {count:>10} {v / total * 100:6.2f} %")
    if args.json:
        json.dump({"total_samples": total, "top": sites}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
