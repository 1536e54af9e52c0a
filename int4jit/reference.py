"""The float64 definition every kernel is checked against, and RTN quantisation.

quantize runs where its input lives: numpy on the CPU, torch tensors with torch ops (CPU or
GPU), cupy arrays with cupy; the result is bit-identical on all of them (see quantize).
Neither torch nor cupy is imported unless the caller hands one of their arrays in."""
from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .shapes import SUPPORTED_GROUPS

# Rows a block of work covers: at most this many W elements at a time (float32 temporaries).
NUMPY_BLOCK_ELEMENTS = 1 << 20      # 4 MiB float32 temporaries: cache-sized, and memory stays flat
DEVICE_BLOCK_ELEMENTS = 1 << 26     # 256 MiB float32 temporaries: few launches, bounded memory
TORCH_CPU_BLOCK_ELEMENTS = 1 << 22
NUMPY_THREADS = min(4, os.cpu_count() or 1)

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0 ** -14
FP16_MIN_SUBNORMAL = 2.0 ** -24
_FP16_MIN_NORMAL_BITS = 0x0400


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 values 0..15 of shape [N, K] (K even) -> bytes [N, K/2], low nibble = even k."""
    q = np.asarray(q, dtype=np.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(w: np.ndarray) -> np.ndarray:
    """bytes [..., K/2] -> uint8 values [..., K], low nibble first: the inverse of pack_nibbles."""
    w = np.asarray(w, dtype=np.uint8)
    q = np.empty(w.shape[:-1] + (w.shape[-1] * 2,), dtype=np.uint8)
    q[..., 0::2] = w & 0x0F
    q[..., 1::2] = w >> 4
    return q


def random_problem(shape, rng=None):
    """Random canonical data for a GemvShape: (x float16 [K] (one token) or [M, K], w, scales,
    zeros or None). Every byte value and zero point occurs; scales are positive, x is standard
    normal (its 16-bit patterns serve bf16 as well: finite, small values)."""
    rng = np.random.default_rng() if rng is None else rng
    groups = (shape.N, shape.K // shape.group)
    w = rng.integers(0, 256, (shape.N, shape.K // 2), dtype=np.uint8)
    scales = (rng.random(groups, dtype=np.float32) * 0.02 + 1e-3).astype(np.float16)
    zeros = None if shape.symmetric else rng.integers(0, 16, groups, dtype=np.uint8)
    x = rng.standard_normal(shape.K if shape.M == 1 else (shape.M, shape.K), dtype=np.float32).astype(np.float16)
    return x, w, scales, zeros


# -- array frameworks, imported only when the caller's array comes from them -------------
def _framework(a) -> str:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        return "torch"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(a, cupy.ndarray):
        return "cupy"
    return "numpy"


def _describe(a) -> str:
    if a is None:
        return "None"
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is None or dtype is None:
        return type(a).__name__
    return f"{str(dtype).replace('torch.', '')} {tuple(shape)}"


def _host_array(a, name: str) -> np.ndarray:
    """numpy view of a numpy/torch/cupy/array-like argument (device arrays are copied back)."""
    if a is None:
        raise TypeError(f"{name} must be an array; got None")
    kind = _framework(a)
    if kind == "torch":
        a = a.detach()
        a = a.double() if a.dtype.is_floating_point and a.dtype.itemsize == 8 else (
            a.float() if a.dtype.is_floating_point else a)
        return a.cpu().numpy()
    if kind == "cupy":
        return a.get()
    arr = np.asarray(a)
    if arr.dtype.name == "bfloat16":  # ml_dtypes
        arr = arr.astype(np.float32)
    return arr


def _require_2d(a, name: str, layout: str):
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D {layout}; got {a.ndim}-D shape {tuple(a.shape)}")


# -- quantize --------------------------------------------------------------------------------
def quantize(W, group_size: int = 128, symmetric: bool = False):
    """Round-to-nearest INT4 quantisation of float weights W [N, K], in float32.

    W: numpy float16/32/64 (or ml_dtypes bfloat16), a torch tensor of a floating dtype on any
    device (bfloat16 included), or a cupy array. Runs with W's own framework on W's device and
    returns that framework's arrays on that device:
    (w uint8 [N, K/2], scales float16 [N, K/g], zeros uint8 [N, K/g] or None when symmetric).

    The algorithm, per group of `group_size` consecutive k (every step IEEE float32, so numpy,
    torch and cupy agree bit for bit; x/y is a true division, round is half-to-even):
      v = float32(W)
      asymmetric: lo = min(min(v), 0), hi = max(max(v), 0), scale32 = (hi - lo) / 15
      symmetric:  a = max(|v|),                             scale32 = a / 7
      scale = float16(scale32) rounded to nearest; where that is subnormal and below scale32
              (or 0), it is raised to the next float16 up, so the group's range always fits
              15 steps (rounding a subnormal to nearest can shrink a step by up to half);
              an all-zero group gets scale 1.
      s = float32(scale)
      asymmetric: zero = clamp(round(-lo / s), 0, 15);  q = clamp(round(v / s) + zero, 0, 15)
      symmetric:  zero = 8 (zeros=None);                q = clamp(round(v / s) + 8, 0, 15)
    The range includes 0, so groups of one sign (all > 0 or all < 0) quantise within half a
    step like any other. Groups whose range is below 15 * 2**-24 (~9e-7) get the smallest
    float16 scale 2**-24 and an absolute error of at most 2**-25: tiny values round towards 0.

    Raises ValueError naming W and the first offending position for NaN or inf in W, and for a
    group whose scale would overflow float16 (|W| beyond ~4.9e5 symmetric, a range beyond
    ~9.8e5 asymmetric). The numpy path works in row blocks of float32: no float64 copies,
    memory beyond the outputs stays a few MiB."""
    kind = _framework(W)
    _check_quantize_args(W, group_size, symmetric, kind)
    if kind == "torch":
        return _quantize_torch(W, int(group_size), bool(symmetric))
    if kind == "cupy":
        import cupy
        return _quantize_xp(cupy, W, int(group_size), bool(symmetric), DEVICE_BLOCK_ELEMENTS)
    return _quantize_xp(np, _as_float_numpy(W), int(group_size), bool(symmetric), NUMPY_BLOCK_ELEMENTS,
                        NUMPY_THREADS)


def _as_float_numpy(W) -> np.ndarray:
    W = np.asarray(W)
    if W.dtype.name == "bfloat16":  # ml_dtypes bfloat16: exact in float32
        W = W.astype(np.float32)
    return W


def _check_quantize_args(W, group_size, symmetric, kind: str):
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise TypeError(f"group_size must be an int, one of {SUPPORTED_GROUPS}; got {group_size!r}")
    if int(group_size) not in SUPPORTED_GROUPS:
        raise ValueError(f"group_size={group_size} is not supported: expected one of {SUPPORTED_GROUPS}")
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be True or False; got {symmetric!r}")
    if W is None:
        raise TypeError("W must be a float array [N, K] (numpy, torch or cupy); got None")
    if kind == "torch":
        if not W.dtype.is_floating_point:
            raise TypeError(f"W must be a floating-point tensor [N, K]; got {_describe(W)}")
        if W.device.type == "meta":
            raise ValueError(f"W is a meta tensor {tuple(W.shape)} (no values to quantize); load the "
                             f"weights first (e.g. model.to_empty(device=...) and load_state_dict)")
        shape = tuple(W.shape)
    else:
        arr = W if kind == "cupy" else _as_float_numpy(W)
        if arr.dtype.kind != "f":
            raise TypeError(f"W must be float16, float32 or float64 [N, K] (bfloat16 as a torch tensor); "
                            f"got {_describe(arr)}")
        shape = tuple(arr.shape)
    if len(shape) != 2:
        raise ValueError(f"W must be 2-D [N, K]; got {len(shape)}-D shape {shape}")
    N, K = shape
    if N < 1 or K < 1:
        raise ValueError(f"W must have N >= 1 rows and K >= 1 columns; got shape {shape}")
    if K % int(group_size):
        raise ValueError(f"K={K} (W.shape[1]) must be a multiple of group_size={group_size}")


def _quantize_xp(xp, W, g: int, symmetric: bool, block_elements: int, workers: int = 1):
    """numpy (or cupy: the same API) in row blocks of float32; numpy blocks run on `workers`
    threads (its loops release the GIL), each writing its own rows of the outputs."""
    N, K = W.shape
    G = K // g
    out = (xp.empty((N, K // 2), dtype=xp.uint8), xp.empty((N, G), dtype=xp.float16),
           None if symmetric else xp.empty((N, G), dtype=xp.uint8))
    rows = max(1, block_elements // K)
    blocks = [(r0, min(N, r0 + rows)) for r0 in range(0, N, rows)]
    one = lambda b: _quantize_rows(xp, W, b[0], b[1], g, symmetric, out)
    if workers > 1 and len(blocks) > 1:
        with ThreadPoolExecutor(min(workers, len(blocks))) as pool:
            for _ in pool.map(one, blocks):  # in order: the first bad block raises first
                pass
    else:
        for b in blocks:
            one(b)
    return out


def _quantize_rows(xp, W, r0: int, r1: int, g: int, symmetric: bool, out):
    w_out, s_out, z_out = out
    K = W.shape[1]
    G = K // g
    with np.errstate(over="ignore"):  # overflows are found and reported by name below
        v = xp.ascontiguousarray(W[r0:r1], dtype=xp.float32).reshape(r1 - r0, G, g)
        if symmetric:
            hi = xp.maximum(v.max(axis=2), -v.min(axis=2))  # max |v| without an |v| copy
            lo = -hi
        else:
            lo, hi = v.min(axis=2), v.max(axis=2)
        if not bool(xp.isfinite(lo).all() & xp.isfinite(hi).all()):
            _raise_not_finite(W, r0, r1, g, xp)
        if not symmetric:
            lo, hi = xp.minimum(lo, xp.float32(0)), xp.maximum(hi, xp.float32(0))
        span = hi if symmetric else hi - lo
        scale32 = span / xp.float32(7.0 if symmetric else 15.0)
        scale = scale32.astype(xp.float16)
    bits = scale.view(xp.uint16)
    raise_up = ((scale.astype(xp.float32) < scale32) & (bits < _FP16_MIN_NORMAL_BITS)) | (bits == 0)
    scale = (bits + raise_up.astype(xp.uint16)).view(xp.float16)
    scale[span == 0] = 1.0
    if not bool(xp.isfinite(scale).all()):
        _raise_scale_overflow(xp, scale, lo, hi, r0, g, symmetric)
    s = scale.astype(xp.float32)[:, :, None]
    q = v / s
    xp.rint(q, out=q)
    if symmetric:
        q += xp.float32(8)
    else:
        zero = xp.rint(-lo / scale.astype(xp.float32))
        xp.clip(zero, 0, 15, out=zero)
        z_out[r0:r1] = zero.astype(xp.uint8)
        q += zero[:, :, None]
    xp.clip(q, 0, 15, out=q)
    q8 = q.reshape(r1 - r0, K).astype(xp.uint8)
    if sys.byteorder == "little":  # byte pairs as uint16: low byte = even k, high = odd k
        pairs = q8.view(xp.uint16)
        w_out[r0:r1] = (pairs | (pairs >> 4)).astype(xp.uint8)
    else:
        w_out[r0:r1] = q8[:, 0::2] | (q8[:, 1::2] << 4)
    s_out[r0:r1] = scale


def _quantize_torch(W, g: int, symmetric: bool):
    """torch ops on W's device, the same float32 steps as _quantize_xp (tensor divisors only:
    torch CUDA turns division by a Python scalar into a multiplication by its reciprocal)."""
    import torch
    W = W.detach()
    N, K = W.shape
    G = K // g
    dev = W.device
    w_out = torch.empty((N, K // 2), dtype=torch.uint8, device=dev)
    s_out = torch.empty((N, G), dtype=torch.float16, device=dev)
    z_out = None if symmetric else torch.empty((N, G), dtype=torch.uint8, device=dev)
    block = TORCH_CPU_BLOCK_ELEMENTS if dev.type == "cpu" else DEVICE_BLOCK_ELEMENTS
    rows = max(1, block // K)
    f32 = dict(dtype=torch.float32, device=dev)
    div = torch.tensor(7.0 if symmetric else 15.0, **f32)
    zero_f = torch.zeros((), **f32)
    for r0 in range(0, N, rows):
        r1 = min(N, r0 + rows)
        v = W[r0:r1].to(torch.float32).reshape(r1 - r0, G, g)
        lo, hi = torch.aminmax(v, dim=2)
        if symmetric:
            hi = torch.maximum(hi, -lo)
            lo = -hi
        finite = torch.isfinite(lo).all() & torch.isfinite(hi).all()
        if not symmetric:
            lo, hi = torch.minimum(lo, zero_f), torch.maximum(hi, zero_f)
        span = hi if symmetric else hi - lo
        scale32 = span / div
        scale = scale32.to(torch.float16)
        bits = scale.view(torch.int16)  # positive float16: the int16 bits order like the values
        raise_up = ((scale.to(torch.float32) < scale32) & (bits < _FP16_MIN_NORMAL_BITS)) | (bits == 0)
        scale = (bits + raise_up.to(torch.int16)).view(torch.float16)
        scale = torch.where(span == 0, torch.ones_like(scale), scale)
        ok = finite & torch.isfinite(scale).all()
        if not bool(ok):  # the one host sync a block
            Wh = _host_array(W[r0:r1], "W")
            if not bool(finite):
                _raise_not_finite(Wh, 0, r1 - r0, g, np, row_offset=r0)
            _raise_scale_overflow(np, scale.cpu().numpy(), lo.cpu().numpy(), hi.cpu().numpy(), r0, g, symmetric)
        s = scale.to(torch.float32)
        q = torch.round(v / s[:, :, None])
        if symmetric:
            q += 8
        else:
            zero = torch.round(-lo / s).clamp_(0, 15)
            z_out[r0:r1] = zero.to(torch.uint8)
            q += zero[:, :, None]
        q8 = q.clamp_(0, 15).reshape(r1 - r0, K).to(torch.uint8)
        w_out[r0:r1] = q8[:, 0::2] | (q8[:, 1::2] << 4)
        s_out[r0:r1] = scale
    return w_out, s_out, z_out


def _raise_not_finite(W, r0: int, r1: int, g: int, xp, row_offset: int = 0):
    """Name the first (row-major) value of W[r0:r1] that is NaN or inf in float32."""
    bad = ~xp.isfinite(W[r0:r1].astype(xp.float32, copy=False))
    n, k = divmod(int(xp.argmax(bad.reshape(-1))), W.shape[1])
    row = row_offset + r0 + n
    raise ValueError(f"W must be finite (and within float32 range) to quantize: W[{row}, {k}] = "
                     f"{float(W[r0 + n, k])!r} (group {k // g} of row {row}); no scale can represent it")


def _raise_scale_overflow(xp, scale, lo, hi, r0: int, g: int, symmetric: bool):
    bad = ~xp.isfinite(scale)
    flat = int(xp.argmax(bad.reshape(-1)))
    n, j = divmod(flat, scale.shape[1])
    lo_v, hi_v = float(lo[n, j]), float(hi[n, j])
    limit = (f"max |W| {7 * FP16_MAX:.6g} (7 steps of the largest float16 {FP16_MAX:g})" if symmetric else
             f"a range max - min (0 included) of at most {15 * FP16_MAX:.6g} (15 steps of the largest float16 "
             f"{FP16_MAX:g})")
    raise ValueError(f"W's range does not fit float16 scales: row {r0 + n}, group {j} (W[{r0 + n}, {j * g}:{(j + 1) * g}]) "
                     f"spans {lo_v:.6g}..{hi_v:.6g}; expected {limit}. Scale W down (and the outputs up).")


# -- dequantize and the reference GEMV -------------------------------------------------------
def _check_canonical(w, scales, zeros):
    """numpy (w uint8 [N, K/2], scales float [N, G], zeros int [N, G] or None), validated."""
    w = _host_array(w, "w")
    if w.dtype != np.uint8:
        raise TypeError(f"w must be uint8 [N, K/2] (two 4-bit values a byte); got {_describe(w)}")
    _require_2d(w, "w", "[N, K/2]")
    N, half = w.shape
    if N < 1 or half < 1:
        raise ValueError(f"w must be [N, K/2] with N >= 1 and K >= 2; got shape {tuple(w.shape)}")
    K = 2 * half
    s = _host_array(scales, "scales")
    if s.dtype.kind != "f":
        raise TypeError(f"scales must be float16 (or another float type) [N, K/g]; got {_describe(s)}")
    _require_2d(s, "scales", f"[N, K/g] = [{N}, K/g]")
    if s.shape[0] != N or s.shape[1] < 1 or K % s.shape[1]:
        raise ValueError(f"scales must be [N, K/g] = [{N}, K/g] with K/g dividing K={K}; got shape {tuple(s.shape)}")
    if zeros is None:
        return w, s, None
    z = _host_array(zeros, "zeros")
    if z.dtype.kind not in "ui":
        raise TypeError(f"zeros must be uint8 [N, K/g] = {tuple(s.shape)} holding 0..15 (or None: symmetric, "
                        f"zero point 8); got {_describe(z)}")
    if z.shape != s.shape:
        raise ValueError(f"zeros must have the shape of scales {tuple(s.shape)}; got {_describe(z)}")
    out_of_range = (z < 0) | (z > 15)
    if out_of_range.any():
        n, j = np.unravel_index(int(np.argmax(out_of_range)), z.shape)
        raise ValueError(f"zeros must hold zero points 0..15; got zeros[{n}, {j}] = {int(z[n, j])}")
    return w, s, z


def _dequantize_rows(w, s, z, r0: int, r1: int) -> np.ndarray:
    """float64 weights of rows r0:r1; (q - z) * s is exact in float64."""
    q = unpack_nibbles(w[r0:r1]).astype(np.float64)
    g = q.shape[1] // s.shape[1]
    zr = 8.0 if z is None else np.repeat(z[r0:r1].astype(np.float64), g, axis=1)
    return (q - zr) * np.repeat(s[r0:r1].astype(np.float64), g, axis=1)


def _row_block(K: int) -> int:
    return max(1, (1 << 22) // K)


def dequantize(w, scales, zeros=None) -> np.ndarray:
    """(w uint8 [N, K/2], scales float [N, K/g], zeros uint8 0..15 [N, K/g] or None = 8)
    -> float32 weights [N, K], W[n, k] = (q[n, k] - zeros[n, k/g]) * scales[n, k/g]."""
    w, s, z = _check_canonical(w, scales, zeros)
    N, K = w.shape[0], 2 * w.shape[1]
    out = np.empty((N, K), dtype=np.float32)
    step = _row_block(K)
    for r0 in range(0, N, step):
        out[r0:r0 + step] = _dequantize_rows(w, s, z, r0, min(N, r0 + step))
    return out


def _check_x(x, K: int) -> np.ndarray:
    xh = _host_array(x, "x")
    if xh.dtype.kind != "f":
        raise TypeError(f"x must be float16, float32, float64 or bfloat16 (as a torch tensor) [K] or [M, K]; "
                        f"got {_describe(xh)}")
    if xh.ndim not in (1, 2):
        raise ValueError(f"x must be [K] or [M, K] with K={K}; got {xh.ndim}-D shape {tuple(xh.shape)}")
    if xh.shape[-1] != K or (xh.ndim == 2 and xh.shape[0] < 1):
        raise ValueError(f"x must be [K] or [M, K] with K={K} and M >= 1; got shape {tuple(xh.shape)}")
    return xh.astype(np.float64)


def _check_perm(perm, K: int) -> np.ndarray:
    p = _host_array(perm, "perm")
    if p.dtype.kind not in "ui":
        raise TypeError(f"perm must be int32 [K={K}], a permutation of 0..{K - 1}; got {_describe(p)}")
    if p.shape != (K,):
        raise ValueError(f"perm must be int32 [K={K}], a permutation of 0..{K - 1}; got shape {tuple(p.shape)}")
    p = p.astype(np.int64)
    if p.min() < 0 or p.max() >= K or np.unique(p).size != K:
        raise ValueError(f"perm must be a permutation of 0..{K - 1} (each index once); got values "
                         f"{int(p.min())}..{int(p.max())} with {K - np.unique(p).size} repeats")
    return p


def reference_gemv(x, w, scales, zeros=None, perm=None) -> np.ndarray:
    """float64 y = dequantize(w, scales, zeros) @ x[..., perm] (perm None = identity).

    x: [K] or [M, K], numpy float16/32/64 or a torch tensor of any float dtype (bfloat16 too);
    perm: int [K], a permutation of 0..K-1 (act-order GPTQ: weights stored group-contiguous,
    x permuted to match). Returns float64 [N] for x [K], [M, N] for x [M, K]. Evaluated in row
    blocks, so host memory stays bounded for any N."""
    w, s, z = _check_canonical(w, scales, zeros)
    N, K = w.shape[0], 2 * w.shape[1]
    xv = _check_x(x, K)
    if perm is not None:
        xv = xv[..., _check_perm(perm, K)]
    xm = xv.reshape(-1, K)
    y = np.empty((xm.shape[0], N), dtype=np.float64)
    step = _row_block(K)
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        y[:, r0:r1] = xm @ _dequantize_rows(w, s, z, r0, r1).T
    return y.reshape(N) if xv.ndim == 1 else y
