set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 INT4JIT_CACHE_DIR=/tmp/i4c
timeout 300 python3 bench/proto/tc_ab.py --variants tc xwarp xwarp+xperm > $OUT/tc-ab.txt 2>&1; echo "tc_ab rc=$?"
tail -17 $OUT/tc-ab.txt
timeout 100 python3 bench/proto/timeline.py 28672 4096 128 4096 14336 128 5120 17920 128 --variant xwarp=1 > $OUT/timeline-xwarp.txt 2>&1; echo "tl rc=$?"
timeout 60 python3 bench/proto/timeline.py 4096 14336 128 5120 17920 128 --variant xwarp=1 xperm=1 > $OUT/timeline-xwarp-xperm.txt 2>&1; echo "tl2 rc=$?"
grep -E "^[0-9]|call B phases|E2|E3" $OUT/timeline-xwarp*.txt | grep -v " A " 
