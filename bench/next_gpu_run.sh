#!/usr/bin/env bash
# Everything still waiting for a GPU, in one device call (~6 min): run from the repo root on the
# H200 with .whl carried (platformdirs; plus bitsandbytes and .peers/ from bench/fetch_peers.sh).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 120 python3 bench/proto/run_mma_proto.py --gpu 2>&1 | tee "$OUT/proto.txt"
timeout 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 python3 bench/sanitize_sweep.py > "$OUT/memcheck.txt" 2>&1; echo "memcheck rc=$?"; tail -2 "$OUT/memcheck.txt"
timeout 150 python3 bench/reliability_gpu.py 2>&1 | tee "$OUT/reliability.txt" | tail -4
timeout 240 python3 bench/suite.py > "$OUT/suite.txt" 2>&1; echo "suite rc=$?"; cp bench/RESULTS.md bench/results/*-h200.* "$OUT/" 2>/dev/null; tail -3 "$OUT/suite.txt"
