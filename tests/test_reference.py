"""quantize/dequantize and the float64 reference, checked by independent code."""
import numpy as np
import pytest

import int4jit
from int4jit.reference import pack_nibbles, unpack_nibbles
from int4jit.shapes import SUPPORTED_GROUPS

from conftest import random_problem


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
