#!/usr/bin/env bash
# Device call B: the GPU tests, compute-sanitizer memcheck + racecheck, the reliability runs.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/platformdirs*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 260 python3 -m pytest tests -q -x -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -6
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 1 python3 bench/sanitize_sweep.py > "$OUT/$tool.txt" 2>&1
  echo "$tool rc=$?"; tail -2 "$OUT/$tool.txt"
done
timeout 130 python3 bench/reliability_gpu.py 2>&1 | tee "$OUT/reliability.txt" | tail -8
