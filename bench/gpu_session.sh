#!/usr/bin/env bash
# A release check on the H200 (carry .whl and .peers), in steps that each fit one device call
# (10 minutes at most): `tests` (the gpu-marked tests, ~4 min) and `table` (table.json re-tuned
# by bench/make_table.py, both symmetries, ~1.5 min) together, then the suite (bench/suite.py
# against the four peers; over 6.5 min for both groups in session 4) one group per call:
#   bash bench/gpu_session.sh tests table;  bash bench/gpu_session.sh suite128;  bash bench/gpu_session.sh suite32
# then, here: python3 bench/suite.py --from-log suite-g128.txt suite-g32.txt  (RESULTS.md, JSON, PNG)
# and `profile` (~2 min): the per-warp timeline of the shapes whose shortfall has no timeline yet
# (35840x5120, 16384x2048, 7680x5120 at g128; 28672x4096 g32, now one wave as tuned) and the
# eager per-call time (bench/eager.py); `ab` (~2-3 min): tc_ab.py's prepared variants against
# the default (correctness first) on the shapes they were built for.
# Everything it writes that should come back lands in $OUT: at most 8 files come back from one
# call (session 8 lost table.json behind ncu reports) and names with "=" do not come back.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
steps=" ${*:-tests table suite128 suite32} "
if [[ $steps == *" tests "* ]]; then
    timeout 300 python3 -m pytest tests -q -m gpu -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -3
fi
if [[ $steps == *" table "* ]]; then
    timeout 200 python3 bench/make_table.py --out-dir "$OUT" 2>&1 | tee "$OUT/table-log.txt" | tail -2
    cp int4jit/table.json "$OUT/"
fi
if [[ $steps == *" profile "* ]]; then
    timeout 200 python3 bench/proto/timeline.py 35840 5120 128 16384 2048 128 7680 5120 128 28672 4096 32 > "$OUT/timeline.txt" 2>&1
    echo "timeline rc=$?"; grep "call B phases" "$OUT/timeline.txt"
    timeout 120 python3 bench/eager.py 2>&1 | tee "$OUT/eager.txt"
fi
if [[ $steps == *" ab "* ]]; then
    timeout 400 python3 bench/proto/tc_ab.py --variants tc kcluster "one wave" "8 loads" --shapes 5120x17920x128 \
        4096x14336x128 28672x4096x128 35840x5120x128 28672x4096x32 128256x4096x32 4096x14336x32 5120x17920x32 \
        2048x8192x32 > "$OUT/tc-ab.txt" 2>&1
    echo "tc_ab rc=$?"; tail -12 "$OUT/tc-ab.txt"
fi
for g in 128 32; do
    if [[ $steps == *" suite$g "* ]]; then
        timeout 560 python3 bench/suite.py --groups $g 2>&1 | tee "$OUT/suite-g$g.txt" | grep -v '^{' | tail -3
    fi
done
ls "$OUT"
