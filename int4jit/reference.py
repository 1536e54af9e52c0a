"""The float64 definition every kernel is checked against, and RTN quantisation."""
from __future__ import annotations

import numpy as np

from .shapes import SUPPORTED_GROUPS


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 values 0..15 of shape [N, K] (K even) -> bytes [N, K/2], low nibble = even k."""
    q = np.asarray(q, dtype=np.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(w: np.ndarray) -> np.ndarray:
    """bytes [N, K/2] -> uint8 values [N, K], the inverse of pack_nibbles."""
    w = np.asarray(w, dtype=np.uint8)
    q = np.empty((w.shape[0], w.shape[1] * 2), dtype=np.uint8)
    q[:, 0::2] = w & 0x0F
    q[:, 1::2] = w >> 4
    return q


def random_problem(shape, rng=None):
    """Random canonical data for a GemvShape: (x float16 [K], w, scales, zeros or None).
    Every byte value and zero point occurs; scales are positive, x is standard normal."""
    rng = np.random.default_rng() if rng is None else rng
    groups = (shape.N, shape.K // shape.group)
    w = rng.integers(0, 256, (shape.N, shape.K // 2), dtype=np.uint8)
    scales = (rng.random(groups, dtype=np.float32) * 0.02 + 1e-3).astype(np.float16)
    zeros = None if shape.symmetric else rng.integers(0, 16, groups, dtype=np.uint8)
    x = rng.standard_normal(shape.K, dtype=np.float32).astype(np.float16)
    return x, w, scales, zeros


def quantize(W, group_size: int = 128, symmetric: bool = False):
    """Round-to-nearest INT4 quantisation of float weights W [N, K].

    Returns (w uint8 [N, K/2], scales float16 [N, K/g], zeros uint8 [N, K/g] or None).
    Symmetric quantisation uses zero point 8 and returns zeros=None.
    """
    W = np.asarray(W)
    if W.ndim != 2:
        raise ValueError(f"W must be 2-D [N, K]; got shape {W.shape}")
    if group_size not in SUPPORTED_GROUPS:
        raise ValueError(f"group_size={group_size} is not supported: expected one of {SUPPORTED_GROUPS}")
    N, K = W.shape
    if K % group_size:
        raise ValueError(f"K={K} (W.shape[1]) must be a multiple of group_size={group_size}")
    Wg = W.astype(np.float64).reshape(N, K // group_size, group_size)
    if symmetric:
        absmax = np.abs(Wg).max(axis=2)
        scale = np.where(absmax > 0, absmax / 7.0, 1.0).astype(np.float16)
        s = scale.astype(np.float64)[:, :, None]
        q = np.clip(np.rint(Wg / s) + 8, 0, 15)
        zeros = None
    else:
        lo, hi = Wg.min(axis=2), Wg.max(axis=2)
        span = hi - lo
        scale = np.where(span > 0, span / 15.0, np.where(lo != 0, np.abs(lo), 1.0)).astype(np.float16)
        s = scale.astype(np.float64)
        zeros = np.clip(np.rint(-lo / s), 0, 15).astype(np.uint8)
        q = np.clip(np.rint(Wg / s[:, :, None]) + zeros[:, :, None], 0, 15)
    w = pack_nibbles(q.reshape(N, K).astype(np.uint8))
    return w, scale, zeros


def dequantize(w, scales, zeros=None) -> np.ndarray:
    """(w [N, K/2], scales [N, K/g], zeros [N, K/g] or None) -> float32 weights [N, K]."""
    return _dequantize64(w, scales, zeros).astype(np.float32)


def _dequantize64(w, scales, zeros) -> np.ndarray:
    q = unpack_nibbles(w).astype(np.float64)
    s = np.asarray(scales).astype(np.float64)
    N, K = q.shape
    if s.ndim != 2 or s.shape[0] != N or s.shape[1] == 0 or K % s.shape[1]:
        raise ValueError(f"scales must be [N, K/g] = [{N}, K/g] with K={K}; got shape {s.shape}")
    g = K // s.shape[1]
    z = np.full(s.shape, 8.0) if zeros is None else np.asarray(zeros).astype(np.float64)
    if z.shape != s.shape:
        raise ValueError(f"zeros must have the shape of scales {s.shape}; got {z.shape}")
    return (q - np.repeat(z, g, axis=1)) * np.repeat(s, g, axis=1)


def reference_gemv(x, w, scales, zeros=None) -> np.ndarray:
    """float64 y = dequantize(w, scales, zeros) @ x, for x [K] or [1, K] (numpy inputs).

    Returns float64 [N] for x [K], [1, N] for x [1, K]."""
    x = np.asarray(x)
    W = _dequantize64(w, scales, zeros)
    xv = x.reshape(-1).astype(np.float64)
    if xv.shape[0] != W.shape[1]:
        raise ValueError(f"x must have K={W.shape[1]} elements; got shape {x.shape}")
    y = W @ xv
    return y.reshape(1, -1) if x.ndim == 2 else y
