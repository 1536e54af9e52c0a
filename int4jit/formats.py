"""Converters from other INT4 formats to int4jit's canonical layout (and back).

Canonical: w uint8 [N, K/2] (low nibble = even k), scales float16 [N, K/g],
zeros uint8 [N, K/g] or None (symmetric, zero point 8), perm int32 [K] or None.

Act-order (GPTQ desc_act, MatMulNBits g_idx): a checkpoint whose input k belongs to group
g_idx[k] is stored with its K axis sorted by group (stable), so groups are contiguous, and
perm = argsort(g_idx, stable): column j of the canonical w is the checkpoint's input perm[j],
and y = dequantize(w, scales, zeros) @ x[perm] is the checkpoint's y = W @ x.

Groups wider than the kernels' (SUPPORTED_GROUPS): a checkpoint's group of a multiple of one of
them (MatMulNBits block_size 512, 1024, ...) or of all of K (GPTQ/AWQ group_size=-1, per channel:
one scale and zero point a row) is read as groups of WIDE_GROUPS' first size that divides it, each
scale and zero point repeated across them: the same weights exactly, on the kernels' group sizes."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .reference import _framework, pack_nibbles, unpack_nibbles
from .shapes import SUPPORTED_GROUPS

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ GEMM: nibble slot i holds column 8c + AWQ_ORDER[i]
GPTQ_V1_ZERO_OFFSET = 0x11111111       # GPTQ v1 qzeros word = packed true zeros - this, mod 2**32
WIDE_GROUPS = (128, 256, 64, 32, 16)  # a wider group read as: the most tuned size first (table.json)


@dataclass(frozen=True, eq=False)
class Int4Weights:
    """One layer's weights in canonical layout, ready for gemv(x, w, scales, zeros, perm=perm).

    w uint8 [N, K/2]; scales float16 [N, K/g]; zeros uint8 [N, K/g] or None (zero point 8);
    perm int32 [K] or None: x is gathered as x[perm] before the product (act-order checkpoints);
    bias [N] or None (added by the caller: y = W @ x + bias).
    `w, scales, zeros = result` works when perm is None; an act-order result refuses it, so a
    caller written for plain checkpoints cannot drop the permutation silently."""
    w: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None
    perm: np.ndarray | None = None
    bias: np.ndarray | None = None

    def __iter__(self):
        if self.perm is not None:
            raise TypeError("these weights are act-order (perm is not None): unpacking them into "
                            "(w, scales, zeros) would drop the K permutation; read .w, .scales, .zeros "
                            "and .perm and call gemv(x, w, scales, zeros, perm=perm)")
        return iter((self.w, self.scales, self.zeros))

    def args(self):
        """(w, scales, zeros) for gemv; pass perm=self.perm beside them."""
        return self.w, self.scales, self.zeros

    def permute_x(self, x):
        """x [..., K] in the checkpoint's input order -> the order the canonical w expects."""
        x = np.asarray(x)
        return x if self.perm is None else x[..., self.perm]


def _unpack_low_first(packed: np.ndarray, count: int) -> np.ndarray:
    """uint8 [..., ceil(count/2)] -> uint8 [..., count], the first value in the low nibble."""
    return unpack_nibbles(packed)[..., :count]


