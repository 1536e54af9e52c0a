#!/usr/bin/env bash
# Session 2, device call 1: tensor-core kernel check + timing, ncu profiles, reliability, suite trial.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
timeout 200 python3 bench/proto/run_mma_proto.py --gpu 2>&1 | tee "$OUT/proto.txt" | grep -v "^    all:"
NCU="ncu --clock-control none --kernel-name regex:gemv --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis"
timeout 60 $NCU python3 bench/proto/run_mma_proto.py --ncu 28672 4096 0 0 0 0 > "$OUT/ncu_prod.txt" 2>&1; echo "ncu prod rc=$?"
timeout 60 $NCU python3 bench/proto/run_mma_proto.py --ncu 28672 4096 4 1 2 2 > "$OUT/ncu_mma.txt" 2>&1; echo "ncu mma rc=$?"
grep -E "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Issue Slots Busy|Registers Per|Warp Cycles Per Issued|No Eligible" "$OUT"/ncu_*.txt
timeout 150 python3 bench/reliability_gpu.py 2>&1 | tee "$OUT/reliability.txt" | tail -6
timeout 120 python3 bench/suite.py --shapes 4096x4096,896x896 --groups 128 2>&1 | tee "$OUT/suite_trial.txt" | tail -4
