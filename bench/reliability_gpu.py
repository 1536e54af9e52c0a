"""GPU reliability runs for issue 6 (to be promoted into tests/ once they have passed on the H200):
  1. four processes tune and warm one cache dir at once (same and different shapes);
  2. a process SIGKILLed in the middle of tuning;
afterwards the DB must hold every entry, every code object must load, and results must be right.
    python3 bench/reliability_gpu.py"""
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = """
import os, sys
sys.path.insert(0, {root!r})
import numpy as np, int4jit
from int4jit import backends, tuner
from int4jit.shapes import GemvShape
dev = backends.device()
rng = np.random.default_rng()
for spec in sys.argv[1].split(","):
    N, K = map(int, spec.split("x"))
    shape = GemvShape(N, K, 128, False)
    sel = tuner.select_config(shape, dev.arch, dev)
    x, w, s, z = int4jit.reference.random_problem(shape, rng)
    y = int4jit.gemv(x, w, s, z).astype(np.float64)
    ref = int4jit.reference_gemv(x, w, s, z)
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    print(spec, sel.tier, sel.config, f"{{err:.1e}}", flush=True)
    assert err <= 2e-3
"""


def run_workers(cache, shape_sets):
    env = {**os.environ, "INT4JIT_CACHE_DIR": cache}
    code = WORKER.format(root=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", code, s], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for s in shape_sets]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], outs


def check_cache(cache, expected_keys):
    os.environ["INT4JIT_CACHE_DIR"] = cache
    from int4jit import backends, cache as c
    from int4jit.tuning_db import TuningDB
    dev = backends.device()
    entries = TuningDB(dev.arch).entries()
    missing = sorted(set(expected_keys) - set(entries))
    bad = [str(f) for f in (Path(cache) / "code").rglob("*.bin") if c.read_code_object(f) is None]
    tmp = list(Path(cache).rglob("*.tmp"))
    return missing, bad, tmp, len(entries)


# Shapes the shipped table does not hold, so every process tunes (some shapes in several at once).
CONCURRENT_SETS = ["6000x4096,3000x2048", "6000x4096,2500x4096", "3000x2048,5000x3072", "2500x4096,6000x4096"]
KILLED_SET = "28672x4096,8192x8192"


def keys_of(sets):
    return {f"{s}/g128/asym" for ss in sets for s in ss.split(",")}


def concurrent_tuning(cache):
    """Four processes tune and warm `cache` at once; (exit codes, outputs, cache check)."""
    rcs, outs = run_workers(cache, CONCURRENT_SETS)
    return rcs, outs, check_cache(cache, keys_of(CONCURRENT_SETS))


def killed_mid_tune(cache, after_s: float = 4.0):
    """A process SIGKILLed `after_s` into an exhaustive tune, then a rerun on the same cache;
    (rerun exit codes, outputs, cache check)."""
    env = {**os.environ, "INT4JIT_CACHE_DIR": cache, "ORT_MIGRAPHX_EXHAUSTIVE_TUNE": "1"}
    p = subprocess.Popen([sys.executable, "-c", WORKER.format(root=str(ROOT)), KILLED_SET], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(after_s)  # inside the first exhaustive tune
    p.send_signal(signal.SIGKILL)
    p.wait()
    rcs, outs = run_workers(cache, [KILLED_SET])
    return rcs, outs, check_cache(cache, keys_of([KILLED_SET]))


def main():
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        rcs, outs, (missing, bad, tmp, n) = concurrent_tuning(str(Path(d) / "cache"))
        print(f"4 concurrent tuners: exit codes {rcs}, {time.perf_counter() - t0:.1f} s; DB {n} entries, "
              f"missing {missing}, corrupt code objects {bad}, temp files {tmp}")
        for o in outs:
            print("  " + o.strip().replace("\n", "\n  "))
        ok1 = rcs == [0, 0, 0, 0] and not missing and not bad and not tmp

        rcs2, outs2, (missing2, bad2, tmp2, n2) = killed_mid_tune(str(Path(d) / "killed"))
        print(f"after SIGKILL mid-tune: rerun exit {rcs2}, DB {n2} entries, missing {missing2}, corrupt {bad2}, "
              f"temp files left by the killed process {len(tmp2)}")
        print("  " + outs2[0].strip().replace("\n", "\n  "))
        ok2 = rcs2 == [0] and not missing2 and not bad2
        print("reliability:", "PASS" if ok1 and ok2 else "FAIL")
        sys.exit(0 if ok1 and ok2 else 1)


if __name__ == "__main__":
    main()
