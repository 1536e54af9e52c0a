"""quantize: bit-exact against an independent per-group implementation, identical across numpy,
torch (CPU here; CUDA in test_quantize_gpu.py) and cupy, bounded memory, and every bad input
refused with the argument and position named."""
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from int4jit import reference
from int4jit.reference import quantize, unpack_nibbles

torch = pytest.importorskip("torch")

FP16_TINY = 2.0 ** -24


def f32(v: float) -> float:
    return float(np.float32(v))


def slow_quantize(W, g, symmetric):
    """The documented algorithm, one group at a time in Python floats: each step done in
    float64 and rounded to float32, which is the correctly rounded float32 result."""
    W = np.asarray(W)
    N, K = W.shape
    q = np.zeros((N, K), np.uint8)
    S = np.zeros((N, K // g), np.float16)
    Z = np.zeros((N, K // g), np.uint8)
    for n in range(N):
        for j in range(K // g):
            vals = [f32(v) for v in W[n, j * g:(j + 1) * g].astype(np.float64)]
            if symmetric:
                span = max(abs(v) for v in vals)
                s32 = f32(span / 7)
            else:
                lo, hi = min(min(vals), 0.0), max(max(vals), 0.0)
                span = f32(hi - lo)
                s32 = f32(span / 15)
            s16 = np.float16(s32)
            if s16 == 0 or (float(s16) < 2.0 ** -14 and float(s16) < s32):
                s16 = np.nextafter(s16, np.float16(np.inf))
            if span == 0:
                s16 = np.float16(1)
            s = float(s16)
            zero = 8 if symmetric else min(max(round(f32(-lo / s)), 0), 15)
            for i, v in enumerate(vals):
                q[n, j * g + i] = min(max(round(f32(v / s)) + zero, 0), 15)  # round(): half to even
            S[n, j], Z[n, j] = s16, zero
    return q, S, (None if symmetric else Z)


def assert_same(a, b):
    """Two quantize results are identical (numpy or torch arrays)."""
    host = lambda t: t.cpu().numpy() if isinstance(t, torch.Tensor) else t
    for x, y, name in zip(a, b, ("w", "scales", "zeros")):
        assert (x is None) == (y is None), name
        if x is not None:
            x, y = host(x), host(y)
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), err_msg=name)


@st.composite
def matrices(draw):
    """Weights with every kind of group: normal, one-sign, zero, tiny (subnormal scales), huge."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    g = draw(st.sampled_from([16, 32, 64]))
    N, G = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    magnitude = draw(st.sampled_from([1e-9, 3e-8, 1e-6, 1e-5, 1e-3, 0.02, 1.0, 300.0, 3e4]))
    W = rng.standard_normal((N, G * g)) * magnitude
    kinds = rng.integers(0, 5, (N, G))
    for n in range(N):
        for j in range(G):
            grp = W[n, j * g:(j + 1) * g]
            if kinds[n, j] == 1:
                grp[:] = np.abs(grp) + magnitude        # all positive
            elif kinds[n, j] == 2:
                grp[:] = -np.abs(grp) - magnitude       # all negative
            elif kinds[n, j] == 3:
                grp[:] = 0                              # all zero
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64] if magnitude < 1e4 else [np.float32]))
    return W.astype(dtype), g, draw(st.booleans())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(matrices())
def test_quantize_matches_the_documented_algorithm(case):
    W, g, sym = case
    w, s, z = quantize(W, g, sym)
    q, S, Z = slow_quantize(W, g, sym)
    np.testing.assert_array_equal(unpack_nibbles(w), q)
    np.testing.assert_array_equal(s.view(np.uint16), S.view(np.uint16))
    if sym:
        assert z is None
    else:
        np.testing.assert_array_equal(z, Z)
    assert np.all(np.isfinite(s)) and np.all(s > 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(matrices())
def test_torch_cpu_is_bit_identical_to_numpy(case):
    W, g, sym = case
    expected = quantize(W, g, sym)
    got = quantize(torch.from_numpy(W), g, sym)
    assert all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in got if t is not None)
    assert got[0].dtype == torch.uint8 and got[1].dtype == torch.float16
    assert_same(got, expected)


@pytest.mark.parametrize("symmetric", [False, True])
def test_bfloat16_torch_equals_numpy_of_its_float32_values(symmetric):
    rng = np.random.default_rng(7)
    Wb = torch.from_numpy(rng.standard_normal((37, 256)).astype(np.float32) * 0.05).bfloat16()
    got = quantize(Wb, 64, symmetric)
    assert_same(got, quantize(Wb.float().numpy(), 64, symmetric))
    q, S, _ = slow_quantize(Wb.float().numpy(), 64, symmetric)
    np.testing.assert_array_equal(unpack_nibbles(got[0].numpy()), q)


def test_ties_round_half_to_even():
    # lo = -7, hi = 8: span 15, scale 1, zero 7; 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, -1.5 -> -2
    row = np.array([-7, 8, 0.5, 1.5, 2.5, -0.5, -1.5, 3.5] + [0] * 8, dtype=np.float32)[None]
    for W in (row, torch.from_numpy(row)):
        w, s, z = quantize(W, 16)
        w, s, z = (np.asarray(a.numpy() if isinstance(a, torch.Tensor) else a) for a in (w, s, z))
        assert float(s[0, 0]) == 1.0 and int(z[0, 0]) == 7
        assert unpack_nibbles(w)[0, :8].tolist() == [0, 15, 7, 9, 9, 7, 5, 11]


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_exact_ties_with_awkward_scales(framework):
    """Weights exactly (m + 1/2) steps from zero, for 400 float16 scales whose reciprocal is
    inexact: a true division rounds each half to even, a multiplication by 1/scale does not."""
    rng = np.random.default_rng(19)
    scales = np.unique(rng.uniform(1e-3, 10, 2000).astype(np.float16))[:400].astype(np.float32)
    m = np.arange(-7, 7, dtype=np.float32)                      # 14 ties
    W = np.concatenate([-7 * scales[:, None], 8 * scales[:, None], (m + 0.5) * scales[:, None]], axis=1)
    W = np.concatenate([W, np.zeros((len(scales), 16), np.float32)], axis=1)  # K = 32
    got = quantize(torch.from_numpy(W) if framework == "torch" else W, 32)
    got = [a.numpy() if isinstance(a, torch.Tensor) else a for a in got]
    np.testing.assert_array_equal(got[1].astype(np.float32)[:, 0], scales)
    assert np.all(got[2][:, 0] == 7)
    expected = np.array([round(v + 0.5) for v in m]) + 7        # Python round: half to even
    q = unpack_nibbles(got[0])[:, 2:16]
    assert np.all(q == expected[None, :]), int((q != expected[None, :]).sum())


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_sign_groups_quantize_within_half_a_step(symmetric, sign):
    """The range includes 0, so a group of all-positive (or all-negative) weights is not clipped
    (before, asymmetric [1, 2] came back as all 15 * scale = 1)."""
    rng = np.random.default_rng(3)
    W = sign * (1 + rng.random((8, 128))).astype(np.float32)
    w, s, z = quantize(W, 32, symmetric)
    step = np.repeat(s.astype(np.float64), 32, axis=1)
    err = np.abs(reference.dequantize(w, s, z) - W)
    assert np.all(err <= 0.51 * step), float((err / step).max())


def test_zero_groups_get_scale_one_and_dequantize_to_zero():
    W = np.zeros((3, 64), np.float32)
    W[1, 32:] = 0.25
    w, s, z = quantize(W, 32)
    assert s[0].tolist() == [1.0, 1.0] and s[1, 0] == 1.0 and z[0].tolist() == [0, 0]
    np.testing.assert_allclose(reference.dequantize(w, s, z), W, atol=0.25 / 15 / 2 * 1.01)
    ws, ss, zs = quantize(W, 32, True)
    assert zs is None and ss[0].tolist() == [1.0, 1.0]
    assert np.all(reference.dequantize(ws, ss, None)[0] == 0)


@pytest.mark.parametrize("symmetric", [False, True])
def test_tiny_weights_get_the_smallest_float16_scale_not_zero(symmetric):
    rng = np.random.default_rng(5)
    W = (rng.standard_normal((4, 128)) * 1e-9).astype(np.float32)
    w, s, z = quantize(W, 64, symmetric)
    assert np.all(s.astype(np.float64) == FP16_TINY)
    assert np.all(np.abs(reference.dequantize(w, s, z) - W) <= FP16_TINY / 2 * 1.0001)


def test_subnormal_scale_is_raised_so_the_range_fits():
    """span/15 = 1.4 * 2**-24 rounds to nearest 2**-24, which would clip 40% of the range; the
    scale is raised to 2 * 2**-24 and every weight stays within half a step."""
    W = np.zeros((1, 16), np.float32)
    W[0, 0], W[0, 1] = -0.7 * 15 * FP16_TINY, 0.7 * 15 * FP16_TINY
    W[0, 2:] = np.linspace(W[0, 0], W[0, 1], 14)
    w, s, z = quantize(W, 16)
    assert float(s[0, 0]) == 2 * FP16_TINY
    assert np.all(np.abs(reference.dequantize(w, s, z) - W) <= FP16_TINY * 1.0001)


@pytest.mark.parametrize("symmetric", [False, True])
def test_round_trip_error_is_half_a_step_for_normal_weights(symmetric):
    rng = np.random.default_rng(11)
    W = (rng.standard_normal((64, 512)) * 0.02).astype(np.float16)
    w, s, z = quantize(W, 128, symmetric)
    step = np.repeat(s.astype(np.float64), 128, axis=1)
    err = np.abs(reference.dequantize(w, s, z) - W.astype(np.float64))
    assert np.all(err <= 0.51 * step)
    assert np.sqrt(np.mean(err ** 2)) <= 1.15 * np.sqrt(np.mean(step ** 2) / 12)


@pytest.mark.parametrize("symmetric", [False, True])
def test_row_blocks_join_exactly(monkeypatch, symmetric):
    rng = np.random.default_rng(13)
    W = rng.standard_normal((10, 96)).astype(np.float32)
    whole = quantize(W, 32, symmetric)
    monkeypatch.setattr(reference, "NUMPY_BLOCK_ELEMENTS", 3 * 96)
    monkeypatch.setattr(reference, "NUMPY_THREADS", 3)
    monkeypatch.setattr(reference, "TORCH_CPU_BLOCK_ELEMENTS", 4 * 96)
    assert_same(quantize(W, 32, symmetric), whole)
    assert_same(quantize(torch.from_numpy(W), 32, symmetric), whole)
    np.testing.assert_array_equal(unpack_nibbles(whole[0]), slow_quantize(W, 32, symmetric)[0])


# -- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_is_refused_naming_the_first_position(monkeypatch, framework, bad):
    monkeypatch.setattr(reference, "NUMPY_BLOCK_ELEMENTS", 3 * 64)  # the bad row is in a later block
    monkeypatch.setattr(reference, "TORCH_CPU_BLOCK_ELEMENTS", 3 * 64)
    monkeypatch.setattr(reference, "NUMPY_THREADS", 3)  # blocks finish out of order; the first is named
    W = np.ones((10, 64), np.float32)
    W[7, 45] = bad
    W[8, 3] = W[9, 0] = np.nan
    with pytest.raises(ValueError, match=r"W\[7, 45\] = (nan|inf|-inf)") as e:
        quantize(torch.from_numpy(W) if framework == "torch" else W, 32)
    assert "finite" in str(e.value)


def test_float64_beyond_float32_is_refused():
    W = np.ones((2, 32))
    W[1, 5] = 1e39
    with pytest.raises(ValueError, match=r"W\[1, 5\] = 1e\+39"):
        quantize(W, 32)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_scales_beyond_float16_are_refused(framework):
    conv = (lambda a: torch.from_numpy(a)) if framework == "torch" else (lambda a: a)
    W = np.zeros((4, 64), np.float32)
    W[2, 40] = 1e6
    with pytest.raises(ValueError, match=r"does not fit float16.*row 2, group 1") as e:
        quantize(conv(W), 32)
    assert "W[2, 32:64]" in str(e.value)
    with pytest.raises(ValueError, match="float16"):
        quantize(conv(W), 32, True)
    # the largest ranges that fit: 15 (asymmetric) and 7 (symmetric) steps of 65504
    W[2, 40] = 15 * 65504.0
    assert float(quantize(conv(W), 32)[1][2, 1]) == 65504.0
    W[2, 40] = 7 * 65504.0
    assert float(quantize(conv(W), 32, True)[1][2, 1]) == 65504.0


@pytest.mark.parametrize("args,exc,words", [
    ((np.zeros((4, 100)), 32), ValueError, ["K=100", "group_size=32"]),
    ((np.zeros((4, 64)), 48), ValueError, ["group_size=48", "(16, 32, 64, 128, 256)"]),
    ((np.zeros((4, 64)), 32.0), TypeError, ["group_size", "32.0"]),
    ((np.zeros((4, 64)), True), TypeError, ["group_size"]),
    ((np.zeros((4, 64)), 32, "yes"), TypeError, ["symmetric", "'yes'"]),
    ((np.zeros(64), 32), ValueError, ["W must be 2-D", "1-D", "(64,)"]),
    ((np.zeros((2, 2, 64)), 32), ValueError, ["W must be 2-D", "3-D"]),
    ((np.float32(1.0), 32), ValueError, ["W must be 2-D", "0-D"]),
    ((np.zeros((0, 64)), 32), ValueError, ["N >= 1", "(0, 64)"]),
    ((None, 32), TypeError, ["W", "None"]),
    ((np.zeros((4, 64), np.int64), 32), TypeError, ["W must be float", "int64"]),
    ((np.zeros((4, 64), bool), 32), TypeError, ["W must be float", "bool"]),
])
def test_bad_arguments_are_named(args, exc, words):
    with pytest.raises(exc) as e:
        quantize(*args)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_bad_torch_arguments_are_named():
    with pytest.raises(TypeError, match="W must be a floating-point tensor.*int32"):
        quantize(torch.zeros((4, 64), dtype=torch.int32), 32)
    with pytest.raises(ValueError, match="3-D"):
        quantize(torch.zeros((1, 4, 64)), 32)
    with pytest.raises(ValueError, match="K=96"):
        quantize(torch.zeros((4, 96)), 64)
    with pytest.raises(ValueError, match=r"meta tensor \(4, 64\).*load the weights first"):
        quantize(torch.empty((4, 64), device="meta"), 32)  # a model built on the meta device, not loaded


def test_non_contiguous_numpy_inputs():
    W = np.random.default_rng(2).standard_normal((96, 64)).astype(np.float32)
    for view in (W.T, np.asfortranarray(W), W[:, ::-1], W[::2]):
        assert_same(quantize(view, 16), quantize(np.ascontiguousarray(view), 16))


def test_grad_and_non_contiguous_torch_inputs():
    W = torch.randn(64, 48, requires_grad=True)
    got = quantize(W.t(), 16)  # [48, 64], a transposed view
    assert_same(got, quantize(W.detach().t().contiguous().numpy(), 16))


# -- memory, lazy imports, cupy -------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_path_memory_stays_flat(dtype):
    """No whole-matrix float64 copy: extra memory is the outputs plus a few block temporaries
    (before: ~6 float64 copies of W)."""
    W = np.random.default_rng(0).standard_normal((2048, 4096)).astype(dtype)
    tracemalloc.start()
    try:
        quantize(W, 128)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    outputs = 2048 * 2048 + 2048 * 32 * 3
    assert peak <= outputs + 12 * 2**20 * max(2, reference.NUMPY_THREADS), peak / 2**20


def test_import_does_not_import_torch():
    code = ("import sys, numpy as np; import int4jit; from int4jit.reference import quantize, reference_gemv; "
            "w, s, z = quantize(np.ones((4, 64), np.float32), 32); reference_gemv(np.ones(64), w, s, z); "
            "assert 'torch' not in sys.modules and 'cupy' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cupy_is_bit_identical_to_numpy():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - cupy without a device
        pytest.skip(f"cupy has no device: {e}")
    rng = np.random.default_rng(17)
    W = (rng.standard_normal((300, 512)) * 0.02).astype(np.float16)
    for sym in (False, True):
        got = quantize(cupy.asarray(W), 64, sym)
        assert all(isinstance(a, cupy.ndarray) for a in got if a is not None)
        assert_same([None if a is None else a.get() for a in got], quantize(W, 64, sym))
