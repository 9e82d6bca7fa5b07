#!/usr/bin/env bash
# Everything flash4 checks on the H200 in one call:
#   scripts/device-check.sh [--out DIR] [stage ...]     (DIR: where logs and results go; default build/device-out)
#   build  - configure + build in build-device unless a carried build folder is given (BUILD_DIR)
#   test   - GPU tests (tests/gpu) against the fp64 reference
#   sanitize - compute-sanitizer memcheck + racecheck on small shapes
#   bench  - flash4 forward vs cuDNN / FA2 (SDPA backends), JSON under $OUT
#   bench-bwd - the same for the backward (flash4 and its deterministic mode)
#   profile-bwd - Nsight Compute on the backward main kernel, non-deterministic and deterministic launches
#   profile-decode - Nsight Compute on one KV-cache decode launch (DECODE_ROW=batch:seqlen, default 8:32768)
#   profile - Nsight Compute sections + SASS instruction mix of one forward launch
#   cli    - `flash4 run --check` on the GPU (forward and backward), as a user would
#   install-python - only the offline pip install of the Python package (for bench-py); WHEEL=path installs a
#            carried wheel instead of building (e.g. python3.12 -m pip wheel . --no-deps -w DIR, with
#            FLASH4_HEAD_DIMS / FLASH4_DTYPES narrowed to what the run needs)
#   python - the Python package: offline pip install, pytest on the GPU, 200-step training flash4 vs SDPA
#            (scripts/device-python.sh)
#   candidates - tile-table candidates at every seqlen (flash4_bench --candidates), the previous build's flash4
#            (devbin/old/flash4_bench_old, if carried) and cuDNN, for choosing the forward tile table
#   ab     - A/B of this build against every carried devbin/old/flash4_bench_<tag> (other commits' builds):
#            forward and backward at AB_SEQLENS (default 1024,4096,16384), AB_ROUNDS rounds (default 3) in
#            alternating build order; table by bench/ab_table.py, JSON lines in DIR/ab.jsonl
#   ab-src - builds the benchmark of every carried source tree devsrc/<tag> (other commits or kernel variants,
#            bf16 kernels only, in parallel) into devbin/old/flash4_bench_<tag>, for the ab stage that follows
#   fp8    - the FP8 forward (opt-in path): its GPU tests (GpuFp8Forward*), then flash4_bench --fp8 (FP8 beside bf16 at
#            d = 128 / 256, FP8_SEQLENS default 1024,4096,16384, 3 rounds) into DIR/fp8.jsonl, table printed
#   varlen - packed batches and the learnable sink against the dense batch of the same FLOPs (flash4_bench
#            --varlen), JSON lines in DIR/varlen.jsonl
#   varlen-peers - bench/varlen_peers.py: packed batches through the Python package (install-python first) beside
#            FlashAttention-4's varlen kernels (FA4 staged as for `peers`) and the dense batch of the same FLOPs,
#            forward and backward, with and without the sink; $OUT/varlen-peers.json. VARLEN_PEERS_ARGS adds options
#   train-hf - bench/transformers_train.py: a transformers Llama trained with flash4 and with SDPA in one process
#            (install-python first), dense and packed batches; JSON lines in $OUT/train-hf.jsonl
#   decode - KV-cache decode: the decode GPU tests (GTEST_FILTER ${DECODE_FILTER:-KvCache*:DecodeRoute*}), then
#            flash4_bench --decode (issue #19's rows, contiguous / paged 256 / paged 16, single calls, graph replays,
#            chunked prefill; DECODE_SPLITS="0,1,4,16" times several split counts) into DIR/decode.jsonl, and
#            bench/decode_bench.py (flash4 Python paths vs cuDNN vs FA4 in one process, when torch imports) into
#            DIR/decode-py.jsonl
#   ab-bwd - backward A/B: this build's flash4_bench --backward against every devbin/old/flash4_bench_<tag>
#            (other commits' builds, carried) and cuDNN, for judging backward changes in one call
#   host     - host microseconds per call: C++ API and its parts, Python paths vs SDPA (after install-python)
#   bench-py - flash4 (through the Python package) vs cuDNN vs FA2 in ONE process, forward and backward, plus
#            the ablation and the deterministic backward from flash4_bench; collected into $OUT/results.json
#   peers  - flash4 (Python package: install-python first) vs FlashAttention-4 (flash-attn-4's CuTe-DSL kernels)
#            vs cuDNN vs FA2 in ONE process, forward and backward (bench/sdpa_bench.py --impls
#            ${PEERS_IMPLS:-flash4,fa4,cudnn,fa2} --single); needs FA4 importable: in the call after the one that
#            staged .peers/a, this stage sources .peers/b/install-fa4.sh itself (docs/performance.md, "FlashAttention-4
#            as a peer"). Skipped with a note when FA4 does not import. JSON lines, $OUT/peers-results.json (with
#            FA4's version) and the table $OUT/peers-table.txt. PEERS_DIMS / PEERS_SEQLENS narrow the sweep,
#            PEERS_ARGS adds sdpa_bench.py options (e.g. "--rounds 2"), PEERS_SKIP_BACKWARD=1 times the forward only.
# Full logs go to $OUT; a short table is printed last. The build stage builds the benchmark too (most stages run
# it); CMAKE_ARGS adds options (e.g. -DFLASH4_BENCH_VARIANTS=OFF). BUNDLE=1 packs $OUT into device-out.tgz.
set -uo pipefail
OUT=build/device-out
if [[ ${1:-} == --out ]]; then
  OUT=$2
  shift 2
