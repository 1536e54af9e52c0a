"""Read the MatMulNBits weights of an ONNX model (onnxruntime-genai INT4 models), ready for gemv.
Needs the `onnx` package (pip install onnx); int4jit imports it only here."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .formats import act_order_perm, from_matmulnbits, kernel_group

log = logging.getLogger("int4jit.onnx")

# MatMulNBits inputs (onnxruntime contrib_defs.cc): A, B, scales, zero_points, g_idx, bias
B_INPUT, SCALES_INPUT, ZERO_POINTS_INPUT, G_IDX_INPUT, BIAS_INPUT = 1, 2, 3, 4, 5


class Unsupported(ValueError):
    """A valid MatMulNBits node int4jit cannot serve (another bit width, weights computed at run
    time, a layout it does not know): load() skips it and reports why."""


@dataclass
class MatMulNBitsWeights:
    """One MatMulNBits node's weights in canonical layout.

    K_padded >= K when the last block is ragged: pad x with pad_x. perm (int32 [K_padded] or
    None): the node had an act-order g_idx; the weights' K axis is sorted by group and x must be
    gathered as x[perm] (gemv(x, *args(), perm=perm) does it; prepare_x does it in numpy).
    bias (float [N] or None): MatMulNBits input 5, to be added to the product."""
    name: str
    w: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None
    K: int
    N: int
    block_size: int
    perm: np.ndarray | None = None
    bias: np.ndarray | None = None

    @property
    def K_padded(self) -> int:
        return 2 * self.w.shape[1]

    def pad_x(self, x):
        """x [..., K] (numpy) -> zero-padded to K_padded."""
        x = np.asarray(x)
        if x.shape[-1] != self.K:
            raise ValueError(f"x must have K={self.K} elements for {self.name}; got shape {x.shape}")
        pad = [(0, 0)] * (x.ndim - 1) + [(0, self.K_padded - self.K)]
        return np.pad(x, pad) if self.K_padded != self.K else x

    def prepare_x(self, x):
        """x [..., K] in the model's order -> padded and permuted: what w's columns multiply."""
        x = self.pad_x(x)
        return x if self.perm is None else x[..., self.perm]

    def args(self):
        """(w, scales, zeros) for gemv; pass perm=self.perm beside them and add self.bias."""
        return self.w, self.scales, self.zeros


class MatMulNBitsModel(dict):
    """{node name: MatMulNBitsWeights}, in graph order, for every node int4jit can read;
    .skipped: {node name: reason} for the MatMulNBits nodes it cannot."""

    def __init__(self):
        super().__init__()
        self.skipped: dict[str, str] = {}


def _attrs(node) -> dict:
    import onnx
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _int_attr(attrs: dict, key: str, name: str, default=None) -> int:
    if key not in attrs:
        if default is None:
            raise ValueError(f"{name}: MatMulNBits attribute {key!r} is missing (required)")
        return default
    v = attrs[key]
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise ValueError(f"{name}: MatMulNBits attribute {key!r} must be an integer; got {v!r}")
    return int(v)


def _read_node(name: str, node, inits: dict) -> MatMulNBitsWeights:
    a = _attrs(node)
    K, N = _int_attr(a, "K", name), _int_attr(a, "N", name)
    block = _int_attr(a, "block_size", name)
    bits = _int_attr(a, "bits", name, 4)
    prepacked = _int_attr(a, "weight_prepacked", name, 0)
    if K < 1 or N < 1:
        raise ValueError(f"{name}: attributes K={K} and N={N} must be positive")
    if bits != 4:
        raise Unsupported(f"bits={bits}: int4jit reads 4-bit MatMulNBits only")
    if prepacked not in (0, 1, 2):
        raise Unsupported(f"attribute weight_prepacked={prepacked}: onnxruntime defines 0 (plain), "
                          f"1 (SM80 fpA_intB) and 2 (SM90 fpA_intB); int4jit does not know this layout")
    inputs = list(node.input) + [""] * 6

    def constant(index: int, what: str):
        tensor = inputs[index]
        if not tensor:
            return None
        if tensor not in inits:
            raise Unsupported(f"{what} {tensor!r} (input {index}) is not an initializer; int4jit reads "
                              f"constant weights only")
        return inits[tensor]

    B, scales = constant(B_INPUT, "B"), constant(SCALES_INPUT, "scales")
    if B is None or scales is None:
        raise ValueError(f"{name}: MatMulNBits needs inputs B and scales; got {inputs[:3]}")
    zp = constant(ZERO_POINTS_INPUT, "zero_points")
    g_idx = constant(G_IDX_INPUT, "g_idx")
    bias = constant(BIAS_INPUT, "bias")
    try:
        kernel_group(block, name)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    if prepacked and (K % 64 or N % 16):
        raise Unsupported(f"attribute weight_prepacked={prepacked} with K={K}, N={N}: the fpA_intB layout "
                          f"int4jit decodes needs K % 64 == 0 and N % 16 == 0")
    if g_idx is not None:
        try:
            act_order_perm(g_idx, K, block, f"g_idx {inputs[G_IDX_INPUT]!r}")
        except ValueError as e:  # a valid node whose groups int4jit's layout cannot hold
            raise Unsupported(str(e)) from None
    wt = from_matmulnbits(B, scales, zp, K=K, N=N, block_size=block, bits=bits, g_idx=g_idx,
                          weight_prepacked=prepacked, name=f"{name} (tensor {inputs[SCALES_INPUT]!r} / {inputs[B_INPUT]!r})")
    if bias is not None:
        bias = np.asarray(bias)
        if bias.shape != (N,) or not np.issubdtype(bias.dtype, np.floating):
            raise ValueError(f"{name}: bias {inputs[BIAS_INPUT]!r} must be float [N={N}]; got {bias.dtype} {bias.shape}")
    return MatMulNBitsWeights(name, wt.w, wt.scales, wt.zeros, K, N, block, wt.perm, bias)


def load(path, *, strict: bool = False) -> MatMulNBitsModel:
    """Every com.microsoft MatMulNBits node of the model at `path` that int4jit can serve, as
    {node name: MatMulNBitsWeights} in graph order (external data is read from beside the file).

    Nodes int4jit cannot serve (bits other than 4, weights that are not initializers, unknown
    weight_prepacked layouts, unsupported block sizes, g_idx groups not block_size long) are left out and listed with the reason
    in the result's .skipped, and logged once as a warning; strict=True raises instead.
    Malformed nodes (missing attributes, tensors of the wrong shape, scales that do not fit
    float16) raise ValueError naming the node."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:
        raise ImportError("int4jit.onnx.load needs the onnx package: pip install onnx") from e
    model = onnx.load(str(path), load_external_data=True)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = MatMulNBitsModel()
    for i, node in enumerate(model.graph.node):
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
            continue
        name = node.name or f"MatMulNBits_{i}"
        try:
            out[name] = _read_node(name, node, inits)
        except Unsupported as e:
            if strict:
                raise Unsupported(f"{name}: {e}") from None
            out.skipped[name] = str(e)
    if out.skipped:
        log.warning("int4jit.onnx.load(%s): read %d MatMulNBits node(s), skipped %d: %s", path, len(out),
                    len(out.skipped), "; ".join(f"{n}: {r}" for n, r in list(out.skipped.items())[:8]))
    return out
