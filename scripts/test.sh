#!/usr/bin/env bash
# Builds flash4 and runs every test, on a fresh Debian machine too (as root it installs what is missing).
#   bash scripts/test.sh
# CUDA is AUTO: where nvcc is found the Hopper kernels and GPU tests are compiled as well (they run only on a
# GPU machine; see scripts/device-check.sh). Environment: FLASH4_BUILD_DIR (default build/test),
# FLASH4_CUDA (AUTO, ON, OFF).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=$(realpath -m "${FLASH4_BUILD_DIR:-build/test}")
jobs=$(nproc)

# ---- dependencies (Debian packages), installed only when missing ------------------------------------------
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v g++ >/dev/null || missing+=(g++)
[[ -e /usr/include/gtest/gtest.h ]] || missing+=(libgtest-dev)
if ((${#missing[@]})); then
  echo "== installing ${missing[*]}"
  sudo_cmd=(); [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# nvcc is often installed outside PATH.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi

# ---- configure, build -------------------------------------------------------------------------------------
echo "== configure ($build_dir, FLASH4_CUDA=${FLASH4_CUDA:-AUTO})"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH4_CUDA="${FLASH4_CUDA:-AUTO}" >/dev/null
echo "== build ($jobs jobs)"
start=$SECONDS
cmake --build "$build_dir" -j "$jobs"
echo "== build took $((SECONDS - start)) s"

# ---- C++ tests --------------------------------------------------------------------------------------------
echo "== ctest"
ctest_log="$build_dir/ctest.log"
ctest_status=0
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900 >"$ctest_log" 2>&1 || ctest_status=$?
# The full log stays in $ctest_log; show failures and the totals, not one line per passing test.
grep -vE "^ *Start +[0-9]+:|Test +#[0-9]+: .* Passed " "$ctest_log" || true
ctest_summary=$(grep -E "tests passed, [0-9]+ tests? failed out of" "$ctest_log" | tail -1 || true)

# ---- install + find_package from a separate project -------------------------------------------------------
echo "== install check"
install_status=0
prefix="$build_dir/install-prefix"
rm -rf "$prefix" "$build_dir/install-check"
{
  cmake --install "$build_dir" --prefix "$prefix" >/dev/null &&
    cmake -S tests/install -B "$build_dir/install-check" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" >/dev/null &&
    cmake --build "$build_dir/install-check" >/dev/null &&
    "$build_dir/install-check/flash4_install_check"
} || install_status=1

# ---- kernel resources: every GPU kernel's registers, stack, shared memory and spills against the record -----
# (scripts/kernel_resources.py, tests/kernel_resources.json): a kernel that starts spilling fails here, no GPU needed.
resources_status=0
resources_summary="skipped: built without CUDA"
if grep -q "^CMAKE_CUDA_COMPILER:[A-Z]*=." "$build_dir/CMakeCache.txt"; then
  echo "== kernel resources (scripts/kernel_resources.py)"
  cuobjdump=$(command -v cuobjdump || true)
  [[ -z $cuobjdump && -x /usr/local/cuda/bin/cuobjdump ]] && cuobjdump=/usr/local/cuda/bin/cuobjdump
  if [[ -z $cuobjdump ]]; then
    # Toolkits installed without it: the same tools from PyPI (cuobjdump and the nvdisasm its -sass runs, 6 MB),
    # pinned so that the disassembly stays comparable.
    python3 -m pip install -q --target "$build_dir/tools" "nvidia-cuda-cuobjdump==13.5.37" \
      "nvidia-cuda-nvdisasm==13.5.37" >/dev/null 2>&1 || true
    cuobjdump=$(find "$build_dir/tools/nvidia" -path "*/bin/cuobjdump" 2>/dev/null | head -1)
  fi
  if [[ -n $cuobjdump ]]; then
    python3 scripts/kernel_resources.py check "$build_dir/src/libflash4.a" --cuobjdump "$cuobjdump" \
      >"$build_dir/kernel-resources.log" 2>&1 || resources_status=$?
    cat "$build_dir/kernel-resources.log"
    resources_summary=$(grep -E "^kernel_resources: [0-9]+ kernels" "$build_dir/kernel-resources.log" | tail -1 || true)
    resources_summary="${resources_summary:-no summary} ($( ((resources_status)) && echo FAILED || echo passed))"
  else
    resources_summary="skipped: no cuobjdump (the toolkit lacks it and pip could not install nvidia-cuda-cuobjdump)"
  fi
fi

# ---- Python tests -----------------------------------------------------------------------------------------
echo "== python tests (scripts/test-python.sh)"
python_status=0
python_log="$build_dir/python-tests.log"
bash scripts/test-python.sh 2>&1 | tee "$python_log" || python_status=$?
python_summary=$(grep -E "[0-9]+ (passed|failed|error).* in [0-9.]+s" "$python_log" | tail -1 || true)
python_summary=${python_summary:-"no summary (exit $python_status)"}

# ---- sanitizers: the CPU library, the CLI and their tests under ASan + UBSan (preset asan) -------------------
# Tests that run under `ulimit -v` are left out (label ulimit): a sanitizer's shadow memory cannot fit the limit.
echo "== sanitizers (preset asan)"
asan_dir="$build_dir-asan"
sanitizer_status=0
start=$SECONDS
{
  cmake --preset asan -B "$asan_dir" >/dev/null &&
    cmake --build "$asan_dir" -j "$jobs" >"$asan_dir.build.log" 2>&1 &&
    ctest --test-dir "$asan_dir" -LE ulimit --output-on-failure -j "$jobs" --timeout 900 >"$asan_dir.ctest.log" 2>&1
} || sanitizer_status=1
if ((sanitizer_status)); then
  tail -60 "$asan_dir.build.log" 2>/dev/null || true
  grep -vE "^ *Start +[0-9]+:|Test +#[0-9]+: .* Passed " "$asan_dir.ctest.log" 2>/dev/null || true
fi
sanitizer_summary=$(grep -E "tests passed, [0-9]+ tests? failed out of" "$asan_dir.ctest.log" 2>/dev/null | tail -1 || true)
sanitizer_summary="${sanitizer_summary:-no summary (exit $sanitizer_status)} ($((SECONDS - start)) s)"

# ---- fuzzing: a short run of each libFuzzer target (scripts/fuzz.sh) where clang has libFuzzer --------------
echo "== fuzzing (scripts/fuzz.sh, ${FLASH4_FUZZ_SECONDS:-60} s per target)"
fuzz_status=0
start=$SECONDS
if command -v clang++ >/dev/null &&
  echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
  clang++ -x c++ -fsanitize=fuzzer - -o "$build_dir/libfuzzer-probe" >/dev/null 2>&1; then
  bash scripts/fuzz.sh "${FLASH4_FUZZ_SECONDS:-60}" | tee "$build_dir/fuzz.log" || fuzz_status=$?
  fuzz_summary="$(grep -E '^fuzz total' "$build_dir/fuzz.log" || echo "no total (exit $fuzz_status)"), $( ((fuzz_status)) && echo FAILED || echo no crash) ($((SECONDS - start)) s)"
else
  fuzz_summary="skipped: no clang++ with libFuzzer (apt-get install clang)"
fi

# ---- summary ----------------------------------------------------------------------------------------------
echo
echo "== summary"
echo "C++ tests:     ${ctest_summary:-no summary (ctest exit $ctest_status)}"
echo "install check: $([[ $install_status -eq 0 ]] && echo passed || echo FAILED)"
echo "kernels:       $resources_summary"
echo "Python tests:  $python_summary"
echo "sanitizers:    $sanitizer_summary"
echo "fuzzing:       $fuzz_summary"
if ((ctest_status || install_status || resources_status || python_status || sanitizer_status || fuzz_status)); then
  echo "RESULT: FAILED"
  exit 1
fi
echo "RESULT: all tests passed"
