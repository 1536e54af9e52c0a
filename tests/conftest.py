import os

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Each test session gets its own cache dir; no test reads the user's cache."""
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    for var in ("INT4JIT_CONFIG", "MIGRAPHX_INT4_GEMV_CONFIG", "ORT_MIGRAPHX_EXHAUSTIVE_TUNE",
                "INT4JIT_EXHAUSTIVE_TUNE", "INT4JIT_TUNE", "INT4JIT_BACKEND"):
        monkeypatch.delenv(var, raising=False)


def random_problem(rng, N, K, group, symmetric):
    """Random canonical INT4 weights (no quantisation needed) and activations."""
    w = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
    scales = (rng.random((N, K // group)) * 0.02 + 0.001).astype(np.float16)
    zeros = None if symmetric else rng.integers(0, 16, size=(N, K // group), dtype=np.uint8)
    x = rng.standard_normal(K).astype(np.float16)
    return x, w, scales, zeros


def rel_error(y, ref) -> float:
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(y)):
        return float("inf")
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def gpu_reason():
    from int4jit import backends
    reasons = []
    for name in backends.NAMES:
        ok, why = backends.module_for(name).available()
        if ok:
            return None
        reasons.append(f"{name}: {why}")
    return "no GPU: " + "; ".join(reasons)


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    reason = gpu_reason()
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
