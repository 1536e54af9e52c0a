#!/usr/bin/env bash
# Device call C: int4jit and the four peers on the suite (bench/suite.py -> RESULTS.md, JSON, PNG).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 560 python3 bench/suite.py 2>&1 | tee "$OUT/suite.txt" | grep -v '^{' | tail -5
cp bench/RESULTS.md bench/results/*-h200.* "$OUT/" 2>/dev/null
ls "$OUT"
