"""Check gemv's arguments and infer the problem, before anything is compiled or launched."""
from __future__ import annotations

from .arrays import ArrayInfo, describe
from .shapes import ACTIVATION_DTYPES, MAX_TOKENS, SUPPORTED_GROUPS, GemvShape

ALIGN = 16  # bytes: x and w are read with 16-byte loads


def _fail(exc, name, expected, got):
    raise exc(f"{name} must be {expected}; got {got}")


def _dtype(info: ArrayInfo, expected: str, shape_text: str):
    if info.dtype != expected:
        _fail(TypeError, info.name, f"{expected} {shape_text}", f"{info.dtype} {info.shape}")


def _contiguous(info: ArrayInfo):
    if not info.contiguous:
        _fail(ValueError, info.name, "C-contiguous", f"a strided view of shape {info.shape}")


def _aligned(info: ArrayInfo):
    if info.on_device and info.ptr % ALIGN:
        _fail(ValueError, info.name, f"{ALIGN}-byte aligned on the device",
              f"address 0x{info.ptr:x} (a view at an odd offset?)")


def validate(x, w, scales, zeros, out):
    """-> (GemvShape, [x, w, scales, zeros|None, out|None] as ArrayInfo, output shape)."""
    xi, wi, si = describe("x", x), describe("w", w), describe("scales", scales)
    zi = None if zeros is None else describe("zeros", zeros)
    oi = None if out is None else describe("out", out, written=True)

    if len(xi.shape) not in (1, 2):
        _fail(ValueError, "x", "1-D [K] or 2-D [M, K]", f"{len(xi.shape)}-D shape {xi.shape}")
    M = 1 if len(xi.shape) == 1 else xi.shape[0]
    if not 1 <= M <= MAX_TOKENS:
        _fail(ValueError, "x", f"[M, K] with M = 1..{MAX_TOKENS} tokens (more is prefill: dequantise + matmul)",
              f"shape {xi.shape}, i.e. M={M}")
    if xi.dtype not in ACTIVATION_DTYPES:
        _fail(TypeError, "x", "float16 or bfloat16 [K] or [M, K]", f"{xi.dtype} {xi.shape}")
    K = xi.shape[-1]
    if K == 0:
        _fail(ValueError, "x", "non-empty (K >= 16)", f"shape {xi.shape}")
    if K % 2:
        _fail(ValueError, "x", "of even length K (two int4 values per byte)", f"K={K}")

    if len(wi.shape) != 2:
        _fail(ValueError, "w", f"2-D uint8 [N, K/2] = [N, {K // 2}]", f"shape {wi.shape}")
    _dtype(wi, "uint8", f"[N, {K // 2}]")
    N = wi.shape[0]
    if wi.shape[1] != K // 2 or N == 0:
        _fail(ValueError, "w", f"uint8 [N, K/2] = [N>0, {K // 2}] for K={K} (from x)", f"shape {wi.shape}")

    if len(si.shape) != 2 or si.shape[0] != N or si.shape[1] == 0:
        _fail(ValueError, "scales", f"float16 [N, K/g] = [{N}, K/g]", f"shape {si.shape}")
    ngroups = si.shape[1]
    group = K // ngroups
    if K % ngroups or group not in SUPPORTED_GROUPS:
        expected = ", ".join(f"({N}, {K // g})" for g in SUPPORTED_GROUPS if K % g == 0) or "none: K has no supported group"
        _fail(ValueError, "scales", f"of shape [N, K/g] with g in {SUPPORTED_GROUPS} for K={K}, "
              f"i.e. one of {expected}", f"shape {si.shape} (g = {K}/{ngroups})")
    if si.dtype not in ACTIVATION_DTYPES:
        _fail(TypeError, "scales", f"float16 or bfloat16 of shape ({N}, {ngroups}) for K={K}, group={group}",
              f"{si.dtype} {si.shape}")

    if zi is not None:
        _dtype(zi, "uint8", f"of shape ({N}, {ngroups}) for K={K}, group={group}")
        if zi.shape != si.shape:
            _fail(ValueError, "zeros", f"uint8 of the shape of scales ({N}, {ngroups})", f"shape {zi.shape}")
        # Host zero points are checked here; device ones once per layer (GemvWeights), since a
        # per-call device reduction would cost more than the GEMV.
        if zi.framework == "numpy" and zi.obj.size and int(zi.obj.max()) > 15:
            _fail(ValueError, "zeros", "zero points 0..15 (4 bits)", f"a maximum of {int(zi.obj.max())}")

    out_shape = (N,) if len(xi.shape) == 1 else (M, N)
    if oi is not None:
        _dtype(oi, xi.dtype, f"(the dtype of x) of shape {out_shape}")
        if oi.framework == "numpy" and not oi.obj.flags.writeable:
            _fail(ValueError, "out", "a writeable array", "a read-only numpy array")
        if tuple(oi.shape) != out_shape:
            _fail(ValueError, "out", f"{xi.dtype} of shape {out_shape} (x is {xi.shape})", f"shape {oi.shape}")

    infos = [xi, wi, si, zi, oi]
    present = [i for i in infos if i is not None]
    for i in present:
        _contiguous(i)
    where = {i.on_device for i in present}
    if len(where) > 1:
        host = [i.name for i in present if not i.on_device]
        dev = [i.name for i in present if i.on_device]
        raise TypeError(f"{', '.join(host)} {'is' if len(host) == 1 else 'are'} host (numpy) arrays but "
                        f"{', '.join(dev)} {'is' if len(dev) == 1 else 'are'} on the GPU: pass all "
                        f"arguments as numpy arrays or all as device arrays on one GPU")
    devices = {i.device for i in present if i.on_device}
    if len(devices) > 1:
        raise ValueError("arguments are on different GPUs: " +
                         ", ".join(f"{i.name} on device {i.device[1]}" for i in present) +
                         "; expected all on one device")
    for i in present:
        _aligned(i)
    if oi is not None:  # blocks write y while others still read x and the weights
        for i in present[:-1]:
            if oi.overlaps(i):
                _fail(ValueError, "out", f"memory of its own (it is written while {i.name} is read)",
                      f"an array overlapping {i.name}")
    if not xi.on_device and (xi.dtype != "float16" or si.dtype != "float16"):
        _fail(TypeError, "x", "float16 (with float16 scales) for numpy arrays; bfloat16 needs device arrays",
              f"{xi.dtype} x with {si.dtype} scales")
    return GemvShape(N, K, group, zi is None, M, xi.dtype, si.dtype), infos, out_shape


def validate_x(x, K: int, device_index: int):
    """Raise the error a new activation for a prepared layer deserves (it failed the fast check)."""
    xi = describe("x", x)
    if xi.dtype not in ACTIVATION_DTYPES:
        _fail(TypeError, "x", f"float16 or bfloat16 [..., {K}]", f"{xi.dtype} {xi.shape}")
    tokens = 1
    for d in xi.shape[:-1]:
        tokens *= d
    if not xi.shape or xi.shape[-1] != K or not 1 <= tokens <= MAX_TOKENS:
        _fail(ValueError, "x", f"[..., {K}] holding 1..{MAX_TOKENS} tokens", f"shape {xi.shape}")
    _contiguous(xi)
    if not xi.on_device or xi.device[1] != device_index:
        _fail(ValueError, "x", f"on GPU {device_index}, where the weights are",
              "a host array" if not xi.on_device else f"GPU {xi.device[1]}")
    _aligned(xi)