def _pack_low_first(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.uint8)
    if v.shape[-1] % 2:
        v = np.concatenate([v, np.zeros(v.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


def _as_fp16_scales(scales, shape, what: str) -> np.ndarray:
    """Scales of any float dtype -> float16 `shape`; NaN, inf and a value fp16 cannot hold are
    errors (above 65504 it would become inf, a non-zero below 2**-24 would become 0)."""
    s = np.asarray(scales)
    if not (np.issubdtype(s.dtype, np.floating) and s.dtype.itemsize <= 8):
        raise TypeError(f"{what} scales must be floating point (float16/float32); got {s.dtype}")
    if s.size != shape[0] * shape[1]:
        raise ValueError(f"{what} scales must have {shape[0]}x{shape[1]} = {shape[0] * shape[1]} values; got shape {s.shape}")
    s = s.reshape(shape)
    with np.errstate(over="ignore", under="ignore"):
        s16 = s.astype(np.float16)
    finite = np.isfinite(s)
    big = finite & ~np.isfinite(s16)
    tiny = (s != 0) & (s16 == 0)
    for bad, why in ((~finite, "NaN or infinite: every output they touch would be NaN (a corrupt checkpoint?)"),
                     (big, "overflow float16 (max 65504): they would become inf, and int4jit keeps scales in float16"),
                     (tiny, "underflow float16 (smallest 5.96e-08): they would become 0, and int4jit keeps scales "
                            "in float16")):
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{what} scales: {int(bad.sum())} value(s) {why}; the first at {idx} = "
                             f"{float(s[idx]):.6g}")
    return np.ascontiguousarray(s16)


def kernel_group(group: int, what: str, name: str = "block_size") -> int:
    """The group size the kernels serve a checkpoint's `group` with (-1 already read as K): itself
    where supported, else the first of WIDE_GROUPS that divides it (see the module docstring)."""
    if isinstance(group, (int, np.integer)) and not isinstance(group, bool):
        if group in SUPPORTED_GROUPS:
            return int(group)
        wide = next((g for g in WIDE_GROUPS if group > 0 and group % g == 0), None)
        if wide:
            return wide
    raise ValueError(f"{what} {name}={group!r} is not supported: expected one of {SUPPORTED_GROUPS} or a "
                     f"multiple of one (read as groups of that size)")


def _checkpoint_group(group_size, K: int, what: str) -> tuple[int, int]:
    """A GPTQ/AWQ group_size for K inputs -> (the checkpoint's group, the kernels' group);
    -1 is one group of all K (per channel)."""
    group = K if group_size == -1 and not isinstance(group_size, bool) else group_size
    try:
        return group, kernel_group(group, what, "group_size")
    except ValueError:
        if group_size == -1:
            raise ValueError(f"{what} group_size=-1 (per channel) with K={K}: int4jit reads it as groups of "
                             f"one of {SUPPORTED_GROUPS}, so K must be a multiple of one") from None
        raise ValueError(f"{what} group_size={group_size!r} is not supported: expected one of {SUPPORTED_GROUPS}, "
                         f"a multiple of one (read as groups of that size) or -1 (per channel)") from None


def _repeat_groups(s: np.ndarray, z: np.ndarray | None, times: int):
    """Scales and zero points [N, G] -> [N, G * times], each value repeated `times` times where it stands."""
    if times == 1:
        return s, z
    rep = lambda a: None if a is None else np.ascontiguousarray(np.repeat(a, times, axis=1))
    return rep(s), rep(z)


def _host(a, name: str, what: str):
    """A checkpoint tensor as numpy: numpy (or None) as it is; a torch tensor on any device or a cupy
    array copied to the host, torch's bfloat16 widened to float32 (exactly). Imports neither."""
    kind = _framework(a)
    if kind == "cupy":
        return a.get()
    if kind == "numpy":
        return a
    if a.device.type == "meta":
        raise ValueError(f"{what} {name} is a meta tensor {tuple(a.shape)} (no values): load the checkpoint's "
                         f"tensors first")
    a = a.detach()
    return (a.float() if str(a.dtype) == "torch.bfloat16" else a).cpu().numpy()


def _int_array(a, name: str, what: str, dtype, ndim: int, layout: str) -> np.ndarray:
    if a is None:
        raise TypeError(f"{what} {name} must be {np.dtype(dtype).name} {layout}; got None")
    a = np.asarray(a)
    if a.dtype != dtype or a.ndim != ndim:
        raise TypeError(f"{what} {name} must be {np.dtype(dtype).name} {layout}; got {a.dtype} of shape {a.shape}")
    return a


def act_order_perm(g_idx, K: int, group_size: int, what: str) -> np.ndarray | None:
    """g_idx int [K] (group of each input k) -> perm int32 [K] that makes groups contiguous
    (None when g_idx is the plain ramp k // group_size). Each group must hold exactly
    group_size inputs (the last may hold fewer), as the canonical layout has one scale per
    group_size consecutive columns."""
    g = np.asarray(g_idx)
    if not np.issubdtype(g.dtype, np.integer) or g.shape != (K,):
        raise TypeError(f"{what} g_idx must be integer [K={K}]; got {g.dtype} of shape {g.shape}")
    ramp = np.arange(K) // group_size
    if np.array_equal(g, ramp):
        return None
    perm = np.argsort(g, kind="stable")
    if not np.array_equal(g[perm], ramp):
        counts = np.bincount(np.clip(g, 0, None).astype(np.int64), minlength=int(ramp[-1]) + 1)
        raise ValueError(f"{what} g_idx does not split K={K} into groups of exactly {group_size} "
                         f"(values {int(g.min())}..{int(g.max())}, group sizes {sorted(set(counts.tolist()))[:6]}): "
                         f"int4jit's layout needs every group (but a ragged last) to hold group_size inputs")
    return perm.astype(np.int32)


# -- ONNX Runtime MatMulNBits ------------------------------------------------------------
def from_matmulnbits(B, scales, zero_points=None, *, K: int, N: int, block_size: int, bits: int = 4,
                     g_idx=None, weight_prepacked: int = 0, name: str = "MatMulNBits") -> Int4Weights:
    """MatMulNBits (bits=4) tensors -> canonical Int4Weights.

    B: uint8 [N, ceil(K/block), block/2] (weight_prepacked=1/2: onnxruntime's CUDA fpA_intB
    SM80/SM90 layout of the same bytes, decoded exactly). scales: [N, k_blocks] or flat
    [N*k_blocks], float16 or float32 (must fit float16). zero_points: packed uint8
    [N, ceil(k_blocks/2)] (or flat), unpacked floats [N, k_blocks], or None (zero point 8).
    g_idx: int [K] group of each input (act-order) -> perm. When K is not a multiple of
    block_size the last block is padded: the result is for K_padded = k_blocks*block_size and
    x must be zero-padded to it (MatMulNBitsWeights.pad_x); perm then has K_padded entries."""
    what = name
    B, scales, zero_points, g_idx = (_host(a, n, what) for a, n in
                                     ((B, "B"), (scales, "scales"), (zero_points, "zero_points"), (g_idx, "g_idx")))
    if bits != 4:
        raise ValueError(f"{what}: bits={bits}: int4jit reads bits=4 only")
    group = kernel_group(block_size, what)
    for arg, v in (("K", K), ("N", N)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{what}: {arg} must be a positive integer; got {v!r}")
    k_blocks = -(-K // block_size)
    B = np.asarray(B)
    if B.dtype != np.uint8 or B.size != N * k_blocks * block_size // 2:
        raise ValueError(f"{what}: B must be uint8 [N, k_blocks, block/2] = [{N}, {k_blocks}, {block_size // 2}]; "
                         f"got {B.dtype} {B.shape}")
    if weight_prepacked:
        w = unpack_fpa_intb(B, N=N, K=k_blocks * block_size, arch=weight_prepacked, what=what)
    else:
        w = np.ascontiguousarray(B.reshape(N, k_blocks * block_size // 2))
    s = _as_fp16_scales(scales, (N, k_blocks), f"{what}")
    z = None
    if zero_points is not None:
        zp = np.asarray(zero_points)
        if zp.dtype == np.uint8 and zp.size == N * ((k_blocks + 1) // 2):
            z = np.ascontiguousarray(_unpack_low_first(zp.reshape(N, (k_blocks + 1) // 2), k_blocks))
        elif zp.size == N * k_blocks and np.issubdtype(zp.dtype, np.floating):
            zf = zp.reshape(N, k_blocks).astype(np.float64)
            if np.any(zf != np.rint(zf)) or zf.min() < 0 or zf.max() > 15:
                raise ValueError(f"{what}: zero_points in float form must be integers 0..15 for int4jit")
            z = zf.astype(np.uint8)
        else:
            raise ValueError(f"{what}: zero_points must be packed uint8 [N, ceil(k_blocks/2)] = [{N}, {(k_blocks + 1) // 2}] "
                             f"or floats [N, k_blocks]; got {zp.dtype} {zp.shape}")
    perm = None
    if g_idx is not None:
        K_padded = k_blocks * block_size
        perm = act_order_perm(g_idx, K, block_size, what)
        if perm is not None:
            perm = np.concatenate([perm, np.arange(K, K_padded, dtype=np.int32)])  # padding stays last
            q = _unpack_low_first(w, K_padded)
            w = pack_nibbles(q[:, perm])
    s, z = _repeat_groups(s, z, block_size // group)
    return Int4Weights(w, s, z, perm)


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


# -- onnxruntime's CUDA fpA_intB prepacked layout (MatMulNBits weight_prepacked=1/2) -----
# Ported from onnxruntime-genai 0.18 models/quantization/cuda_quantizer.py
# (_pack_weights_for_cuda_mixed_gemm / _preprocess_weights_for_mixed_gemm_torch, itself a port of
# onnxruntime's preprocess_weights_for_mixed_gemm): for 4 bits the packing moves nibbles and
# leaves their values unchanged (it flips bit 3 twice: unsigned -> signed, then the "add bias"
# step). So it is one permutation of nibble positions, computed here on position labels.
_FPA_INTB_ROW_PERM_16_4 = (0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27,
                           4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31)
FPA_INTB_LAYOUTS = {1: "SM80", 2: "SM90"}


def fpa_intb_source_positions(N: int, K: int, arch: int) -> np.ndarray:
    """int64 [N*K]: entry j (j-th nibble of the prepacked bytes, low nibble first) is the
    position n*K + k of the plain MatMulNBits weight it holds."""
    label = np.arange(N * K, dtype=np.int64).reshape(N, K)
    t = label.T                                     # front end: (N, K) -> (K, N), nibbles along N
    rows = np.arange(K)
    t = t[(rows // 32) * 32 + np.asarray(_FPA_INTB_ROW_PERM_16_4)[rows % 32]]  # permute_B_rows
    t = t.T.reshape(K, N)                           # subbyte_transpose, viewed back as [K, N/2] bytes
    if arch == 1:                                   # interleave_column_major (SM80 only)
        t = t.reshape(-1, 4, K // 64, 32, 2).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(t).reshape(-1, 8)[:, list(AWQ_ORDER)].reshape(-1)  # add_bias_and_interleave


def unpack_fpa_intb(B, *, N: int, K: int, arch: int, what: str = "MatMulNBits") -> np.ndarray:
    """Prepacked B bytes (N*K/2 of them) -> canonical w uint8 [N, K/2]."""
    if arch not in FPA_INTB_LAYOUTS:
        raise ValueError(f"{what}: attribute weight_prepacked={arch} names a layout int4jit does not know "
                         f"(onnxruntime defines 1 = SM80 and 2 = SM90 fpA_intB)")
    if K % 64 or N % 16:
        raise ValueError(f"{what}: attribute weight_prepacked={arch} ({FPA_INTB_LAYOUTS[arch]} fpA_intB) needs "
                         f"K % 64 == 0 and N % 16 == 0; got K={K}, N={N}")
    nib = _unpack_low_first(np.asarray(B, dtype=np.uint8).reshape(-1), N * K)
    q = np.empty(N * K, dtype=np.uint8)
    q[fpa_intb_source_positions(N, K, arch)] = nib
    return pack_nibbles(q.reshape(N, K))


# -- AWQ (GEMM packing) ------------------------------------------------------------------
def _unpack_int32_columns(q: np.ndarray, order) -> np.ndarray:
    """int32 [R, C/8] with nibble slot i holding column 8c + order[i] -> uint8 [R, C]."""
    q = np.asarray(q).astype(np.int64) & 0xFFFFFFFF
    R, C8 = q.shape
    out = np.empty((R, C8, 8), dtype=np.uint8)
    for slot, col in enumerate(order):
        out[:, :, col] = (q >> (4 * slot)) & 0xF
    return out.reshape(R, C8 * 8)


def from_awq(qweight, qzeros, scales, *, group_size: int) -> Int4Weights:
    """AWQ GEMM tensors -> canonical. qweight int32 [K, N/8], qzeros int32 [K/G, N/8]
    (both with the AWQ nibble interleave), scales fp16 [K/G, N]; w = (q - z) * s.
    group_size=-1 is one group of all K (per channel); it and groups wider than the kernels' (512,
    ...) are read as the module docstring says."""
    qweight, qzeros, scales = (_host(a, n, "AWQ") for a, n in
                               ((qweight, "qweight"), (qzeros, "qzeros"), (scales, "scales")))
    qweight = _int_array(qweight, "qweight", "AWQ", np.int32, 2, "[K, N/8]")
    qzeros = _int_array(qzeros, "qzeros", "AWQ", np.int32, 2, "[K/G, N/8]")
    K, N = qweight.shape[0], qweight.shape[1] * 8
    group, served = _checkpoint_group(group_size, K, "AWQ")
    if K % group:
        raise ValueError(f"AWQ K={K} must be a multiple of group_size={group_size}")
    if qzeros.shape != (K // group, N // 8):
        raise ValueError(f"AWQ qzeros must be int32 [K/G, N/8] = {(K // group, N // 8)}; got {qzeros.shape}")
    q = _unpack_int32_columns(qweight, AWQ_ORDER)            # [K, N]
    z = np.ascontiguousarray(_unpack_int32_columns(qzeros, AWQ_ORDER).T)  # [N, K/G]
    if np.shape(scales) != (K // group, N):
        raise ValueError(f"AWQ scales must be [K/G, N] = {(K // group, N)}; got {np.shape(scales)}")
    s = _as_fp16_scales(np.asarray(scales).T, (N, K // group), "AWQ")
    s, z = _repeat_groups(s, z, group // served)
    return Int4Weights(pack_nibbles(q.T), s, z)


# -- GPTQ --------------------------------------------------------------------------------
def from_gptq(qweight, qzeros, scales, g_idx=None, *, group_size: int, version: int = 1,
              symmetric: bool = False) -> Int4Weights:
    """GPTQ tensors -> canonical Int4Weights. qweight int32 [K/8, N] (sequential along K),
    qzeros int32 [K/G, N/8] (sequential along N), scales [K/G, N], g_idx int [K] or None.

    version=1 (checkpoint_format "gptq"): each qzeros word holds the packed true zeros minus
    0x11111111 in 32-bit arithmetic (GPTQModel/AutoGPTQ: a zero point of 0 borrows from the next
    nibble), read back by adding 0x11111111 to the whole word. version=2 ("gptq_v2"): the true zeros.
    g_idx: group of each input k. A non-ramp g_idx (act-order, desc_act=True) gives perm (see the
    module docstring). g_idx=None means the plain ramp k // G: an act-order checkpoint read without
    its g_idx gives wrong weights, and the tensors alone cannot tell -- read the checkpoint's
    quantize config (from_quantized_layer does).
    symmetric=True returns zeros=None after checking every zero point is 8.
    group_size=-1 is one group of all K (per channel); it and groups wider than the kernels' (512,
    ...) are read as the module docstring says."""
    if version not in (1, 2):
        raise ValueError(f"GPTQ version must be 1 (zeros - 0x11111111 stored) or 2 (true zeros); got {version!r}")
    qweight, qzeros, scales, g_idx = (_host(a, n, "GPTQ") for a, n in
                                      ((qweight, "qweight"), (qzeros, "qzeros"), (scales, "scales"), (g_idx, "g_idx")))
    qweight = _int_array(qweight, "qweight", "GPTQ", np.int32, 2, "[K/8, N]")
    qzeros = _int_array(qzeros, "qzeros", "GPTQ", np.int32, 2, "[K/G, N/8]")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    group, served = _checkpoint_group(group_size, K, "GPTQ")
    if K % group:
        raise ValueError(f"GPTQ K={K} must be a multiple of group_size={group_size}")
    G = K // group
    if qzeros.shape != (G, -(-N // 8)) or N % 8:
        raise ValueError(f"GPTQ qzeros must be int32 [K/G, N/8] = {(G, N // 8)} (N a multiple of 8); got {qzeros.shape}")
    perm = None if g_idx is None else act_order_perm(g_idx, K, group, "GPTQ")
    q32 = qweight.view(np.uint32)
    q = np.empty((K // 8, 8, N), dtype=np.uint8)
    for i in range(8):
        q[:, i, :] = (q32 >> np.uint32(4 * i)) & np.uint32(0xF)
    q = q.reshape(K, N)
    zw = qzeros.view(np.uint32)
    if version == 1:
        zw = zw + np.uint32(GPTQ_V1_ZERO_OFFSET)  # uint32 arithmetic wraps mod 2**32, as the producers' int32 does
    z = _unpack_int32_columns(zw.view(np.int32), range(8))  # [G, N]
    if np.shape(scales) != (G, N):
        raise ValueError(f"GPTQ scales must be [K/G, N] = {(G, N)}; got {np.shape(scales)}")
    s = _as_fp16_scales(np.asarray(scales).T, (N, G), "GPTQ")
    qt = q.T if perm is None else q.T[:, perm]
    if symmetric and not np.all(z == 8):
        raise ValueError(f"GPTQ symmetric=True but zero points are not all 8 (found {np.unique(z)[:4]}...): "
                         f"wrong version= (v1 stores 0x77777777, v2 0x88888888)?")
    z = None if symmetric else np.ascontiguousarray(z.T)
    s, z = _repeat_groups(s, z, group // served)
    return Int4Weights(pack_nibbles(qt), s, z, perm)


# -- whole checkpoints: the quantize config says what the tensors cannot -------------------
def _quant_config(config: dict) -> dict:
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (quantize_config.json, or config.json with "
                        f"'quantization_config'); got {type(config).__name__}")
    return config.get("quantization_config", config)


def _config_value(cfg: dict, keys, default=None, required=False):
    for k in keys:
        if k in cfg:
            return cfg[k]
    if required:
        raise ValueError(f"quantize config has none of {list(keys)}; got keys {sorted(cfg)}")
    return default


def from_quantized_layer(config: dict, tensors: dict) -> Int4Weights:
    """One GPTQ or AWQ layer of a Hugging Face checkpoint -> canonical Int4Weights, reading the
    flags the tensors cannot carry from its quantize config.

    config: quantize_config.json / quant_config.json as a dict, or config.json holding a
    "quantization_config" dict. Read: quant_method ("gptq" | "awq"), bits (4), group_size
    (or q_group_size), GPTQ: desc_act (act-order: g_idx required), sym, checkpoint_format /
    format ("gptq" = v1, "gptq_v2"), pack_dtype (int32); AWQ: version "gemm", zero_point.
    tensors: the layer's arrays by name, "qweight", "qzeros", "scales", optional "g_idx" and
    "bias" (a dotted prefix such as "model.layers.0.mlp.up_proj." is ignored)."""
    cfg = _quant_config(config)
    by_suffix: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        key = str(name).rsplit(".", 1)[-1]
        if key in by_suffix:
            raise ValueError(f"tensors holds more than one '{key}' ({name!r}): pass one layer's tensors")
        by_suffix[key] = value
    missing = [k for k in ("qweight", "qzeros", "scales") if k not in by_suffix]
    if missing:
        raise ValueError(f"tensors lacks {missing}; got {sorted(tensors)}")
    method = str(_config_value(cfg, ("quant_method",), "")).lower()
    if not method:
        method = "awq" if ("w_bit" in cfg or str(cfg.get("version", "")).lower() in ("gemm", "gemv")) else "gptq"
    bits = int(_config_value(cfg, ("bits", "w_bit"), 4))
    if bits != 4:
        raise ValueError(f"quantize config bits={bits}: int4jit reads 4-bit checkpoints only")
    group_size = int(_config_value(cfg, ("group_size", "q_group_size"), required=True))
    bias = by_suffix.get("bias")
    if method == "awq":
        version = str(cfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"AWQ version={version!r}: int4jit reads the GEMM packing only")
        if not cfg.get("zero_point", True):
            raise ValueError("AWQ zero_point=False: int4jit reads AWQ checkpoints with zero points only")
        out = from_awq(by_suffix["qweight"], by_suffix["qzeros"], by_suffix["scales"], group_size=group_size)
    elif method == "gptq":
        fmt = str(_config_value(cfg, ("checkpoint_format", "format"), "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"GPTQ checkpoint_format={fmt!r}: int4jit reads 'gptq' (v1) and 'gptq_v2'")
        pack_dtype = str(cfg.get("pack_dtype", "int32")).replace("torch.", "")
        if pack_dtype != "int32":
            raise ValueError(f"GPTQ pack_dtype={pack_dtype!r}: int4jit reads int32 packing only")
        g_idx = by_suffix.get("g_idx")
        if cfg.get("desc_act", False) and g_idx is None:
            raise ValueError("quantize config says desc_act=True (act-order) but tensors has no g_idx: "
                             "without it the weights cannot be read right")
        out = from_gptq(by_suffix["qweight"], by_suffix["qzeros"], by_suffix["scales"], g_idx,
                        group_size=group_size, version=2 if fmt == "gptq_v2" else 1,
                        symmetric=bool(cfg.get("sym", False)))
    else:
        raise ValueError(f"quant_method={method!r}: int4jit reads 'gptq' and 'awq' checkpoints")
    if bias is not None:
        bias = np.asarray(_host(bias, "bias", "the layer's"))
        if bias.shape != (out.w.shape[0],) or not np.issubdtype(bias.dtype, np.floating):
            raise ValueError(f"bias must be float [N={out.w.shape[0]}]; got {bias.dtype} {bias.shape}")
        out = replace(out, bias=bias)
    return out
