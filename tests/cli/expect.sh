#!/usr/bin/env bash
# Runs the flash4 CLI and checks its exit code and that its output (stdout and stderr) matches a pattern.
#   expect.sh FLASH4 EXIT_CODE EXTENDED_REGEX LIMIT_KIB|- ARGS...
# LIMIT_KIB: run under `ulimit -v` (a request the CLI fails to refuse then ends in std::bad_alloc, not the OOM killer).
set -uo pipefail
cli=$1 expected=$2 pattern=$3 limit=$4
shift 4
output=$( (if [[ $limit != - ]]; then ulimit -v "$limit"; fi; exec "$cli" "$@") 2>&1)
status=$?
printf '%s\n' "$output"
echo "-- exit code $status (expected $expected)"
if [[ $status -ne $expected ]]; then echo "FAIL: exit code"; exit 1; fi
if ! grep -qE -- "$pattern" <<<"$output"; then echo "FAIL: output does not match: $pattern"; exit 1; fi
echo "ok"
