#!/usr/bin/env bash
# Device call A: both kernels (with L2 prefetch) checked and timed, ncu of both at 28672x4096,
# then the suite tuned exhaustively for each kernel (two tables come back under $OUT).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/mma" "$OUT/simt"
timeout 150 python3 bench/proto/run_mma_proto.py --gpu 2>&1 | tee "$OUT/proto.txt" | grep -v "^    all:"
NCU="ncu --clock-control none --kernel-name regex:gemv --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis"
timeout 40 $NCU python3 bench/proto/run_mma_proto.py --ncu 28672 4096 0 0 0 0 > "$OUT/ncu_prod.txt" 2>&1; echo "ncu classic rc=$?"
timeout 40 $NCU python3 bench/proto/run_mma_proto.py --ncu 28672 4096 4 4 1 4 > "$OUT/ncu_mma.txt" 2>&1; echo "ncu mma rc=$?"
grep -E "DRAM Throughput|Duration|Issue Slots Busy|No Eligible|L2 Hit" "$OUT"/ncu_*.txt
for k in mma simt; do
  cp int4jit/table.json /tmp/table_$k.json
  INT4JIT_KERNEL=$k timeout 150 python3 bench/make_table.py --table /tmp/table_$k.json --out-dir "$OUT/$k" > "$OUT/$k/make_table.txt" 2>&1
  echo "$k table rc=$?"; tail -1 "$OUT/$k/make_table.txt"; cp /tmp/table_$k.json "$OUT/$k/table.json"
done
grep -h "Llama-3-8B\|Phi-4" "$OUT"/mma/make_table.txt "$OUT"/simt/make_table.txt | grep "/asym" | sort -k2,2 -s
