#!/usr/bin/env python3
"""The GPU kernels' compiled resources against a committed record, checked without a GPU.

A kernel that starts spilling registers to local memory, or needs more registers or shared memory than before,
usually runs slower, and on a CPU-only machine nothing else would notice. This reads what ptxas gave every
kernel in the built library (cuobjdump -res-usage: registers, stack frame, static shared and local memory; the
SASS: local loads and stores, i.e. spill traffic sites) and compares it with tests/kernel_resources.json:

    python3 scripts/kernel_resources.py check  BUILD/src/libflash4.a [--record tests/kernel_resources.json]
    python3 scripts/kernel_resources.py update BUILD/src/libflash4.a [--record ...]

`check` fails when a kernel of the record needs more of any resource than recorded, or when the library has a
kernel the record lacks; it lists kernels that now need less (update the record to lock the gain in) and
recorded kernels the library does not have (builds with fewer FLASH4_HEAD_DIMS). `update` rewrites the record
from the library; commit it with the change that moved the numbers and say why in the commit message.

cuobjdump (and nvdisasm, which its -sass runs) come from the CUDA toolkit, or the PyPI packages
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (scripts/test.sh installs them where the toolkit lacks them);
--cuobjdump or $CUOBJDUMP names it explicitly.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

# Resources compared, with what "more" means for each: all of them are costs.
FIELDS = ("registers", "stack", "shared", "local", "spill_ops")


def find_cuobjdump(explicit):
    """The cuobjdump to run: --cuobjdump, $CUOBJDUMP, PATH, the toolkit's bin, the PyPI package; or None."""
    for cand in (explicit, os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if cand and os.access(cand, os.X_OK):
            return cand
    for entry in sys.path:  # the PyPI package puts it under nvidia/cu*/bin
        base = os.path.join(entry or ".", "nvidia")
        if os.path.isdir(base):
            for sub in sorted(os.listdir(base)):
                cand = os.path.join(base, sub, "bin", "cuobjdump")
                if os.access(cand, os.X_OK):
                    return cand
    return None


def run(cuobjdump, *args):
    """cuobjdump's output; its own folder goes first on PATH, where -sass finds nvdisasm beside it (the PyPI
    packages install the two side by side)."""
    env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(cuobjdump)) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run([cuobjdump, *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"kernel_resources: {os.path.basename(cuobjdump)} {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


_ANONYMOUS = re.compile(r"(\d+)_GLOBAL__N__")


def stable_name(name):
    """The mangled name with each anonymous namespace's identifier (_GLOBAL__N__<hash>_<n>_<file>_<hash>, the
    hashes from the source's path) cut to its file, so that the record holds in any checkout."""
    out, pos = [], 0
    for m in _ANONYMOUS.finditer(name):
        digits, start = m.group(1), m.start(1) + len(m.group(1))
        for k in range(1, min(3, len(digits)) + 1):  # the length prefix: the last digits before it (no leading 0)
            if digits[-k] == "0":
                continue
            length = int(digits[-k:])
            ident = name[start:start + length]
            if len(ident) == length and re.fullmatch(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+_[0-9a-f]+", ident):
                break
        else:
            continue
        f = re.match(r"_GLOBAL__N__[0-9a-f]+_(\d+)_", ident)
        short = "_GLOBAL__N__" + ident[f.end():f.end() + int(f.group(1))]
        out.append(name[pos:start - k] + f"{len(short)}{short}")
        pos = start + length
    out.append(name[pos:])
    return "".join(out)


def parse_res_usage(text):
    """{kernel: {registers, stack, shared, local}} from `cuobjdump -res-usage`."""
    kernels, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m:
            name = stable_name(m.group(1))
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and name:
            reg, stack, shared, local = (int(x) for x in m.groups())
            kernels[name] = {"registers": reg, "stack": stack, "shared": shared, "local": local}
            name = None
    return kernels


def count_spill_ops(text):
    """{kernel: number of LDL / STL instructions} from `cuobjdump -sass`: local-memory traffic, i.e. spills (or an
    array the compiler could not keep in registers, which costs the same)."""
    counts, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)\s*$", line)
        if m:
            name = stable_name(m.group(1))
            counts[name] = 0
        elif name and re.search(r"\b(LDL|STL)(\.\w+)*\s", line):
            counts[name] += 1
    return counts


def read_library(cuobjdump, library):
    kernels = parse_res_usage(run(cuobjdump, "-res-usage", library))
    spills = count_spill_ops(run(cuobjdump, "-sass", library))
    for name, res in kernels.items():
        res["spill_ops"] = spills.get(name, 0)
    return kernels


def demangle(names):
    """Readable names for the report (mangled ones where c++filt is missing)."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def compare(built, record):
    """(problems, gains, absent): lines for kernels that need more than recorded or are not recorded, kernels that
    need less, recorded kernels not built."""
    problems, gains = [], []
    readable = demangle(sorted(set(built) | set(record)))
    for name in sorted(built):
        now = built[name]
        if name not in record:
            problems.append(f"not in the record: {readable[name]}: {now}")
            continue
        was = record[name]
        worse = [f"{f} {was.get(f, 0)} -> {now[f]}" for f in FIELDS if now[f] > was.get(f, 0)]
        better = [f"{f} {was.get(f, 0)} -> {now[f]}" for f in FIELDS if now[f] < was.get(f, 0)]
        if worse:
            problems.append(f"{readable[name]}: " + ", ".join(worse))
        if better:
            gains.append(f"{readable[name]}: " + ", ".join(better))
    absent = [readable[n] for n in sorted(set(record) - set(built))]
    return problems, gains, absent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("check", "update"))
    ap.add_argument("library", help="the built static library, e.g. build/test/src/libflash4.a")
    ap.add_argument("--record", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                     "kernel_resources.json"))
    ap.add_argument("--cuobjdump", help="path of cuobjdump (default: $CUOBJDUMP, PATH, the toolkit, PyPI's)")
    args = ap.parse_args()
    tool = find_cuobjdump(args.cuobjdump)
    if tool is None:
        sys.exit("kernel_resources: no cuobjdump (CUDA toolkit, or pip install nvidia-cuda-cuobjdump "
                 "nvidia-cuda-nvdisasm)")
    if not os.path.isfile(args.library):
        sys.exit(f"kernel_resources: {args.library} does not exist (build with FLASH4_CUDA=ON first)")
    built = read_library(tool, args.library)
    if not built:
        sys.exit(f"kernel_resources: {args.library} holds no GPU kernel (built without CUDA?)")
    if args.action == "update":
        with open(args.record, "w") as f:  # one kernel a line, so that a diff shows which kernels moved
            lines = [f"{json.dumps(name)}: {json.dumps(built[name])}" for name in sorted(built)]
            f.write("{\n" + ",\n".join(lines) + "\n}\n")
        print(f"kernel_resources: recorded {len(built)} kernels in {os.path.relpath(args.record)}")
        return 0
    with open(args.record) as f:
        record = json.load(f)
    problems, gains, absent = compare(built, record)
    for line in gains:
        print(f"  needs less than recorded (update the record to keep it): {line}")
    if absent:
        print(f"  {len(absent)} recorded kernels are not in this build (fewer FLASH4_HEAD_DIMS?)")
    for line in problems:
        print(f"  MORE THAN RECORDED: {line}")
    spilling = sum(1 for r in built.values() if r["spill_ops"])
    print(f"kernel_resources: {len(built)} kernels, {spilling} with spill instructions; "
          f"{len(problems)} above the record, {len(gains)} below it")
    if problems:
        print("kernel_resources: a kernel needs more than before; if that is intended (and measured on the GPU), "
              "run `python3 scripts/kernel_resources.py update <library>` and commit the record with the reason")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
