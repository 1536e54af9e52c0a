"""Every bad input raises ValueError/TypeError naming the argument, before anything is
compiled or launched (the backend and compiler are booby-trapped to prove it)."""
import os

import numpy as np
import pytest

import int4jit
from int4jit import api, backends, compiler

from conftest import random_problem


@pytest.fixture(autouse=True)
def no_gpu_no_compile(monkeypatch):
    def trap(*a, **k):
        raise AssertionError("validation let a bad call through to the backend/compiler")
    monkeypatch.setattr(backends, "device", trap)
    monkeypatch.setattr(api.backends, "device", trap)
    monkeypatch.setattr(compiler, "build", trap)


def good(N=64, K=256, group=32, symmetric=False):
    return list(random_problem(np.random.default_rng(), N, K, group, symmetric))


class FakeDevice:
    """A device array as seen through __cuda_array_interface__."""

    def __init__(self, shape, typestr, ptr=0x10000, strides=None, device_id=0):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}
        self.device = type("D", (), {"id": device_id})()


CASES = {
    "x float32": (lambda a: [a[0].astype(np.float32)] + a[1:], TypeError, r"x must be float16 or bfloat16"),
    "x M=17": (lambda a: [np.stack([a[0]] * 17)] + a[1:], ValueError, r"x must be \[M, K\] with M = 1..16.*M=17"),
    "x 3-D": (lambda a: [a[0].reshape(1, 1, -1)] + a[1:], ValueError, r"x must be 1-D"),
    "x empty": (lambda a: [a[0][:0]] + a[1:], ValueError, r"x must be non-empty"),
    "x odd K": (lambda a: [a[0][:-1]] + a[1:], ValueError, r"x must be of even length"),
    "x strided": (lambda a: [np.repeat(a[0], 2)[::2]] + a[1:], ValueError, r"x must be C-contiguous"),
    "w int8": (lambda a: [a[0], a[1].view(np.int8)] + a[2:], TypeError, r"w must be uint8"),
    "w 1-D": (lambda a: [a[0], a[1].reshape(-1)] + a[2:], ValueError, r"w must be 2-D"),
    "w K mismatch": (lambda a: [a[0], a[1][:, :-1].copy()] + a[2:], ValueError, r"w must be uint8 \[N, K/2\] = \[N>0, 128\]"),
    "w N=0": (lambda a: [a[0], a[1][:0]] + a[2:], ValueError, r"w must be"),
    "w transposed": (lambda a: [a[0], np.ascontiguousarray(a[1].T).T] + a[2:], ValueError, r"w must be C-contiguous"),
    "scales float32": (lambda a: a[:2] + [a[2].astype(np.float32), a[3]], TypeError,
                       r"scales must be float16 or bfloat16 of shape \(64, 8\) for K=256, group=32; got float32 \(64, 8\)"),
    "scales N mismatch": (lambda a: a[:2] + [a[2][:-1], a[3]], ValueError, r"scales must be float16 \[N, K/g\] = \[64"),
    "group 48": (lambda a: a[:2] + [np.ones((64, 5), np.float16), None], ValueError,
                 r"scales must be of shape \[N, K/g\] with g in"),
    "group 512": (lambda a: [np.ones(512, np.float16), np.zeros((64, 256), np.uint8), np.ones((64, 1), np.float16), None],
                  ValueError, r"g = 512/1"),
    "group 8": (lambda a: a[:2] + [np.ones((64, 32), np.float16), None], ValueError, r"g = 256/32"),
    "zeros shape": (lambda a: a[:3] + [a[3][:, :-1].copy()], ValueError, r"zeros must be uint8 of the shape of scales"),
    "zeros float": (lambda a: a[:3] + [a[3].astype(np.float16)], TypeError, r"zeros must be uint8"),
    "list input": (lambda a: [a[0].tolist()] + a[1:], TypeError, r"x must be a numpy array or a device array"),
    "host/device mix": (lambda a: [FakeDevice((256,), "<f2")] + a[1:], TypeError,
                        r"w, scales, zeros are host \(numpy\) arrays but x is on the GPU"),
    "two devices": (lambda a: [FakeDevice((256,), "<f2"), FakeDevice((64, 128), "|u1", device_id=1),
                               FakeDevice((64, 8), "<f2"), None], ValueError, r"different GPUs"),
    "misaligned": (lambda a: [FakeDevice((256,), "<f2", ptr=0x10002), FakeDevice((64, 128), "|u1"),
                              FakeDevice((64, 8), "<f2"), None], ValueError, r"x must be 16-byte aligned"),
    "device strided": (lambda a: [FakeDevice((256,), "<f2", strides=(4,)), FakeDevice((64, 128), "|u1"),
                                  FakeDevice((64, 8), "<f2"), None], ValueError, r"x must be C-contiguous"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input(case):
    mutate, exc, pattern = CASES[case]
    args = mutate(good())
    with pytest.raises(exc, match=pattern):
        int4jit.gemv(*args)


@pytest.mark.parametrize("out,pattern,exc", [
    (np.zeros(64, np.float32), r"out must be float16", TypeError),
    (np.zeros(63, np.float16), r"out must be float16 of shape \(64,\)", ValueError),
    (np.zeros((1, 64), np.float16), r"out must be float16 of shape \(64,\)", ValueError),
    (np.zeros(128, np.float16)[::2], r"out must be C-contiguous", ValueError),
])
def test_bad_out(out, pattern, exc):
    with pytest.raises(exc, match=pattern):
        int4jit.gemv(*good(), out=out)


BAD_CONFIGS = [(100, 4), (256, 3), (256,), None.__class__, "256", "256,4,kcluster=3", "256,4,bogus=1", "２５６,4"]


@pytest.mark.parametrize("config", BAD_CONFIGS, ids=str)
def test_bad_config_names_the_argument(config):
    from int4jit import plan
    with pytest.raises(ValueError, match="config"):
        plan.config_override(config)


@pytest.mark.parametrize("config", BAD_CONFIGS, ids=str)
def test_bad_config_is_refused_before_the_backend(config):
    with pytest.raises(ValueError, match="config"):
        int4jit.gemv(*good(), config=config)


def test_good_input_reaches_the_backend():
    """The trap fires for a valid call: the negative cases above are not vacuous."""
    with pytest.raises(AssertionError, match="let a bad call through"):
        int4jit.gemv(*good())


def test_import_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, int4jit; assert 'torch' not in sys.modules and 'cupy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("config", [[256, 4], (128, 8), "256,4", "128,4,streaming=1,kcluster=2"], ids=str)
def test_good_config_reaches_the_backend(config):
    with pytest.raises(AssertionError, match="let a bad call through"):  # valid: reaches the backend
        int4jit.gemv(*good(), config=config)


def test_torch_calls_with_new_activations_reuse_the_prepared_weights(monkeypatch):
    """After one full call, gemv on the same weight tensors (a model's layer) launches with a new x
    and out each call without validating again: with every tensor's current data pointer (a
    tensor given new storage is followed), on torch's current stream or the one given, a kernel
    planned per (tokens, dtype, config, environment); an x or out it does not accept, or other
    weight objects, go the full way. torch's CPU tensors stand in for device tensors."""
    torch = pytest.importorskip("torch")
    from int4jit.shapes import GemvShape
    monkeypatch.setattr(api, "torch_stream_getter", lambda: (lambda index: 0x5000 + index))
    planned, launched = [], []

    class Kernel:
        def launch_packed(self, args, stream):
            launched.append((list(args.values), stream))

    def kernel_for(dev, shape, config, stream, fixed_weights=False):
        planned.append((shape.M, shape.dtype, config, os.environ.get("INT4JIT_CONFIG")))
        return Kernel()

    monkeypatch.setattr(api, "kernel_for", kernel_for)
    dev = type("Dev", (), {"is_capturing": lambda self, s: False})()
    N, K = 64, 256
    w, s = torch.zeros(N, K // 2, dtype=torch.uint8), torch.ones(N, K // 128, dtype=torch.float16)
    z = torch.zeros(N, K // 128, dtype=torch.uint8)
    prepared = api._PreparedWeights(GemvShape(N, K, 128, False), w, s, z, -1, dev)  # device -1: where CPU tensors are
    api._prepared_weights()[(id(w), id(s), id(z))] = prepared
    try:
        x = torch.ones(K, dtype=torch.float16)
        y = int4jit.gemv(x, w, s, z)
        assert y.shape == (N,) and launched[-1] == ([x.data_ptr(), w.data_ptr(), s.data_ptr(), z.data_ptr(), y.data_ptr()], 0x4fff)
        xs = torch.ones(3, K, dtype=torch.bfloat16)
        out = torch.empty(3, N, dtype=torch.bfloat16)
        assert int4jit.gemv(xs, w, s, z, out=out, stream=77) is out
        assert launched[-1] == ([xs.data_ptr(), w.data_ptr(), s.data_ptr(), z.data_ptr(), out.data_ptr()], 77)
        w.set_(torch.ones(N, K // 2, dtype=torch.uint8))  # new storage, same object: followed
        y2 = int4jit.gemv(x, w, s, z)
        assert launched[-1][0][1] == w.data_ptr()
        assert y2.shape == (N,) and y2.is_contiguous() and y2.data_ptr() != y.data_ptr()  # a new y each call
        assert planned == [(1, "float16", None, None), (3, "bfloat16", None, None)]  # one plan per tokens and dtype
        monkeypatch.setenv("INT4JIT_CONFIG", "128,4")
        int4jit.gemv(x, w, s, z)
        assert planned[-1] == (1, "float16", None, "128,4")  # a changed variable plans again
        assert len(launched) == 4
        for bad_x, bad_out in [(torch.ones(K, dtype=torch.float32), None), (torch.ones(K + 2, dtype=torch.float16), None),
                               (torch.ones(17, K, dtype=torch.float16), None), (torch.ones(2, K, dtype=torch.float16)[:, ::2], None),
                               (x, torch.empty(N + 1, dtype=torch.float16)), (x, torch.empty(1, N, dtype=torch.float16)),
                               (x, torch.empty(N, dtype=torch.bfloat16)), (x, x[:N])]:  # the last: out inside x
            assert prepared(bad_x, w, s, z, bad_out, None, None, None) is None  # the full path decides
        assert not prepared.holds(w, s.clone(), z) and not prepared.holds(w, s, None)
        assert len(launched) == 4
    finally:
        api._prepared_weights().clear()


def test_host_arrays_in_the_other_byte_order_are_converted_and_out_is_refused():
    """'>f2' arrays (read from a file, say) would reach a kernel as garbage bytes: inputs are
    converted to native order with equal values; an `out` in that order cannot be written in place."""
    from int4jit.validate import validate
    x, w, s, z = good()
    shape, infos, _ = validate(x.astype(">f2"), w, s.astype(">f2"), z, None)
    assert infos[0].obj.dtype.isnative and np.array_equal(infos[0].obj, x)
    assert infos[2].obj.dtype.isnative and np.array_equal(infos[2].obj, s)
    with pytest.raises(AssertionError, match="let a bad call through"):  # valid: reaches the backend
        int4jit.gemv(x.astype(">f2"), w, s.astype(">f2"), z)
    with pytest.raises(TypeError, match="out must be in native byte order"):
        int4jit.gemv(x, w, s, z, out=np.zeros(64, ">f2"))
    with pytest.raises(TypeError, match="x: __cuda_array_interface__ typestr '>f2'"):
        int4jit.gemv(FakeDevice((256,), ">f2"), FakeDevice((64, 128), "|u1"), FakeDevice((64, 8), "<f2"), None)


@pytest.mark.parametrize("perm,pattern", [
    (np.r_[np.arange(255), 0].astype(np.int32), r"perm must be a permutation of 0..255; got values 0..254 with repeats"),
    (np.r_[np.arange(255), 256].astype(np.int32), r"perm must be a permutation of 0..255; got values 0..256$"),
    (np.r_[-1, np.arange(1, 256)].astype(np.int64), r"got values -1..255$"),
    (np.arange(255, dtype=np.int32), r"perm must be int32 of shape \(256,\)"),
    (np.arange(256, dtype=np.float32), r"perm must be int32"),
])
def test_bad_perm_is_refused_before_the_gather(perm, pattern):
    with pytest.raises(ValueError, match=pattern):
        int4jit.gemv(*good(), perm=perm)


def test_good_perm_reaches_the_backend():
    with pytest.raises(AssertionError, match="let a bad call through"):
        int4jit.gemv(*good(), perm=np.random.default_rng().permutation(256).astype(np.int32))


def test_cpu_tensors_are_host_arrays(monkeypatch):
    """A CPU tensor that requires grad is read as it is; a bfloat16 CPU tensor (host calls are
    float16) is refused naming the argument; torch CPU tensors in give a torch tensor out."""
    torch = pytest.importorskip("torch")
    x, w, s, z = [torch.from_numpy(a) for a in good()]
    with pytest.raises(AssertionError, match="let a bad call through"):
        int4jit.gemv(x.clone().requires_grad_(True), w, s, z)
    with pytest.raises(TypeError, match="x is a bfloat16 CPU tensor"):
        int4jit.gemv(x.to(torch.bfloat16), w, s, z)
    monkeypatch.setattr(api, "_gemv_host", lambda shape, infos, out_shape, *a: np.full(out_shape, 3, np.float16))
    y = int4jit.gemv(x, w, s, z)
    assert isinstance(y, torch.Tensor) and y.shape == (64,) and bool((y == 3).all())
    assert isinstance(int4jit.gemv(x.numpy(), w, s, z), np.ndarray)


def test_device_values_are_checked_once_per_array_and_not_inside_a_capture(monkeypatch):
    """Zero points and permutations of device arrays are checked by a reduction that synchronises:
    once per array object (a new object is checked again), never while the stream captures a
    graph (nor marked checked then), and a fault is a ValueError naming the argument."""
    torch = pytest.importorskip("torch")
    from int4jit.arrays import ArrayInfo
    capturing = [False]
    monkeypatch.setattr(api.backends, "device", lambda i: type("D", (), {"is_capturing": lambda self, s: capturing[0]})())
    monkeypatch.setattr(api, "stream_handle", lambda stream, info: 0)
    calls = []

    def check(xp, a):
        calls.append(a)
        return api.zero_point_fault(xp, a)

    def info(a):
        return ArrayInfo("zeros", a, "torch", "uint8", tuple(a.shape), True, 0x1000, ("gpu", 0))

    z = torch.randint(0, 16, (64, 8), dtype=torch.uint8)
    api._check_values("zeros", info(z), check)
    api._check_values("zeros", info(z), check)
    assert len(calls) == 1
    capturing[0] = True
    z2 = z.clone()
    api._check_values("zeros", info(z2), check)
    assert len(calls) == 1  # not checked inside the capture ...
    capturing[0] = False
    api._check_values("zeros", info(z2), check)
    assert len(calls) == 2  # ... so checked at the next call
    bad = z.clone()
    bad[3, 4] = 16
    with pytest.raises(ValueError, match="zeros must be zero points 0..15 \\(4 bits\\); got a maximum of 16"):
        api._check_values("zeros", info(bad), check)
    with pytest.raises(ValueError, match="zeros must be zero points"):  # a fault is not remembered as checked
        api._check_values("zeros", info(bad), check)
    fake = ArrayInfo("zeros", object(), "cai", "uint8", (64, 8), True, 0x1000, ("gpu", 0))
    api._check_values("zeros", fake, check)  # no framework to reduce with: traced, not checked
    assert len(calls) == 4


def test_an_out_overlapping_an_input_is_refused():
    """Blocks write y while others still read x (and the weights): an out sharing their memory
    (out=x on a square layer, a view into x) would read what was written. A neighbour is fine."""
    x, w, s = FakeDevice((256,), "<f2", ptr=0x10000), FakeDevice((64, 128), "|u1", ptr=0x20000), FakeDevice((64, 2), "<f2", ptr=0x40000)
    for ptr, name in ((0x10000, "x"), (0x10100, "x"), (0x20100, "w"), (0x40000, "scales")):
        with pytest.raises(ValueError, match=f"out must be memory of its own \\(it is written while {name} is read\\)"):
            int4jit.gemv(x, w, s, None, out=FakeDevice((64,), "<f2", ptr=ptr))
    with pytest.raises(AssertionError, match="let a bad call through"):  # right after x: valid
        int4jit.gemv(x, w, s, None, out=FakeDevice((64,), "<f2", ptr=0x10200))
