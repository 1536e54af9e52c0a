#!/usr/bin/env bash
# Device call A: tensor-core kernel check + timing vs the CUDA-core kernel, ncu profiles of
# both, the eager call, then the shipped table re-tuned (table.json comes back under $OUT).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
timeout 170 python3 bench/proto/run_mma_proto.py --gpu 2>&1 | tee "$OUT/proto.txt" | grep -v "^    all:"
NCU="ncu --clock-control none --kernel-name regex:gemv --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis"
timeout 45 $NCU python3 bench/proto/run_mma_proto.py --ncu 28672 4096 0 0 0 0 > "$OUT/ncu_prod.txt" 2>&1; echo "ncu classic rc=$?"
timeout 45 $NCU python3 bench/proto/run_mma_proto.py --ncu 28672 4096 8 4 1 4 > "$OUT/ncu_mma.txt" 2>&1; echo "ncu mma rc=$?"
grep -E "DRAM Throughput|Duration|Achieved Occupancy|Issue Slots Busy|Registers Per|Warp Cycles Per Issued|No Eligible|L2 Hit" "$OUT"/ncu_*.txt
timeout 40 python3 bench/eager.py 2>&1 | tail -3
timeout 280 python3 bench/make_table.py --out-dir "$OUT" 2>&1 | tee "$OUT/make_table.txt" | tail -8
cp int4jit/table.json "$OUT/table.json"
