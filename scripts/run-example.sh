#!/usr/bin/env bash
# Builds the `flash4` CLI and runs the main job: a checked attention forward on random data, on the GPU when a
# Hopper GPU is present, else on the CPU. On a fresh Debian machine (as root) it installs what is missing.
#   bash scripts/run-example.sh                 # the default job below
#   bash scripts/run-example.sh --backward ...  # any `flash4 run` options replace the defaults
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=$(realpath -m "${FLASH4_BUILD_DIR:-build/example}")

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v g++ >/dev/null || missing+=(g++)
if ((${#missing[@]})); then
  echo "== installing ${missing[*]}"
  sudo_cmd=(); [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Compile the kernels only where a GPU can run them: a CPU-only build takes a minute, the kernels much longer.
cuda=OFF
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi
  cuda=AUTO
fi

echo "== build flash4 CLI ($build_dir, FLASH4_CUDA=$cuda)"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH4_CUDA=$cuda -DFLASH4_BUILD_TESTS=OFF >/dev/null
cmake --build "$build_dir" --target flash4_cli -j "$(nproc)"

args=("$@")
if ((${#args[@]} == 0)); then
  args=(--batch 1 --seqlen-q 2048 --seqlen-k 2048 --heads 16 --head-dim 128 --dtype bf16 --causal --check)
fi
echo "== flash4 run ${args[*]}"
exec "$build_dir/apps/flash4" run --device auto "${args[@]}"
