"""Issue 6 on a GPU: four processes tuning one cache dir at once, and a process SIGKILLed in
the middle of tuning; afterwards the DB holds every entry, every code object loads and every
result is right. The processes are bench/reliability_gpu.py's (passed there on the H200)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import reliability_gpu  # noqa: E402

pytestmark = pytest.mark.gpu


def test_four_processes_tune_one_cache_dir(tmp_path):
    cache = str(tmp_path / "cache")
    sets = ["6000x4096,3000x2048", "6000x4096,2500x4096", "3000x2048,5000x3072", "2500x4096,6000x4096"]
    rcs, outs = reliability_gpu.run_workers(cache, sets)
    assert rcs == [0, 0, 0, 0], outs
    keys = {f"{s}/g128/asym" for ss in sets for s in ss.split(",")}
    missing, bad, tmp, n = reliability_gpu.check_cache(cache, keys)
    assert (missing, bad, tmp, n) == ([], [], [], 4)


def test_sigkill_mid_tune_leaves_a_usable_cache(tmp_path):
    cache = str(tmp_path / "killed")
    env = {**os.environ, "INT4JIT_CACHE_DIR": cache, "ORT_MIGRAPHX_EXHAUSTIVE_TUNE": "1"}
    p = subprocess.Popen([sys.executable, "-c", reliability_gpu.WORKER.format(root=str(reliability_gpu.ROOT)),
                          "28672x4096,8192x8192"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4.0)
    p.send_signal(signal.SIGKILL)
    p.wait()
    rcs, outs = reliability_gpu.run_workers(cache, ["28672x4096,8192x8192"])
    assert rcs == [0], outs
    missing, bad, _, _ = reliability_gpu.check_cache(cache, {"28672x4096/g128/asym", "8192x8192/g128/asym"})
    assert (missing, bad) == ([], [])
