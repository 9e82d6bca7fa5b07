#!/usr/bin/env bash
# The Python package on the H200 device machine, in one call (about 4 minutes):
#   1. pip install --no-build-isolation . (offline; CUDA kernels built with every core)
#   2. pytest tests/python on the GPU (and the CPU tests), JUnit XML kept
#   3. tests/python/train_compare.py: 200 training steps of a small causal transformer, flash4 vs SDPA
# then a summary of what passed and what failed. Files land in $OUT (build.log, pytest.log, pytest.xml,
# train.log, train_compare.json, train_compare.png).
#
# Usage (device tool):  bash scripts/device-python.sh
# Environment: OUT (default /tmp/flash4-device-out); FLASH4_CUDA (default ON: fail if nvcc is missing);
# PYTEST_ARGS (extra pytest arguments, e.g. "-k cuda"); TRAIN_ARGS (extra train_compare.py arguments).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 1
OUT="${OUT:-/tmp/flash4-device-out}"
mkdir -p "$OUT"
export FLASH4_CUDA="${FLASH4_CUDA:-ON}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
py="${PYTHON:-python3}"

declare -a summary=()
note() { summary+=("$1"); }
step() { printf '\n== %s (t=%ds)\n' "$1" "$SECONDS"; }

step "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
nvcc --version 2>/dev/null | tail -1
"$py" - <<'PY'
import importlib.metadata as md, sys
print("python", sys.version.split()[0])
for name in ("torch", "nanobind", "scikit-build-core", "numpy", "pytest", "matplotlib"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} MISSING")
PY

step "build: pip install --no-build-isolation . (FLASH4_CUDA=$FLASH4_CUDA, $CMAKE_BUILD_PARALLEL_LEVEL jobs)"
start=$SECONDS
if "$py" -m pip install --no-build-isolation --no-deps --force-reinstall -v . >"$OUT/build.log" 2>&1; then
  build_s=$((SECONDS - start))
  note "build            ok in ${build_s} s"
  "$py" -c 'import flash4; print("flash4", flash4.__version__, "cuda_available:", flash4.cuda_available())'
else
  build_s=$((SECONDS - start))
  tail -60 "$OUT/build.log"
  note "build            FAILED after ${build_s} s (see build.log); nothing else ran"
  printf '\n== summary\n'; printf '%s\n' "${summary[@]}"
  exit 1
fi

step "pytest tests/python"
timeout_args=()
if "$py" -c 'import pytest_timeout' 2>/dev/null; then
  timeout_args=(--timeout=120 --timeout-method=thread)  # a hung kernel ends the run with stacks, not silence
fi
# OMP_NUM_THREADS=1: torch's CPU threads spin after each op and starve the CPU backend's threads (CPU tests).
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 timeout 240 "$py" -m pytest tests/python -q -p no:cacheprovider --durations=10 \
  --junitxml="$OUT/pytest.xml" ${timeout_args[@]+"${timeout_args[@]}"} ${PYTEST_ARGS:-} >"$OUT/pytest.log" 2>&1
pytest_rc=$?
tail -40 "$OUT/pytest.log"
# Per-group counts from the JUnit XML: which parts (GPU forward, GPU backward, compile, ...) passed.
"$py" - "$OUT/pytest.xml" "$pytest_rc" <<'PY' >"$OUT/pytest_groups.txt" 2>&1
import collections, sys, xml.etree.ElementTree as ET
path, rc = sys.argv[1], int(sys.argv[2])
try:
    cases = ET.parse(path).getroot().iter("testcase")
except (OSError, ET.ParseError) as error:
    print(f"pytest           no report ({error}); exit code {rc}{' (timed out)' if rc == 124 else ''}")
    sys.exit(0)
groups = collections.OrderedDict()
def group(name, classname):
    file = classname.split(".")[-1]
    base = name.split("[")[0]
    on_gpu = "cuda" in name or base in ("test_error_mixed_devices", "test_error_unsupported_gpu")
    if base in ("test_cuda_forward", "test_cuda_backward", "test_cuda_build_present"):
        return base[len("test_"):]
    if base == "test_compile_fullgraph":
        return "compile (cuda)" if on_gpu else "compile (cpu)"
    return f"{file}: {'cuda' if on_gpu else 'cpu'}"
failed_names = collections.defaultdict(list)
for case in cases:
    g = group(case.get("name"), case.get("classname", ""))
    counts = groups.setdefault(g, collections.Counter())
    if case.find("failure") is not None or case.find("error") is not None:
        counts["failed"] += 1
        failed_names[g].append(case.get("name"))
    elif case.find("skipped") is not None:
        counts["skipped"] += 1
    else:
        counts["passed"] += 1
for g, c in groups.items():
    status = "ok" if c["failed"] == 0 and c["passed"] > 0 else ("FAILED" if c["failed"] else "skipped")
    line = f"{g:<34} {status:<7} {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
    if failed_names[g]:
        line += "  e.g. " + ", ".join(failed_names[g][:3])
    print(line)
if rc not in (0, 1):
    print(f"pytest exit code {rc}{' (timed out: later tests did not run)' if rc == 124 else ''}")
PY
while IFS= read -r line; do note "tests: $line"; done <"$OUT/pytest_groups.txt"

step "training comparison: flash4 vs SDPA"
# shellcheck disable=SC2086
"$py" tests/python/train_compare.py --out "$OUT" ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train.log"
train_rc=${PIPESTATUS[0]}
"$py" - "$OUT/train_compare.json" <<'PY' >"$OUT/train_summary.txt" 2>&1
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError) as error:
    print(f"no report ({error})")
    sys.exit(0)
for name, r in report["results"].items():
    if "error" in r:
        print(f"{name:<7} FAILED: {r['error'][:120]}")
    else:
        print(f"{name:<7} ok, final loss {r['losses'][-1]:.4f}, {r['tokens_per_s']:,.0f} tokens/s, "
              f"{r['step_ms_median']:.2f} ms/step")
s = report.get("summary") or {}
if s:
    print(f"loss |flash4 - sdpa| max {s['max_abs_loss_diff']:.4f}, last-quarter mean "
          f"{s['mean_abs_loss_diff_last_quarter']:.4f}; flash4/sdpa tokens/s {s['speedup_tokens_per_s']:.3f}x")
PY
while IFS= read -r line; do note "train: $line"; done <"$OUT/train_summary.txt"
rm -f "$OUT/pytest_groups.txt" "$OUT/train_summary.txt"

printf '\n== summary (total %d s)\n' "$SECONDS"
printf '%s\n' "${summary[@]}"
[[ $pytest_rc -eq 0 && $train_rc -eq 0 ]]
