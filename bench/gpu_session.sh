#!/usr/bin/env bash
# One device call for a release check on the H200 (carry .whl and .peers; ~10 minutes):
#   1. the gpu-marked tests, 2. table.json re-tuned (bench/make_table.py, both symmetries),
#   3. the suite against the four peers (bench/suite.py -> RESULTS.md, JSON, PNG).
# Everything it writes that should come back lands in $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
step=${1:-all}
if [[ $step == all || $step == tests ]]; then
    timeout 300 python3 -m pytest tests -q -m gpu -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -3
fi
if [[ $step == all || $step == table ]]; then
    timeout 200 python3 bench/make_table.py --out-dir "$OUT" 2>&1 | tee "$OUT/table-log.txt" | tail -2
    cp int4jit/table.json "$OUT/"
fi
if [[ $step == all || $step == suite ]]; then
    timeout 400 python3 bench/suite.py 2>&1 | tee "$OUT/suite.txt" | grep -v '^{' | tail -5
    cp bench/RESULTS.md bench/results/*-h200.* "$OUT/" 2>/dev/null
fi
ls "$OUT"
