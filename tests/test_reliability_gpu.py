"""Issue 6 on a GPU: four processes tuning one cache dir at once, and a process SIGKILLed in
the middle of tuning; afterwards the DB holds every entry, every code object loads and every
result is right. The runs are bench/reliability_gpu.py's (passed there on the H200)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import reliability_gpu  # noqa: E402

pytestmark = pytest.mark.gpu


def test_four_processes_tune_one_cache_dir(tmp_path):
    rcs, outs, (missing, bad, tmp, n) = reliability_gpu.concurrent_tuning(str(tmp_path / "cache"))
    assert rcs == [0, 0, 0, 0], outs
    assert (missing, bad, tmp, n) == ([], [], [], 4)


def test_sigkill_mid_tune_leaves_a_usable_cache(tmp_path):
    rcs, outs, (missing, bad, _, _) = reliability_gpu.killed_mid_tune(str(tmp_path / "killed"))
    assert rcs == [0], outs
    assert (missing, bad) == ([], [])
