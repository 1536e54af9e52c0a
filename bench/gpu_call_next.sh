#!/usr/bin/env bash
# The next session's first device call (carry .whl): the prepared A/B experiments of issue 4.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/platformdirs*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 560 python3 bench/proto/ab_next.py 2>&1 | tee "$OUT/ab_next.txt"
