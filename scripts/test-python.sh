#!/usr/bin/env bash
# The Python package's CI test: a virtual environment outside the repo, `pip install .` (CPU build), pytest.
#
#   scripts/test-python.sh            # numpy + torch (CPU) tests
#
# Environment:
#   FLASH4_PYENV        where the virtual environment lives (default /tmp/flash4-pyenv; reused if present)
#   FLASH4_TEST_TORCH   1 (default): install torch (and transformers) from PyPI and run the torch tests too;
#                       0: numpy tests only
#   FLASH4_CUDA         passed to the build (default OFF here: the C++ CI already compiles the kernels, and
#                       nvcc would make this build take many minutes on 2 cores)
#   PYTHON              the interpreter to build the environment from (default python3)
# Prints pytest's summary line last; exits non-zero on any failure.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${FLASH4_PYENV:-/tmp/flash4-pyenv}"
with_torch="${FLASH4_TEST_TORCH:-1}"
export FLASH4_CUDA="${FLASH4_CUDA:-OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ folders in the checkout
export PIP_DISABLE_PIP_VERSION_CHECK=1

step() { printf '\n== %s (%ds)\n' "$1" "$SECONDS"; }

step "virtual environment $env_dir"
if [[ ! -x "$env_dir/bin/python" ]]; then
  "${PYTHON:-python3}" -m venv "$env_dir"
fi
py="$env_dir/bin/python"
"$py" --version

step "test dependencies"
"$py" -m pip install -q numpy pytest hypothesis
if [[ "$with_torch" == 1 ]]; then
  # PyPI's Linux torch wheel (it runs on machines without a GPU); already installed means no download. If it
  # cannot be installed (no space, no network), the torch tests report themselves skipped and this says why.
  if "$py" -m pip install -q torch; then
    "$py" -c 'import torch; print("torch", torch.__version__)'
  else
    echo "WARNING: torch could not be installed: the torch tests (autograd, torch.compile) will be SKIPPED"
  fi
  # transformers for tests/python/test_transformers.py (flash4.integrations.transformers); skipped, saying so,
  # when it cannot be installed.
  if ! "$py" -m pip install -q transformers; then
    echo "WARNING: transformers could not be installed: the Hugging Face integration tests will be SKIPPED"
  fi
fi

step "pip install . (FLASH4_CUDA=$FLASH4_CUDA)"
build_start=$SECONDS
"$py" -m pip install -q --force-reinstall --no-deps "$repo"
echo "build + install took $((SECONDS - build_start)) s"
"$py" -c 'import flash4; print("flash4", flash4.__version__, "cuda_available:", flash4.cuda_available())'

step "pytest tests/python"
cd "$repo"
# -p no:cacheprovider: no .pytest_cache in the checkout.
"$py" -m pytest tests/python -q -p no:cacheprovider
