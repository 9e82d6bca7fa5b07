#!/usr/bin/env bash
# Everything flash4 checks on the H200 in one call (scripts/device-check.sh [stage ...]):
#   build  - configure + build in build-device unless a carried build folder is given (BUILD_DIR)
#   test   - GPU tests (tests/gpu) against the fp64 reference
#   sanitize - compute-sanitizer memcheck + racecheck on small shapes
#   bench  - flash4 forward vs cuDNN / FA2 (SDPA backends), JSON under $OUT
#   bench-bwd - the same for the backward (flash4 and its deterministic mode)
#   profile - Nsight Compute sections + SASS instruction mix of one forward launch
# Full logs go to $OUT; a short table is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/flash4-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-lead}
STAGES=${*:-test bench}
summary=()

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

for stage in $STAGES; do
  case $stage in
    build)
      cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASH4_CUDA=ON >"$OUT/build.log" 2>&1 &&
        cmake --build "$BUILD_DIR" -j 16 >>"$OUT/build.log" 2>&1
      summary+=("build: rc=$?")
      ;;
    test)
      "$BUILD_DIR/tests/flash4_gpu_tests" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$OUT/gpu-tests.log" 2>&1
      rc=$?
      summary+=("gpu tests: rc=$rc; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu-tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|error" "$OUT/gpu-tests.log" | head -20
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD_DIR/tests/flash4_gpu_tests" \
          --gtest_filter="${SANITIZE_FILTER:-HopperLayer*:ForwardFeatures.FullyMaskedRows}" >"$OUT/sanitize-$tool.log" 2>&1
        summary+=("sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitize-$tool.log" | tail -1)")
      done
      ;;
    profile)
      # Nsight Compute on one launch of the forward kernel (clocks left alone), plus its SASS instruction mix.
      ncu --clock-control none -k regex:fwd_kernel -s 3 -c 1 --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section Occupancy \
        "$BUILD_DIR/bench/flash4_bench" --iters 3 --shape "${PROFILE_SHAPE:-128:8192:0}" >"$OUT/ncu.txt" 2>&1
      summary+=("ncu: rc=$?")
      cuobjdump -sass "$BUILD_DIR/bench/flash4_bench" 2>/dev/null | awk '/Function : .*fwd_kernel.*Li128ELb0E/{p=1} p&&/Function : /&&!/Li128ELb0E/{p=0} p' |
        grep -oE '^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9.]+' | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -40 >"$OUT/sass-mix.txt"
      ;;
    bench)
      "$BUILD_DIR/bench/flash4_bench" ${BENCH_ARGS:-} >"$OUT/bench-flash4.jsonl" 2>"$OUT/bench-flash4.err"
      summary+=("flash4 bench: rc=$?")
      PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py ${SDPA_ARGS:-} >"$OUT/bench-sdpa.jsonl" 2>"$OUT/bench-sdpa.err"
      summary+=("sdpa bench: rc=$?")
      python3 bench/compare.py "$OUT/bench-flash4.jsonl" "$OUT/bench-sdpa.jsonl" | tee "$OUT/bench-table.txt"
      ;;
    bench-bwd)
      "$BUILD_DIR/bench/flash4_bench" --backward ${BENCH_ARGS:-} >"$OUT/bench-bwd-flash4.jsonl" 2>"$OUT/bench-bwd-flash4.err"
      summary+=("flash4 backward bench: rc=$?")
      PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py --backward ${SDPA_ARGS:-} >"$OUT/bench-bwd-sdpa.jsonl" 2>"$OUT/bench-bwd-sdpa.err"
      summary+=("sdpa backward bench: rc=$?")
      python3 bench/compare.py "$OUT/bench-bwd-flash4.jsonl" "$OUT/bench-bwd-sdpa.jsonl" | tee "$OUT/bench-bwd-table.txt"
      ;;
  esac
done
echo "== summary =="
printf '%s\n' "${summary[@]}"
