#!/usr/bin/env bash
# Builds the libFuzzer targets (preset fuzz: clang, libFuzzer, ASan + UBSan, CPU only; fuzz/README.md) and runs
# each for SECONDS on its seed corpus fuzz/corpus/<target> (read only: new inputs go to a temporary folder), then
# prints the executions of each target and their total. Exit 1 on a crash, leak, timeout or sanitizer report; the
# input that caused it is kept in build/fuzz/findings/.
#   bash scripts/fuzz.sh [SECONDS]          # default 60 per target
# Environment: FLASH4_FUZZ_MERGE=1 merges the inputs that found new coverage into fuzz/corpus (minimized);
# FLASH4_FUZZ_JOBS: build jobs (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
seconds=${1:-60}
build=$repo/build/fuzz
findings=$build/findings

cmake --preset fuzz >/dev/null
cmake --build "$build" -j "${FLASH4_FUZZ_JOBS:-$(nproc)}" --target flash4_fuzz_api_args flash4_fuzz_kvcache_args flash4_fuzz_cli_options >/dev/null
mkdir -p "$findings"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

total=0
failed=0
for target in api_args kvcache_args cli_options; do
  mkdir -p "$work/$target"
  log=$work/$target.log
  status=0
  # -timeout: an input running 10 s is a hang; -rss_limit_mb: a leak or runaway allocation fails the run.
  "$build/fuzz/flash4_fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/$target-" "$work/$target" "$repo/fuzz/corpus/$target" >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  coverage=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  runs=${runs:-0}
  total=$((total + runs))
  if ((status != 0)); then
    failed=1
    echo "fuzz $target: FAILED after $runs executions (exit $status); input kept in $findings/"
    grep -vE '^#[0-9]+' "$log" | tail -40
  else
    echo "fuzz $target: $runs executions in ${seconds} s, no crash ($coverage)"
  fi
  if [[ ${FLASH4_FUZZ_MERGE:-0} == 1 ]]; then
    "$build/fuzz/flash4_fuzz_$target" -merge=1 "$repo/fuzz/corpus/$target" "$work/$target" >/dev/null 2>&1
  fi
done
echo "fuzz total: $total executions"
exit "$failed"