fi
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-lead}
STAGES=${*:-test bench}
summary=()

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

for stage in $STAGES; do
  case $stage in
    build)
      cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASH4_CUDA=ON -DFLASH4_BUILD_BENCH=ON ${CMAKE_ARGS:-} >"$OUT/build.log" 2>&1 &&
        cmake --build "$BUILD_DIR" -j 16 >>"$OUT/build.log" 2>&1
      summary+=("build: rc=$?")
      grep -E "error" "$OUT/build.log" | head -20
      ;;
    test)
      # A deadlocked kernel must not eat the whole device call (rc 124 = the limit was hit).
      timeout "${TEST_LIMIT_S:-400}" "$BUILD_DIR/tests/flash4_gpu_tests" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} \
        >"$OUT/gpu-tests.log" 2>&1
      rc=$?
      summary+=("gpu tests: rc=$rc; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gpu-tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|error" "$OUT/gpu-tests.log" | head -20
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout "${SANITIZE_LIMIT_S:-240}" compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD_DIR/tests/flash4_gpu_tests" \
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
      # Per-instruction stall samples (source page, SASS) of the same launch, for finding the hot stalls.
      ncu --clock-control none -k regex:fwd_kernel -s 3 -c 1 --section SourceCounters --section WarpStateStats \
        --import-source no -o "$OUT/source" -f "$BUILD_DIR/bench/flash4_bench" --iters 3 \
        --shape "${PROFILE_SHAPE:-128:8192:0}" >"$OUT/ncu-source.log" 2>&1 &&
        ncu -i "$OUT/source.ncu-rep" --page source --csv --print-source sass >"$OUT/source-sass.csv" 2>>"$OUT/ncu-source.log"
      summary+=("ncu source: rc=$?")
      cuobjdump -sass "$BUILD_DIR/bench/flash4_bench" 2>/dev/null | awk '/Function : .*fwd_kernel.*Li128ELb0E/{p=1} p&&/Function : /&&!/Li128ELb0E/{p=0} p' |
        grep -oE '^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9.]+' | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -40 >"$OUT/sass-mix.txt"
      ;;
    profile-decode)
      # Nsight Compute on one decode launch of the row DECODE_ROW (batch:seqlen, default 8:32768; contiguous cache).
      ncu --clock-control none -k regex:decode_kernel -s 5 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
        "$BUILD_DIR/bench/flash4_bench" --decode --iters 3 --decode-row "${DECODE_ROW:-8:32768}" >"$OUT/ncu-decode.txt" 2>&1
      summary+=("ncu decode: rc=$?")
      grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Eligible Warps|No Eligible|Registers Per|Block Size|Grid Size|Theoretical Occ|Stall" "$OUT/ncu-decode.txt" | head -30
      ;;
    bench)
      "$BUILD_DIR/bench/flash4_bench" ${BENCH_ARGS:-} >"$OUT/bench-flash4.jsonl" 2>"$OUT/bench-flash4.err"
      summary+=("flash4 bench: rc=$?")
      PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py ${SDPA_ARGS:-} >"$OUT/bench-sdpa.jsonl" 2>"$OUT/bench-sdpa.err"
      summary+=("sdpa bench: rc=$?")
      python3 bench/compare.py "$OUT/bench-flash4.jsonl" "$OUT/bench-sdpa.jsonl" | tee "$OUT/bench-table.txt"
      ;;
    cli)
      for extra in "" "--causal" "--backward" "--backward --causal --heads-kv 2"; do
        "$BUILD_DIR/apps/flash4" run --batch 2 --seqlen 2048 --heads 16 --heads-kv 16 --head-dim 128 --dtype bf16 \
          --device cuda --check --iters 10 $extra >>"$OUT/cli.log" 2>&1
        summary+=("cli $extra: rc=$? $(grep -E 'PASS|FAIL' "$OUT/cli.log" | tail -1)")
      done
      ;;
    install-python)
      if [[ -n ${WHEEL:-} ]]; then
        # A wheel built here beforehand and carried (minutes of device time saved): installed beside the image's
        # packages, first on the path for the stages after this one (the peers stage adds FA4's path in front).
        python3 -m pip install --no-index --no-deps --target /tmp/flash4-site -q "$WHEEL" >"$OUT/pip.log" 2>&1
        summary+=("pip install of $WHEEL: rc=$?")
        export PYTHONPATH=/tmp/flash4-site${PYTHONPATH:+:$PYTHONPATH}
      else
        FLASH4_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps \
          --force-reinstall -q . >"$OUT/pip.log" 2>&1
        summary+=("pip install: rc=$?")
      fi
      ;;
    python)
      OUT="$OUT/python" bash scripts/device-python.sh >"$OUT/python.log" 2>&1
      summary+=("python: rc=$?")
      sed -n '/== summary/,$p' "$OUT/python.log"
      ;;
    bench-py)
      PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py --impls flash4,cudnn,fa2 >"$OUT/fwd.jsonl" 2>"$OUT/fwd.err"
      summary+=("forward bench (one process): rc=$?")
      : >"$OUT/bwd.jsonl"
      if [[ -z "${SKIP_BACKWARD:-}" ]]; then
        PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py --backward --impls flash4,cudnn,fa2,flash4_deterministic \
          >"$OUT/bwd.jsonl" 2>"$OUT/bwd.err"
        summary+=("backward bench (one process): rc=$?")
      fi
      if [[ -z "${SKIP_ABLATION:-}" ]]; then
        "$BUILD_DIR/bench/flash4_bench" --ablation --rounds 3 --iters 20 >"$OUT/ablation.jsonl" 2>"$OUT/ablation.err"
        PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py --impls cudnn --seqlens 8192 >>"$OUT/ablation.jsonl" 2>/dev/null
      else
        : >"$OUT/ablation.jsonl"
      fi
      python3 bench/report.py collect --out "$OUT/results.json" --gpu "$(head -1 "$OUT/gpu.txt")" \
        --commit "${COMMIT:-unknown}" --forward "$OUT/fwd.jsonl" --backward "$OUT/bwd.jsonl" --ablation "$OUT/ablation.jsonl"
      echo "-- forward"; python3 bench/compare.py "$OUT/fwd.jsonl"
      echo "-- backward"; python3 bench/compare.py "$OUT/bwd.jsonl"
      echo "-- ablation"; python3 bench/compare.py "$OUT/ablation.jsonl"
      ;;
    peers)
      if ! python3 -c "import flash_attn.cute" 2>/dev/null && [[ -f .peers/b/install-fa4.sh ]]; then
        # shellcheck disable=SC1091  # the wheels' installer, packed by ../shared/peers/pack-fa4.sh (git-ignored)
        source .peers/b/install-fa4.sh >"$OUT/peers-install.log" 2>&1
      fi
      if ! python3 -c "import flash_attn.cute" >>"$OUT/peers-install.log" 2>&1; then
        summary+=("peers: skipped, flash_attn.cute (FlashAttention-4) does not import; see $OUT/peers-install.log")
      else
        read -ra peers_extra <<<"${PEERS_ARGS:-}"
        peers_args=(--impls "${PEERS_IMPLS:-flash4,fa4,cudnn,fa2}" --single --dims "${PEERS_DIMS:-64,128,256}"
                    --seqlens "${PEERS_SEQLENS:-1024,2048,4096,8192,16384}" "${peers_extra[@]}")
        PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py "${peers_args[@]}" >"$OUT/peers-fwd.jsonl" 2>"$OUT/peers-fwd.err"
        summary+=("peers forward (one process): rc=$?")
        : >"$OUT/peers-bwd.jsonl"
        if [[ -z "${PEERS_SKIP_BACKWARD:-}" ]]; then
          PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py --backward "${peers_args[@]}" >"$OUT/peers-bwd.jsonl" \
            2>"$OUT/peers-bwd.err"
          summary+=("peers backward (one process): rc=$?")
        fi
        python3 bench/report.py collect --out "$OUT/peers-results.json" --gpu "$(head -1 "$OUT/gpu.txt")" \
          --commit "${COMMIT:-unknown}" --forward "$OUT/peers-fwd.jsonl" --backward "$OUT/peers-bwd.jsonl"
        { echo "-- forward (TFLOP/s)"; python3 bench/compare.py "$OUT/peers-fwd.jsonl"
          echo "-- backward (TFLOP/s)"; python3 bench/compare.py "$OUT/peers-bwd.jsonl"; } | tee "$OUT/peers-table.txt"
      fi
      ;;
    host)
      # Host microseconds per call: the C++ API and its parts (flash4_bench --host), then the Python paths next to
      # SDPA (bench/host_overhead.py; needs the package installed: install-python first).
      "$BUILD_DIR/bench/flash4_bench" --host >"$OUT/host-cpp.jsonl" 2>"$OUT/host-cpp.err"
      summary+=("host costs (C++): rc=$?")
      PYTHONUNBUFFERED=1 python3 bench/host_overhead.py >"$OUT/host-python.txt" 2>&1
      summary+=("host costs (Python): rc=$?")
      python3 - "$OUT/host-cpp.jsonl" <<'PY'
