"""Property test: arbitrary arguments either validate to the right problem or raise the
documented ValueError/TypeError (CPU); on a GPU, valid draws also match the reference."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import int4jit
from int4jit.shapes import SUPPORTED_GROUPS
from int4jit.validate import validate

from conftest import few_outputs_floor, rel_error

DTYPES = [np.float16, np.float32, np.uint8, np.int8, np.float64]


@st.composite
def calls(draw):
    N = draw(st.sampled_from([1, 3, 7, 64, 129, 1000] * 3 + [0]))
    K = draw(st.sampled_from([16, 32, 48, 96, 256, 512, 4096] * 3 + [0, 33]))
    group = draw(st.sampled_from(SUPPORTED_GROUPS))
    ncols = K // group if K % group == 0 and K else 1
    ncols = draw(st.sampled_from([ncols] * 8 + [0, 3, 7]))
    spec = {
        "N": N, "K": K, "ncols": ncols,
        "x_dtype": draw(st.sampled_from([np.float16] * 12 + [np.float32])),
        "w_dtype": draw(st.sampled_from([np.uint8] * 12 + [np.int8, np.float16])),
        "s_dtype": draw(st.sampled_from([np.float16] * 12 + [np.float32])),
        "z_kind": draw(st.sampled_from(["none"] * 6 + ["ok"] * 6 + ["float", "short"])),
        "x_rank": draw(st.sampled_from(["1"] * 6 + ["row"] * 4 + ["M2", "M16", "M17", "3d"])),
        "w_cols": draw(st.sampled_from(["ok"] * 12 + ["minus", "plus"])),
        "s_rows": draw(st.sampled_from(["ok"] * 12 + ["minus"])),
        "strided": draw(st.sampled_from([None] * 12 + ["x", "w", "s"])),
        "out": draw(st.sampled_from(["none"] * 5 + ["ok"] * 5 + ["wrong_shape", "wrong_dtype"])),
        "seed": draw(st.integers(0, 2**31)),
    }
    return spec


def materialise(spec):
    rng = np.random.default_rng(spec["seed"])
    N, K, G = spec["N"], spec["K"], spec["ncols"]
    xshape = {"1": (K,), "row": (1, K), "M2": (2, K), "M16": (16, K), "M17": (17, K), "3d": (1, 1, K)}[spec["x_rank"]]
    x = rng.standard_normal(xshape).astype(spec["x_dtype"])
    wc = K // 2 + {"ok": 0, "minus": -1, "plus": 1}[spec["w_cols"]]
    w = rng.integers(0, 256, (N, max(wc, 0))).astype(spec["w_dtype"])
    sN = N - (1 if spec["s_rows"] == "minus" and N > 0 else 0)
    s = (rng.random((sN, G)) * 0.02 + 1e-3).astype(spec["s_dtype"])
    z = {"none": None, "ok": rng.integers(0, 16, (sN, G), dtype=np.uint8),
         "float": rng.integers(0, 16, (sN, G)).astype(np.float16),
         "short": rng.integers(0, 16, (sN, max(G - 1, 0)), dtype=np.uint8)}[spec["z_kind"]]
    if spec["strided"] == "x":
        x = np.repeat(x, 2, axis=-1)[..., ::2]
    elif spec["strided"] == "w" and w.size:
        w = np.asfortranarray(w) if w.shape[0] > 1 and w.shape[1] > 1 else w
    elif spec["strided"] == "s" and s.size:
        s = np.asfortranarray(s) if s.shape[0] > 1 and s.shape[1] > 1 else s
    out_shape = (N,) if spec["x_rank"] == "1" else (xshape[0], N) if len(xshape) == 2 else (1, N)
    out = {"none": None, "ok": np.full(out_shape, np.nan, np.float16),
           "wrong_shape": np.zeros((N + 1,), np.float16), "wrong_dtype": np.zeros(out_shape, np.float32)}[spec["out"]]
    return x, w, s, z, out


def expected_valid(x, w, s, z, out):
    """The contract, written independently of validate.py."""
    if x.dtype != np.float16 or w.dtype != np.uint8 or s.dtype != np.float16:
        return False
    if x.ndim not in (1, 2) or (x.ndim == 2 and not 1 <= x.shape[0] <= 16):
        return False
    K = x.shape[-1]
    if K == 0 or K % 2 or w.ndim != 2 or w.shape[0] == 0 or w.shape[1] * 2 != K:
        return False
    N = w.shape[0]
    if s.ndim != 2 or s.shape[0] != N or s.shape[1] == 0 or K % s.shape[1] or K // s.shape[1] not in SUPPORTED_GROUPS:
        return False
    if z is not None and (z.dtype != np.uint8 or z.shape != s.shape):
        return False
    if out is not None and (out.dtype != np.float16 or out.shape != ((N,) if x.ndim == 1 else (x.shape[0], N))):
        return False
    return all(a.flags.c_contiguous for a in (x, w, s, z, out) if a is not None)


COUNT = {"valid": 0, "invalid": 0}


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls())
def test_validation_property(spec):
    x, w, s, z, out = materialise(spec)
    valid = expected_valid(x, w, s, z, out)
    COUNT["valid" if valid else "invalid"] += 1
    if valid:
        shape, infos, out_shape = validate(x, w, s, z, out)
        assert (shape.N, shape.K, shape.group, shape.symmetric) == (w.shape[0], x.shape[-1],
                                                                   x.shape[-1] // s.shape[1], z is None)
    else:
        with pytest.raises((ValueError, TypeError)):
            validate(x, w, s, z, out)


@pytest.mark.gpu
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls())
def test_gemv_property_on_gpu(spec):
    import os
    os.environ["INT4JIT_TUNE"] = "0"  # heuristic configs: the property is about correctness
    x, w, s, z, out = materialise(spec)
    if not expected_valid(x, w, s, z, out):
        with pytest.raises((ValueError, TypeError)):
            int4jit.gemv(x, w, s, z, out=out)
        return
    if x.ndim == 2 and x.shape[0] > 1 and x.shape[-1] % 32:
        # Several tokens run on the tensor-core kernels only: K % 32 == 0 (README, "Kernels").
        with pytest.raises(NotImplementedError, match="K % 32 == 0"):
            int4jit.gemv(x, w, s, z, out=out)
        return
    y = int4jit.gemv(x, w, s, z, out=out)
    ref = int4jit.reference_gemv(x, w, s, z)
    assert rel_error(y, ref, few_outputs_floor(x, w, s, z)) <= 2e-3 or np.linalg.norm(ref) == 0


def test_property_exercised_both_sides():
    """Runs after test_validation_property: the draws must include many valid and invalid calls."""
    if COUNT["valid"] + COUNT["invalid"] == 0:
        pytest.skip("test_validation_property did not run in this session")
    print(f"validation property: {COUNT['valid']} valid, {COUNT['invalid']} invalid draws")
    assert COUNT["valid"] >= 50 and COUNT["invalid"] >= 50
