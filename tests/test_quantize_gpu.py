"""quantize on a CUDA tensor: runs on the device, bit-identical to the numpy path, fast enough
for quantize_model (an 8B model's ~7B weights in <= 15 s: one 28672x4096 well under 100 ms)."""
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from int4jit.reference import quantize

from test_quantize import assert_same, matrices

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(matrices())
def test_cuda_is_bit_identical_to_numpy(case):
    W, g, sym = case
    got = quantize(torch.from_numpy(W).cuda(), g, sym)
    assert all(t.is_cuda for t in got if t is not None)
    assert got[0].dtype == torch.uint8 and got[1].dtype == torch.float16
    assert_same(got, quantize(W, g, sym))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_cuda_large_matrix_is_bit_identical_to_numpy(dtype, symmetric):
    rng = np.random.default_rng(23)
    W = torch.from_numpy(rng.standard_normal((28672, 4096), dtype=np.float32) * 0.02)
    W[5, :128] = torch.linspace(-7.5, 7.5, 128) * 1e-3     # a group of exact-ish ties
    W[6, :128] = 1e-9                                      # a tiny group
    W[7, :128] = 0                                         # a zero group
    W = W.to(getattr(torch, dtype))
    got = quantize(W.cuda(), 128, symmetric)
    assert_same(got, quantize(W.float().numpy(), 128, symmetric))


def test_cuda_errors_name_the_position():
    W = torch.ones((300, 256), device="cuda")
    W[211, 77] = float("nan")
    with pytest.raises(ValueError, match=r"W\[211, 77\] = nan"):
        quantize(W, 128)
    W[211, 77] = 1e6
    with pytest.raises(ValueError, match=r"does not fit float16.*row 211, group 0"):
        quantize(W, 128)


@pytest.mark.parametrize("symmetric", [False, True])
def test_cuda_quantize_is_fast(symmetric):
    """28672x4096 fp16 (the Llama-3-8B MLP shape) in well under 100 ms on the device."""
    W = (torch.randn(28672, 4096, device="cuda") * 0.02).half()
    quantize(W, 128, symmetric)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        quantize(W, 128, symmetric)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    print(f"quantize 28672x4096 on {torch.cuda.get_device_name()}: median {1e3 * sorted(times)[2]:.2f} ms")
    assert sorted(times)[2] < 0.05, times