import json, sys
print(f"{'C++ host us per call':<42} {'no sync':>8} {'sync':>8}")
for r in map(json.loads, open(sys.argv[1])):
    print(f"{r['item']:<42} {r['us_per_call']:8.1f} {r['us_per_call_sync']:8.1f}")
PY
      cat "$OUT/host-python.txt"
      ;;
    candidates)
      "$BUILD_DIR/bench/flash4_bench" --candidates ${BENCH_ARGS:-} >"$OUT/candidates.jsonl" 2>"$OUT/candidates.err"
      summary+=("candidates: rc=$?")
      if [[ -x devbin/old/flash4_bench_old ]]; then
        devbin/old/flash4_bench_old ${BENCH_ARGS:-} 2>/dev/null | sed 's/"impl": "flash4"/"impl": "flash4_old"/' >>"$OUT/candidates.jsonl"
      fi
      PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py --impls cudnn ${SDPA_ARGS:-} >>"$OUT/candidates.jsonl" 2>"$OUT/candidates-sdpa.err"
      python3 bench/compare.py "$OUT/candidates.jsonl" | tee "$OUT/candidates-table.txt"
      ;;
    ab)
      olds=(devbin/old/flash4_bench_*)
      : >"$OUT/ab.jsonl"
      for round in $(seq 1 "${AB_ROUNDS:-3}"); do
        bins=("new:$BUILD_DIR/bench/flash4_bench")
        for old in "${olds[@]}"; do [[ -x $old ]] && bins+=("${old##*/flash4_bench_}:$old"); done
        # Alternate the order each round, so that drift (clocks, the power cap) hits every build alike.
        if ((round % 2 == 0)); then bins=($(printf '%s\n' "${bins[@]}" | tac)); fi
        for entry in "${bins[@]}"; do
          tag=${entry%%:*}
          bin=${entry#*:}
          passes=("" "--backward")
          [[ ${AB_PASSES:-both} == forward ]] && passes=("")
          [[ ${AB_PASSES:-both} == backward ]] && passes=("--backward")
          for pass in "${passes[@]}"; do
            timeout "${AB_LIMIT_S:-150}" "$bin" $pass --seqlens "${AB_SEQLENS:-1024,4096,16384}" --iters 30 2>>"$OUT/ab.err" |
              sed "s/\"impl\": \"/\"round\": $round, \"impl\": \"${tag}_/" >>"$OUT/ab.jsonl"
          done
        done
      done
      summary+=("A/B: $(wc -l <"$OUT/ab.jsonl") timings")
      python3 bench/ab_table.py "$OUT/ab.jsonl" --old "${AB_OLD:-old}" | tee "$OUT/ab-table.txt"
      ;;
    decode)
      timeout "${TEST_LIMIT_S:-400}" "$BUILD_DIR/tests/flash4_gpu_tests" --gtest_filter="${DECODE_FILTER:-KvCache*:DecodeRoute*}" \
        >"$OUT/decode-tests.log" 2>&1
      summary+=("decode tests: rc=$?; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/decode-tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure" "$OUT/decode-tests.log" | head -20
      timeout "${DECODE_LIMIT_S:-400}" "$BUILD_DIR/bench/flash4_bench" --decode --iters 30 \
        --decode-splits "${DECODE_SPLITS:-0}" >"$OUT/decode.jsonl" 2>"$OUT/decode.err"
      summary+=("decode bench: rc=$? $(wc -l <"$OUT/decode.jsonl") rows")
      if python3 -c "import torch" 2>/dev/null; then
        PYTHONUNBUFFERED=1 timeout "${DECODE_LIMIT_S:-400}" python3 bench/decode_bench.py >"$OUT/decode-py.jsonl" \
          2>"$OUT/decode-py.err"
        summary+=("decode python bench: rc=$? $(wc -l <"$OUT/decode-py.jsonl") rows")
      fi
      python3 - "$OUT/decode.jsonl" <<'PY'
import json, sys
print(f"{'impl':<16} {'layout':<11} {'b x s':>10} {'sq':>4} {'splits':>6} {'us':>9} {'TB/s':>6} {'TFLOP/s':>8} {'single':>8} {'graph':>8}")
for r in map(json.loads, open(sys.argv[1])):
    print(f"{r['impl']:<16} {r['layout']:<11} {str(r['b']) + 'x' + str(r['s']):>10} {r['sq']:>4} {r['splits']:>6} "
          f"{r['us']:9.1f} {r['tbps']:6.2f} {r['tflops']:8.1f} {r['us_single']:8.1f} {r['us_graph']:8.1f}")
PY
      ;;
    fp8)
      timeout "${TEST_LIMIT_S:-300}" "$BUILD_DIR/tests/flash4_gpu_tests" --gtest_filter='*GpuFp8Forward*' \
        >"$OUT/fp8-tests.log" 2>&1
      summary+=("fp8 tests: rc=$?; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/fp8-tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure" "$OUT/fp8-tests.log" | head -20
      timeout "${AB_LIMIT_S:-300}" "$BUILD_DIR/bench/flash4_bench" --fp8 --rounds 3 --iters 20 \
        --seqlens "${FP8_SEQLENS:-1024,4096,16384}" >"$OUT/fp8.jsonl" 2>"$OUT/fp8.err"
      summary+=("fp8 bench: rc=$? $(wc -l <"$OUT/fp8.jsonl") rows")
      python3 - "$OUT/fp8.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bf16 = {(r['d'], r['s'], r['causal']): r for r in rows if r['impl'] == 'flash4'}
print(f"{'d':>4} {'s':>6} {'causal':>6} {'bf16 TF/s':>10} {'fp8 TF/s':>9} {'fp8/bf16':>8}")
for r in rows:
    if r['impl'] != 'flash4_fp8':
        continue
    b = bf16.get((r['d'], r['s'], r['causal']))
    if b:
        print(f"{r['d']:>4} {r['s']:>6} {str(r['causal']):>6} {b['tflops']:>10.1f} {r['tflops']:>9.1f} "
              f"{r['tflops'] / b['tflops']:>8.2f}")
PY
      ;;
    varlen-peers)
      [[ -f .peers/b/install-fa4.sh ]] && source .peers/b/install-fa4.sh >"$OUT/fa4-install.log" 2>&1
      PYTHONUNBUFFERED=1 timeout "${VARLEN_PEERS_LIMIT_S:-400}" python3 bench/varlen_peers.py --out "$OUT/varlen-peers.json" \
        ${VARLEN_PEERS_ARGS:-} >"$OUT/varlen-peers.jsonl" 2>"$OUT/varlen-peers.err"
      summary+=("varlen-peers: rc=$? $(wc -l <"$OUT/varlen-peers.jsonl") timings")
      grep -A30 "^# pass" "$OUT/varlen-peers.err" | head -30
      ;;
    train-hf)
      PYTHONUNBUFFERED=1 timeout "${TRAIN_HF_LIMIT_S:-300}" python3 bench/transformers_train.py ${TRAIN_HF_ARGS:-} \
        >"$OUT/train-hf.jsonl" 2>"$OUT/train-hf.err"
      summary+=("train-hf: rc=$? $(wc -l <"$OUT/train-hf.jsonl") timings")
      cat "$OUT/train-hf.jsonl"
      ;;
    varlen)
      timeout "${AB_LIMIT_S:-300}" "$BUILD_DIR/bench/flash4_bench" --varlen --iters 20 >"$OUT/varlen.jsonl" 2>"$OUT/varlen.err"
      summary+=("varlen: rc=$? $(wc -l <"$OUT/varlen.jsonl") timings")
      ;;
    ab-src)
      mkdir -p devbin/old
      pids=()
      for src in devsrc/*/; do
        tag=$(basename "$src")
        (cmake -S "$src" -B "build-ab-$tag" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH4_CUDA=ON -DFLASH4_DTYPES=bf16 \
           -DFLASH4_BUILD_TESTS=ON -DFLASH4_BUILD_APPS=OFF -DFLASH4_BUILD_BENCH=ON -DFLASH4_BENCH_VARIANTS=OFF &&
           cmake --build "build-ab-$tag" --target flash4_bench &&
           cp "build-ab-$tag/bench/flash4_bench" "devbin/old/flash4_bench_$tag") >"$OUT/ab-src-$tag.log" 2>&1 &
        pids+=($!)
      done
      built=0
      for pid in "${pids[@]}"; do wait "$pid" && built=$((built + 1)); done
      summary+=("ab-src: built $built of ${#pids[@]} source trees")
      ;;
    ab-bwd)
      # A hung build (a deadlock in a WIP kernel) must not eat the whole device call: each run has its own limit.
      timeout "${AB_LIMIT_S:-150}" "$BUILD_DIR/bench/flash4_bench" --backward ${BENCH_ARGS:-} >"$OUT/ab-bwd.jsonl" 2>"$OUT/ab-bwd.err"
      summary+=("backward A/B (new): rc=$?")
      # Every carried devbin/old/flash4_bench_<tag> (other commits' builds) runs too, reported as <tag>_flash4.
      for old in devbin/old/flash4_bench_*; do
        [[ -x $old ]] || continue
        tag=${old##*/flash4_bench_}
        timeout "${AB_LIMIT_S:-150}" "$old" --backward ${BENCH_ARGS:-} 2>/dev/null | sed "s/\"impl\": \"flash4/\"impl\": \"${tag}_flash4/" >>"$OUT/ab-bwd.jsonl"
      done
      PYTHONUNBUFFERED=1 python3 bench/sdpa_bench.py --backward --impls cudnn ${SDPA_ARGS:-} >>"$OUT/ab-bwd.jsonl" \
        2>"$OUT/ab-bwd-sdpa.err"
      python3 bench/compare.py "$OUT/ab-bwd.jsonl" | tee "$OUT/ab-bwd-table.txt"
      ;;
    profile-bwd)
      # Nsight Compute on the backward main kernel of one shape (PROFILE_BWD_SHAPE, D:S:C): flash4_bench --backward
      # --iters 3 launches it 3 + 3 times non-deterministic, then 3 + 3 deterministic; launches 4, 5 are
      # non-deterministic, 6 is the first deterministic one.
      timeout "${PROFILE_LIMIT_S:-240}" ncu --clock-control none -k regex:bwd_wgmma_kernel -s 4 -c 3 --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section InstructionStats "$BUILD_DIR/bench/flash4_bench" --backward --iters 3 \
        --shape "${PROFILE_BWD_SHAPE:-128:16384:0}" >"$OUT/ncu-bwd.txt" 2>&1
      summary+=("ncu bwd: rc=$?")
      # Per-instruction stall samples of the deterministic launch (where do its warps wait?).
      timeout "${PROFILE_LIMIT_S:-240}" ncu --clock-control none -k regex:bwd_wgmma_kernel -s 6 -c 1 --section SourceCounters \
        --section WarpStateStats --import-source no -o "$OUT/source-bwd-det" -f "$BUILD_DIR/bench/flash4_bench" --backward \
        --iters 3 --shape "${PROFILE_BWD_SHAPE:-128:16384:0}" >"$OUT/ncu-bwd-source.log" 2>&1 &&
        ncu -i "$OUT/source-bwd-det.ncu-rep" --page source --csv --print-source sass >"$OUT/source-bwd-det.csv" \
          2>>"$OUT/ncu-bwd-source.log"
      summary+=("ncu bwd det source: rc=$?")
      python3 bench/stall_sites.py "$OUT/source-bwd-det.csv" --top 30 >"$OUT/stall-sites-bwd-det.txt" 2>&1
      grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Stall|Grid Size" \
        "$OUT/ncu-bwd.txt" | head -60
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
# The device tool brings back at most 8 files from $OUT: BUNDLE=1 packs everything into one archive instead.
if [[ -n "${BUNDLE:-}" ]]; then
  tar -C "$OUT" -czf /tmp/device-out.tgz . && find "$OUT" -mindepth 1 -delete && mv /tmp/device-out.tgz "$OUT/"
fi
