"""quantize/dequantize and the float64 reference, checked by independent code."""
import numpy as np
import pytest

import int4jit
from int4jit.reference import pack_nibbles, unpack_nibbles
from int4jit.shapes import SUPPORTED_GROUPS

from conftest import random_problem, torch_reference


def independent_reference(x, w, scales, zeros):
    """Dequantise element by element from the layout's definition, then matmul."""
    N, half = w.shape
    K = 2 * half
    g = K // scales.shape[1]
    W = np.empty((N, K))
    for n in range(N):
        for k in range(K):
            byte = int(w[n, k // 2])
            q = byte & 0xF if k % 2 == 0 else byte >> 4
            z = 8 if zeros is None else int(zeros[n, k // g])
            W[n, k] = (q - z) * float(scales[n, k // g])
    return W @ x.astype(np.float64)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [16, 32, 128])
def test_reference_matches_definition(symmetric, group):
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 13, 2 * group, group, symmetric)
    np.testing.assert_allclose(int4jit.reference_gemv(x, w, s, z), independent_reference(x, w, s, z), rtol=1e-12)


def test_reference_keeps_the_leading_one():
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 5, 64, 32, False)
    assert int4jit.reference_gemv(x.reshape(1, -1), w, s, z).shape == (1, 5)
    assert int4jit.reference_gemv(x, w, s, z).dtype == np.float64


def test_nibble_order_low_is_even_k():
    q = np.array([[1, 2, 3, 4]], dtype=np.uint8)
    assert pack_nibbles(q).tolist() == [[0x21, 0x43]]
    rng = np.random.default_rng()
    q = rng.integers(0, 16, (7, 64), dtype=np.uint8)
    np.testing.assert_array_equal(unpack_nibbles(pack_nibbles(q)), q)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", SUPPORTED_GROUPS)
def test_quantize_round_trip_error_is_within_half_a_step(symmetric, group):
    rng = np.random.default_rng()
    W = rng.standard_normal((64, 512)).astype(np.float32)
    w, s, z = int4jit.quantize(W, group, symmetric)
    assert w.dtype == np.uint8 and w.shape == (64, 256)
    assert s.dtype == np.float16 and s.shape == (64, 512 // group)
    assert (z is None) == symmetric
    if z is not None:
        assert z.dtype == np.uint8 and z.max() <= 15
    Wd = int4jit.dequantize(w, s, z)
    assert Wd.dtype == np.float32 and Wd.shape == W.shape
    step = np.repeat(s.astype(np.float64), group, axis=1)
    err = np.abs(Wd - W)
    # RTN: half a step, plus fp16 rounding of the scale; symmetric clips the +8 end.
    bound = step * (0.5 + 1e-2) + (np.abs(W) * 2e-3 if symmetric else 0)
    assert np.all(err <= bound + 1e-6), float((err - bound).max())
    # RTN errors are ~uniform over a step: RMS step/sqrt(12), not more.
    rms_err = np.sqrt(np.mean((Wd - W) ** 2))
    assert rms_err <= 1.15 * np.sqrt(np.mean(step ** 2) / 12)


def test_quantize_constant_groups_are_exact():
    W = np.concatenate([np.zeros((2, 32)), np.full((2, 32), 0.5), np.full((2, 32), -3.0)], axis=1)
    for sym in (True, False):
        w, s, z = int4jit.quantize(W, 32, sym)
        np.testing.assert_allclose(int4jit.dequantize(w, s, z), W, rtol=1e-3)


@pytest.mark.parametrize("bad,exc", [((np.zeros((4, 100)), 32), ValueError), ((np.zeros(64), 32), ValueError),
                                     ((np.zeros((4, 64)), 48), ValueError)])
def test_quantize_rejects_bad_input(bad, exc):
    with pytest.raises(exc):
        int4jit.quantize(*bad)


# -- M > 1, act-order perm, torch activations ------------------------------------------------
def _problem(N=7, K=128, group=32, symmetric=False, seed=0):
    return random_problem(np.random.default_rng(seed), N, K, group, symmetric)


@pytest.mark.parametrize("M", [1, 2, 5, 16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_reference_takes_m_rows(M, symmetric):
    x, w, s, z = _problem(symmetric=symmetric, seed=M)
    X = np.random.default_rng(M).standard_normal((M, 128)).astype(np.float16)
    y = int4jit.reference_gemv(X, w, s, z)
    assert y.shape == (M, 7) and y.dtype == np.float64
    for m in range(M):
        np.testing.assert_allclose(y[m], independent_reference(X[m], w, s, z), rtol=1e-12)


def test_reference_x_dtypes_float32_float64():
    x, w, s, z = _problem()
    x64 = np.random.default_rng(1).standard_normal(128)
    np.testing.assert_allclose(int4jit.reference_gemv(x64, w, s, z), independent_reference(x64, w, s, z), rtol=1e-12)
    x32 = x64.astype(np.float32)
    np.testing.assert_allclose(int4jit.reference_gemv(x32, w, s, z), independent_reference(x32, w, s, z), rtol=1e-12)


def test_reference_takes_torch_activations_bf16_included():
    torch = pytest.importorskip("torch")
    x, w, s, z = _problem()
    X = torch.randn(3, 128)
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        xt = X.to(dtype)
        y = int4jit.reference_gemv(xt, w, s, z)
        assert y.shape == (3, 7)
        want = np.stack([independent_reference(r, w, s, z) for r in xt.double().numpy()])
        np.testing.assert_allclose(y, want, rtol=1e-12)
    # w, scales, zeros as torch tensors too
    tw, ts, tz = (torch.from_numpy(a) for a in (w, s, z))
    np.testing.assert_array_equal(int4jit.reference_gemv(x, tw, ts, tz), int4jit.reference_gemv(x, w, s, z))


@pytest.mark.parametrize("M,symmetric,group,with_perm", [(1, False, 32, False), (3, True, 16, True), (2, False, 128, True)])
def test_gpu_tests_torch_reference_equals_reference_gemv(M, symmetric, group, with_perm):
    """tests/test_gemv_gpu.py checks kernels against conftest.torch_reference (float64 in torch,
    on the GPU): it must be reference_gemv's function, across its row blocks, M, perm and zeros."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(M)
    _, w, s, z = random_problem(rng, 37, 256, group, symmetric)
    X = rng.standard_normal((M, 256)).astype(np.float16)
    perm = rng.permutation(256).astype(np.int32) if with_perm else None
    for x in (X, X[0]):
        want = int4jit.reference_gemv(x, w, s, z, perm=perm)
        got = torch_reference(x, w, s, z, perm=perm, device="cpu", rows=8)  # 5 row blocks
        assert got.shape == want.shape and got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    wrong = z if z is None else np.where(z == 15, 0, z + 1).astype(np.uint8)  # off by one zero point
    if wrong is not None:
        assert not np.allclose(torch_reference(X, w, s, wrong, perm=perm, device="cpu"),
                               int4jit.reference_gemv(X, w, s, z, perm=perm))


def test_reference_perm_is_act_order():
    """y = W @ x[perm]: a GPTQ act-order layer quantised with its columns permuted gives the
    same output as the unpermuted weights on the unpermuted x."""
    rng = np.random.default_rng(4)
    K, N = 128, 9
    W = rng.standard_normal((N, K))
    perm = rng.permutation(K).astype(np.int32)
    Wq = W[:, perm]                        # stored group-contiguous in act order
    w, s, z = int4jit.quantize(Wq, 32)
    Wd = int4jit.dequantize(w, s, z).astype(np.float64)
    x = rng.standard_normal((2, K))
    y = int4jit.reference_gemv(x, w, s, z, perm=perm)
    want = np.empty((2, N))
    for m in range(2):
        for n in range(N):
            want[m, n] = sum(Wd[n, k] * x[m, perm[k]] for k in range(K))
    np.testing.assert_allclose(y, want, rtol=1e-12)
    # same as the columns put back in place, with x as given
    inverse = np.argsort(perm)
    np.testing.assert_allclose(y, x @ Wd[:, inverse].T, rtol=1e-12)
    identity = np.arange(K, dtype=np.int32)
    np.testing.assert_allclose(int4jit.reference_gemv(x, w, s, z, perm=identity), int4jit.reference_gemv(x, w, s, z),
                               rtol=1e-13)


@pytest.mark.parametrize("perm,exc,words", [
    (np.arange(127, dtype=np.int32), ValueError, ["perm", "K=128", "(127,)"]),
    (np.zeros(128, np.int32), ValueError, ["permutation", "127 repeats"]),
    (np.arange(1, 129, dtype=np.int32), ValueError, ["permutation", "1..128"]),
    (np.arange(-1, 127, dtype=np.int32), ValueError, ["permutation", "-1..126"]),
    (np.arange(128, dtype=np.float32), TypeError, ["perm", "float32"]),
    (np.arange(128, dtype=np.int32).reshape(2, 64), ValueError, ["perm", "(2, 64)"]),
])
def test_reference_refuses_bad_perm(perm, exc, words):
    x, w, s, z = _problem()
    with pytest.raises(exc) as e:
        int4jit.reference_gemv(x, w, s, z, perm=perm)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_reference_row_blocks_join(monkeypatch):
    from int4jit import reference
    x, w, s, z = _problem(N=10, seed=8)
    whole, deq = int4jit.reference_gemv(x, w, s, z), int4jit.dequantize(w, s, z)
    monkeypatch.setattr(reference, "_row_block", lambda K: 3)
    np.testing.assert_array_equal(int4jit.reference_gemv(x, w, s, z), whole)
    np.testing.assert_array_equal(int4jit.dequantize(w, s, z), deq)
    np.testing.assert_allclose(whole, independent_reference(x, w, s, z), rtol=1e-12)


# -- refusals: dequantize and reference_gemv name the argument, expected and got ------------
def _bad_cases():
    x, w, s, z = _problem()
    zz = z.copy()
    zz[3, 2] = 200
    return [
        ("zeros 200", (w, s, zz), ValueError, ["zeros[3, 2] = 200", "0..15"]),
        ("zeros -3", (w, s, z.astype(np.int8) - np.int8(3) * (z == 0)), ValueError, ["zeros", "= -3", "0..15"]),
        ("zeros 2.5", (w, s, z.astype(np.float32) + 0.5), TypeError, ["zeros must be uint8", "float32"]),
        ("zeros shape", (w, s, z[:, :2]), ValueError, ["zeros must have the shape of scales (7, 4)", "(7, 2)"]),
        ("zeros 1-d", (w, s, z.reshape(-1)), ValueError, ["zeros", "(28,)"]),
        ("w int64", (w.astype(np.int64), s, z), TypeError, ["w must be uint8", "int64"]),
        ("w float", (w.astype(np.float32), s, z), TypeError, ["w must be uint8", "float32"]),
        ("w None", (None, s, z), TypeError, ["w", "None"]),
        ("w 0-d", (np.uint8(3), s, z), ValueError, ["w must be 2-D", "0-D"]),
        ("w 1-d", (w.reshape(-1), s, z), ValueError, ["w must be 2-D", "1-D"]),
        ("w 3-d", (w.reshape(7, 2, 32), s, z), ValueError, ["w must be 2-D", "3-D"]),
        ("w empty", (w[:0], s[:0], z[:0]), ValueError, ["w", "N >= 1"]),
        ("scales None", (w, None, z), TypeError, ["scales", "None"]),
        ("scales int", (w, s.astype(np.int32), z), TypeError, ["scales", "int32"]),
        ("scales 1-d", (w, s.reshape(-1), z), ValueError, ["scales must be 2-D", "1-D"]),
        ("scales 3-d", (w, s.reshape(7, 2, 2), z), ValueError, ["scales must be 2-D", "3-D"]),
        ("scales rows", (w, s[:6], z[:6]), ValueError, ["scales must be [N, K/g] = [7, K/g]", "(6, 4)"]),
        ("scales cols", (w, np.ones((7, 3), np.float16), None), ValueError, ["K=128", "(7, 3)"]),
    ]


@pytest.mark.parametrize("name,args,exc,words", _bad_cases(), ids=[c[0] for c in _bad_cases()])
@pytest.mark.parametrize("fn", ["dequantize", "reference_gemv"])
def test_refusals_name_the_argument(fn, name, args, exc, words):
    x = np.ones(128, np.float16)
    call = (lambda: int4jit.dequantize(*args)) if fn == "dequantize" else (lambda: int4jit.reference_gemv(x, *args))
    with pytest.raises(exc) as e:
        call()
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_zero_points_at_the_ends_are_accepted():
    x, w, s, z = _problem()
    z[:] = 15
    z[0, 0] = 0
    np.testing.assert_allclose(int4jit.reference_gemv(x, w, s, z), independent_reference(x, w, s, z), rtol=1e-12)
    np.testing.assert_array_equal(int4jit.dequantize(w, s, z.astype(np.int64)), int4jit.dequantize(w, s, z))


@pytest.mark.parametrize("x,exc,words", [
    (np.ones((), np.float16), ValueError, ["x must be [K] or [M, K]", "0-D"]),
    (np.ones((1, 1, 128), np.float16), ValueError, ["x must be [K] or [M, K]", "3-D"]),
    (np.ones((0, 128), np.float16), ValueError, ["M >= 1", "(0, 128)"]),
    (np.ones(127, np.float16), ValueError, ["K=128", "(127,)"]),
    (np.ones(128, np.int32), TypeError, ["x must be float16", "int32"]),
    (None, TypeError, ["x", "None"]),
])
def test_reference_refuses_bad_x(x, exc, words):
    _, w, s, z = _problem()
    with pytest.raises(exc) as e:
        int4jit.reference_gemv(x, w, s, z)
    for word in words:
        assert word in str(e.value), (word, str(e.value))
