#!/usr/bin/env bash
# Session 2, device call 1: tensor-core kernel check + timing, ncu profiles, eager call,
# reliability runs, suite trial, GPU tests (as far as time allows).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
timeout 220 python3 bench/proto/run_mma_proto.py --gpu 2>&1 | tee "$OUT/proto.txt" | grep -v "^    all:"
NCU="ncu --clock-control none --kernel-name regex:gemv --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis"
timeout 50 $NCU python3 bench/proto/run_mma_proto.py --ncu 28672 4096 0 0 0 0 > "$OUT/ncu_prod.txt" 2>&1; echo "ncu classic rc=$?"
timeout 50 $NCU python3 bench/proto/run_mma_proto.py --ncu 28672 4096 4 1 2 2 > "$OUT/ncu_mma.txt" 2>&1; echo "ncu mma rc=$?"
grep -E "DRAM Throughput|Duration|Achieved Occupancy|Issue Slots Busy|Registers Per|Warp Cycles Per Issued|No Eligible|L1/TEX Hit|L2 Hit" "$OUT"/ncu_*.txt
timeout 40 python3 bench/eager.py 2>&1 | tail -3
timeout 120 python3 bench/reliability_gpu.py 2>&1 | tee "$OUT/reliability.txt" | tail -6
timeout 90 python3 bench/suite.py --shapes 4096x4096,896x896 --groups 128 2>&1 | tee "$OUT/suite_trial.txt" | tail -3
LEFT=$(( 570 - ($(date +%s) - T0) ))
echo "pytest budget ${LEFT}s"
[ $LEFT -gt 30 ] && timeout $LEFT python3 -m pytest tests/test_gemv_gpu.py -q -x -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -5
