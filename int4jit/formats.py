"""Converters from other INT4 formats to int4jit's canonical layout (and back).

Canonical: w uint8 [N, K/2] (low nibble = even k), scales float16 [N, K/g],
zeros uint8 [N, K/g] or None (symmetric, zero point 8)."""
from __future__ import annotations

import numpy as np

from .reference import pack_nibbles
from .shapes import SUPPORTED_GROUPS

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ GEMM: nibble slot i holds column 8c + AWQ_ORDER[i]


def _unpack_low_first(packed: np.ndarray, count: int) -> np.ndarray:
    """uint8 [..., ceil(count/2)] -> uint8 [..., count], the first value in the low nibble."""
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out[..., :count]


def _pack_low_first(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.uint8)
    if v.shape[-1] % 2:
        v = np.concatenate([v, np.zeros(v.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


def _as_fp16_scales(scales, shape, what: str) -> np.ndarray:
    s = np.asarray(scales)
    if s.size != shape[0] * shape[1]:
        raise ValueError(f"{what} scales must have {shape[0]}x{shape[1]} = {shape[0] * shape[1]} values; got shape {s.shape}")
    if s.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"{what} scales must be floating point; got {s.dtype}")
    return np.ascontiguousarray(s.reshape(shape).astype(np.float16))


def _check_block(block_size: int, what: str):
    if block_size not in SUPPORTED_GROUPS:
        raise ValueError(f"{what} block_size={block_size} is not supported: expected one of {SUPPORTED_GROUPS}")


# -- ONNX Runtime MatMulNBits ------------------------------------------------------------
def matmulnbits_padded_k(K: int, block_size: int) -> int:
    return -(-K // block_size) * block_size


def from_matmulnbits(B, scales, zero_points=None, *, K: int, N: int, block_size: int, bits: int = 4):
    """MatMulNBits (bits=4) tensors -> canonical (w, scales, zeros).

    B: uint8 [N, ceil(K/block), block/2]. scales: [N, k_blocks] or flat [N*k_blocks].
    zero_points: packed uint8 [N, ceil(k_blocks/2)] (or flat), unpacked floats [N, k_blocks],
    or None (zero point 8). When K is not a multiple of block_size the last block is padded:
    the result is for K_padded = k_blocks*block_size, and x must be zero-padded to it
    (MatMulNBitsWeights.pad_x does that)."""
    if bits != 4:
        raise ValueError(f"MatMulNBits bits={bits}: int4jit reads bits=4 only")
    _check_block(block_size, "MatMulNBits")
    k_blocks = -(-K // block_size)
    B = np.asarray(B)
    if B.dtype != np.uint8 or B.size != N * k_blocks * block_size // 2:
        raise ValueError(f"MatMulNBits B must be uint8 [N, k_blocks, block/2] = [{N}, {k_blocks}, {block_size // 2}]; "
                         f"got {B.dtype} {B.shape}")
    w = np.ascontiguousarray(B.reshape(N, k_blocks * block_size // 2))
    s = _as_fp16_scales(scales, (N, k_blocks), "MatMulNBits")
    if zero_points is None:
        return w, s, None
    zp = np.asarray(zero_points)
    if zp.dtype == np.uint8 and zp.size == N * ((k_blocks + 1) // 2):
        z = _unpack_low_first(zp.reshape(N, (k_blocks + 1) // 2), k_blocks)
    elif zp.size == N * k_blocks and np.issubdtype(zp.dtype, np.floating):
        zf = zp.reshape(N, k_blocks).astype(np.float64)
        if np.any(zf != np.rint(zf)) or zf.min() < 0 or zf.max() > 15:
            raise ValueError("MatMulNBits zero_points in float form must be integers 0..15 for int4jit")
        z = zf.astype(np.uint8)
    else:
        raise ValueError(f"MatMulNBits zero_points must be packed uint8 [N, ceil(k_blocks/2)] = [{N}, {(k_blocks + 1) // 2}] "
                         f"or floats [N, k_blocks]; got {zp.dtype} {zp.shape}")
    return w, s, np.ascontiguousarray(z)


def to_matmulnbits(w, scales, zeros=None):
    """Canonical -> (B [N, k_blocks, block/2], scales [N, k_blocks], packed zero_points or None,
    attributes {K, N, bits, block_size})."""
    w, s = np.asarray(w), np.asarray(scales)
    N, half = w.shape
    K = 2 * half
    block = K // s.shape[1]
    B = np.ascontiguousarray(w.reshape(N, s.shape[1], block // 2))
    zp = None if zeros is None else _pack_low_first(np.asarray(zeros))
    return B, s.astype(np.float16), zp, {"K": K, "N": N, "bits": 4, "block_size": block}


# -- AWQ (GEMM packing) ------------------------------------------------------------------
def _unpack_int32_columns(q: np.ndarray, order) -> np.ndarray:
    """int32 [R, C/8] with nibble slot i holding column 8c + order[i] -> uint8 [R, C]."""
    q = np.asarray(q).astype(np.int64) & 0xFFFFFFFF
    R, C8 = q.shape
    out = np.empty((R, C8, 8), dtype=np.uint8)
    for slot, col in enumerate(order):
        out[:, :, col] = (q >> (4 * slot)) & 0xF
    return out.reshape(R, C8 * 8)


def from_awq(qweight, qzeros, scales, *, group_size: int):
    """AWQ GEMM tensors -> canonical. qweight int32 [K, N/8], qzeros int32 [K/G, N/8]
    (both with the AWQ nibble interleave), scales fp16 [K/G, N]; w = (q - z) * s."""
    _check_block(group_size, "AWQ")
    qweight, qzeros = np.asarray(qweight), np.asarray(qzeros)
    if qweight.dtype != np.int32 or qweight.ndim != 2:
        raise TypeError(f"AWQ qweight must be int32 [K, N/8]; got {qweight.dtype} {qweight.shape}")
    K, N = qweight.shape[0], qweight.shape[1] * 8
    if K % group_size:
        raise ValueError(f"AWQ K={K} must be a multiple of group_size={group_size}")
    if qzeros.shape != (K // group_size, N // 8):
        raise ValueError(f"AWQ qzeros must be int32 [K/G, N/8] = {(K // group_size, N // 8)}; got {qzeros.shape}")
    q = _unpack_int32_columns(qweight, AWQ_ORDER)            # [K, N]
    z = _unpack_int32_columns(qzeros, AWQ_ORDER)             # [K/G, N]
    if np.shape(scales) != (K // group_size, N):
        raise ValueError(f"AWQ scales must be [K/G, N] = {(K // group_size, N)}; got {np.shape(scales)}")
    s = _as_fp16_scales(np.asarray(scales).T, (N, K // group_size), "AWQ")
    return pack_nibbles(q.T), s, np.ascontiguousarray(z.T)


# -- GPTQ --------------------------------------------------------------------------------
def from_gptq(qweight, qzeros, scales, g_idx=None, *, group_size: int, version: int = 1, symmetric: bool = False):
    """GPTQ tensors -> canonical. qweight int32 [K/8, N] (sequential along K), qzeros int32
    [ceil(K/G), N/8] (sequential along N; v1 stores zero - 1, v2 the true zero), scales
    [K/G, N], g_idx [K] (must be the plain ramp k // G: act-order checkpoints are rejected).
    symmetric=True returns zeros=None after checking every zero point is 8."""
    _check_block(group_size, "GPTQ")
    if version not in (1, 2):
        raise ValueError(f"GPTQ version must be 1 (zero - 1 stored) or 2 (true zero); got {version}")
    qweight = np.asarray(qweight)
    if qweight.dtype != np.int32 or qweight.ndim != 2:
        raise TypeError(f"GPTQ qweight must be int32 [K/8, N]; got {qweight.dtype} {qweight.shape}")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    G = K // group_size
    if K % group_size:
        raise ValueError(f"GPTQ K={K} must be a multiple of group_size={group_size}")
    if g_idx is not None:
        g = np.asarray(g_idx)
        if g.shape != (K,) or not np.array_equal(g, np.arange(K) // group_size):
            raise ValueError("GPTQ g_idx is not the plain ramp k // group_size (an act-order / desc_act "
                             "checkpoint): int4jit needs groups contiguous along K; re-export without act-order")
    q32 = qweight.astype(np.int64) & 0xFFFFFFFF
    q = np.empty((K // 8, 8, N), dtype=np.uint8)
    for i in range(8):
        q[:, i, :] = (q32 >> (4 * i)) & 0xF
    q = q.reshape(K, N)
    z = _unpack_int32_columns(qzeros, range(8))  # [G, N]
    if z.shape != (G, N):
        raise ValueError(f"GPTQ qzeros must be int32 [K/G, N/8] = {(G, N // 8)}; got {np.shape(qzeros)}")
    if version == 1:
        z = (z.astype(np.int16) + 1)
        if z.max() > 15:
            raise ValueError("GPTQ v1 zero point 15 + 1 overflows 4 bits: is this a gptq_v2 checkpoint? pass version=2")
        z = z.astype(np.uint8)
    if np.shape(scales) != (G, N):
        raise ValueError(f"GPTQ scales must be [K/G, N] = {(G, N)}; got {np.shape(scales)}")
    s = _as_fp16_scales(np.asarray(scales).T, (N, G), "GPTQ")
    if symmetric:
        if not np.all(z == 8):
            raise ValueError(f"GPTQ symmetric=True but zero points are not all 8 (found {np.unique(z)[:4]}...): "
                             f"wrong version= (v1 stores 7, v2 stores 8)?")
        return pack_nibbles(q.T), s, None
    return pack_nibbles(q.T), s, np.ascontiguousarray(z.T)
