import os

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Each test gets its own cache dir; no test reads the user's cache or another test's."""
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("INT4JIT_CONFIG", "MIGRAPHX_INT4_GEMV_CONFIG", "ORT_MIGRAPHX_EXHAUSTIVE_TUNE",
                "INT4JIT_EXHAUSTIVE_TUNE", "INT4JIT_TUNE", "INT4JIT_BACKEND", "INT4JIT_KERNEL", "INT4JIT_PDL",
                "INT4JIT_TRACE", "MIGRAPHX_INT4_GEMV_TRACE"):
        monkeypatch.delenv(var, raising=False)


def random_problem(rng, N, K, group, symmetric):
    """Random canonical INT4 weights (no quantisation needed) and activations."""
    w = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
    scales = (rng.random((N, K // group)) * 0.02 + 0.001).astype(np.float16)
    zeros = None if symmetric else rng.integers(0, 16, size=(N, K // group), dtype=np.uint8)
    x = rng.standard_normal(K).astype(np.float16)
    return x, w, scales, zeros


def torch_reference(x, w, scales, zeros=None, perm=None, device=None, rows=None) -> np.ndarray:
    """int4jit.reference_gemv's float64 formula in torch, on the GPU where there is one (or on
    `device`): the GPU tests' reference, so 28672x4096 does not cost seconds of one core per case.
    Inputs as reference_gemv takes them (numpy or torch; not validated again); returns float64
    [N] for x [K], [M, N] for x [M, K]. test_reference.py checks it equals reference_gemv."""
    import torch
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def on(a):
        return (a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))).to(dev)

    w, s = on(w), on(scales).double()
    z = None if zeros is None else on(zeros).double()
    N, K = w.shape[0], 2 * w.shape[1]
    g = K // s.shape[1]
    xv = on(x).double()
    if perm is not None:
        xv = xv[..., on(perm).long()]
    xm = xv.reshape(-1, K)
    y = torch.empty((xm.shape[0], N), dtype=torch.float64, device=dev)
    rows = rows or max(1, (1 << 24) // K)  # 128 MB of float64 weights at a time
    for r0 in range(0, N, rows):
        r1 = min(N, r0 + rows)
        q = torch.stack((w[r0:r1] & 0x0F, w[r0:r1] >> 4), dim=-1).reshape(r1 - r0, K).double()
        zr = 8.0 if z is None else z[r0:r1].repeat_interleave(g, dim=1)
        y[:, r0:r1] = xm @ ((q - zr) * s[r0:r1].repeat_interleave(g, dim=1)).T
    y = y.cpu().numpy()
    return y.reshape(N) if xv.ndim == 1 else y


def need(module: str):
    """Import a test dependency: skip where it is missing, fail in CI (scripts/test.sh installs it)."""
    try:
        return __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is missing in CI: scripts/test.sh installs it")
        pytest.skip(f"{module} not installed")


def assert_fused_like_llama(model):
    """Every decoder layer of a transformers Llama-style model runs q/k/v and gate/up as one
    Int4Linear each (quantize_model's fusion: they share their input); o and down run alone."""
    from int4jit.torch import _Fused
    for block in model.model.layers:
        a, mlp = block.self_attn, block.mlp
        assert isinstance(a.q_proj._shared, _Fused) and a.q_proj._shared.members == (a.q_proj, a.k_proj, a.v_proj)
        assert a.q_proj._shared is a.k_proj._shared is a.v_proj._shared
        assert isinstance(mlp.up_proj._shared, _Fused) and mlp.up_proj._shared.members == (mlp.gate_proj, mlp.up_proj)
        assert mlp.gate_proj._shared is mlp.up_proj._shared
        assert a.o_proj._shared is None and mlp.down_proj._shared is None


def prepared_layer(m):
    """The GemvWeights an Int4Linear's calls run on: its fused group's where it has one, else its
    own (None where no call has prepared one)."""
    from int4jit.torch import _Fused
    return (m._shared.linear if isinstance(m._shared, _Fused) else m)._layer


def gptq_v1_tensors(layer) -> dict:
    """A quantized layer's tensors as a GPTQ v1 checkpoint stores them (built from the format's
    documented layout: qweight [K/8, N] 8 k a word, lowest bits first; qzeros [G, N/8] 8 rows a
    word, minus 0x11111111; scales [G, N])."""
    import torch
    w, z = layer.w.cpu().numpy(), layer.zeros.cpu().numpy()  # an Int4Linear's, on any device
    N, K = w.shape[0], 2 * w.shape[1]
    q = np.stack([w & 15, w >> 4], axis=-1).reshape(N, K).T.reshape(K // 8, 8, N).astype(np.uint32)
    zt = z.T.reshape(z.shape[1], N // 8, 8).astype(np.uint32)
    shifts = (4 * np.arange(8, dtype=np.uint32))
    qweight = (q << shifts[None, :, None]).sum(axis=1, dtype=np.uint32)
    qzeros = (zt << shifts).sum(axis=2, dtype=np.uint32) - np.uint32(0x11111111)
    out = {"qweight": torch.from_numpy(qweight.view(np.int32)), "qzeros": torch.from_numpy(qzeros.view(np.int32)),
           "scales": layer.scales.t().contiguous().cpu()}
    if layer.bias is not None:
        out["bias"] = layer.bias.detach().cpu()
    return out


def rel_error(y, ref, floor: float = 0.0) -> float:
    """||y - ref|| / ||ref||, the denominator at least `floor` (see few_outputs_floor)."""
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(y)):
        return float("inf")
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), floor))


def few_outputs_floor(x, w, s, z) -> float:
    """For 1 to 15 outputs, a tenth of the norm random outputs have on average
    (||W||_F ||x|| / sqrt(K)); 0 otherwise. One output whose sum cancels by chance makes the
    plain ratio ill-conditioned: on the H200, N = 1, K = 4096 drew y = 0.00708 (typical
    |y| ~ 2.3), and a correct kernel's 8e-5 absolute error read as 1.2e-2 relative."""
    if not 0 < w.shape[0] < 16:
        return 0.0
    from int4jit.reference import dequantize
    W = dequantize(w, s, z).astype(np.float64)
    return 0.1 * float(np.linalg.norm(W) * np.linalg.norm(np.asarray(x, dtype=np.float64)) / np.sqrt(W.shape[1]))


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


# -- compilers on a CPU machine ----------------------------------------------------------
def require_compiler(backend: str):
    """Skip when a compiler is missing on a developer machine; fail in CI, where
    .ci/run installs both and a skip would hide that nothing was tested."""
    from int4jit.backends import module_for
    from int4jit.errors import BackendUnavailable
    mod = module_for(backend)
    try:
        mod.compiler_version()
    except BackendUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"{backend} compiler unavailable in CI: {e}")
        pytest.skip(f"{backend} compiler unavailable: {e}")
