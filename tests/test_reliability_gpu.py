"""Issue 6 on a GPU: four processes tuning one cache dir at once, and a process SIGKILLed in
the middle of tuning; afterwards the DB holds every entry, every code object loads and every
result is right. (Formerly bench/reliability_gpu.py; passed there on the H200.)"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]

# Each worker tunes (through the public call) every NxK it is given, g=128 asymmetric, and
# checks the result against the float64 reference.
WORKER = """
import sys
sys.path.insert(0, {root!r})
import numpy as np, int4jit
rng = np.random.default_rng()
for spec in sys.argv[1].split(","):
    N, K = map(int, spec.split("x"))
    w = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
    s = (rng.random((N, K // 128)) * 0.02 + 0.001).astype(np.float16)
    z = rng.integers(0, 16, size=(N, K // 128), dtype=np.uint8)
    x = rng.standard_normal(K).astype(np.float16)
    y = int4jit.gemv(x, w, s, z).astype(np.float64)
    ref = int4jit.reference_gemv(x, w, s, z)
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    print(spec, f"{{err:.1e}}", flush=True)
    assert err <= 2e-3
"""

# Shapes the shipped table does not hold, so every process tunes (some shapes in several at once).
CONCURRENT_SETS = ["6000x4096,3000x2048", "6000x4096,2500x4096", "3000x2048,5000x3072", "2500x4096,6000x4096"]
# Tuned exhaustively (which skips the table), killed in the first tune, then tuned again the same way.
KILLED_SET = "28672x4096,8192x8192"


def keys_of(sets):
    return {f"{s}/g128/asym" for ss in sets for s in ss.split(",")}


def run_workers(cache, shape_sets, extra_env=None):
    env = {**os.environ, "INT4JIT_CACHE_DIR": cache, **(extra_env or {})}
    code = WORKER.format(root=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", code, s], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for s in shape_sets]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], outs


def check_cache(cache, expected_keys, monkeypatch):
    """(DB keys missing, code objects that do not read back, temp files left, DB entries)."""
    monkeypatch.setenv("INT4JIT_CACHE_DIR", cache)
    from int4jit import backends
    from int4jit import cache as code_cache
    from int4jit.tuning_db import TuningDB
    entries = TuningDB(backends.device().arch).entries()
    # a DB key is the problem's key, possibly followed by "/<kernel>"
    missing = sorted(k for k in expected_keys if not any(e == k or e.startswith(k + "/") for e in entries))
    bad = [str(f) for f in (Path(cache) / "code").rglob("*.bin") if code_cache.read_code_object(f) is None]
    tmp = list(Path(cache).rglob("*.tmp"))
    return missing, bad, tmp, len(entries)


def test_four_processes_tune_one_cache_dir(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    rcs, outs = run_workers(cache, CONCURRENT_SETS)
    assert rcs == [0, 0, 0, 0], outs
    missing, bad, tmp, n = check_cache(cache, keys_of(CONCURRENT_SETS), monkeypatch)
    assert (missing, bad, tmp, n) == ([], [], [], 4)


def test_sigkill_mid_tune_leaves_a_usable_cache(tmp_path, monkeypatch):
    cache = str(tmp_path / "killed")
    env = {**os.environ, "INT4JIT_CACHE_DIR": cache, "ORT_MIGRAPHX_EXHAUSTIVE_TUNE": "1"}
    p = subprocess.Popen([sys.executable, "-c", WORKER.format(root=str(ROOT)), KILLED_SET], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4.0)  # inside the first exhaustive tune
    p.send_signal(signal.SIGKILL)
    p.wait()
    rcs, outs = run_workers(cache, [KILLED_SET], {"ORT_MIGRAPHX_EXHAUSTIVE_TUNE": "1"})  # the same work again
    assert rcs == [0], outs
    missing, bad, _, _ = check_cache(cache, keys_of([KILLED_SET]), monkeypatch)
    assert (missing, bad) == ([], [])
