"""Read the MatMulNBits weights of an ONNX model (onnxruntime-genai INT4 models), ready for gemv.
Needs the `onnx` package (pip install onnx); int4jit imports it only here."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats import from_matmulnbits


@dataclass
class MatMulNBitsWeights:
    """One MatMulNBits node's weights in canonical layout. K_padded >= K when the last
    block is ragged: pad x with pad_x before calling gemv."""
    name: str
    w: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None
    K: int
    N: int
    block_size: int

    @property
    def K_padded(self) -> int:
        return 2 * self.w.shape[1]

    def pad_x(self, x):
        """x [K] or [1, K] (numpy) -> zero-padded to K_padded."""
        x = np.asarray(x)
        if x.shape[-1] != self.K:
            raise ValueError(f"x must have K={self.K} elements for {self.name}; got shape {x.shape}")
        pad = [(0, 0)] * (x.ndim - 1) + [(0, self.K_padded - self.K)]
        return np.pad(x, pad) if self.K_padded != self.K else x

    def args(self):
        return self.w, self.scales, self.zeros


def _attrs(node) -> dict:
    import onnx
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def load(path) -> dict[str, MatMulNBitsWeights]:
    """{node name: MatMulNBitsWeights} for every com.microsoft MatMulNBits node (bits=4) in the
    model at `path`; external data is read from beside the file."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:
        raise ImportError("int4jit.onnx.load needs the onnx package: pip install onnx") from e
    model = onnx.load(str(path), load_external_data=True)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
            continue
        a = _attrs(node)
        name = node.name or f"MatMulNBits_{i}"
        inputs = list(node.input) + [""] * 4
        missing = [n for n in inputs[1:3] if n not in inits]
        if missing:
            raise ValueError(f"{name}: weights {missing} are not initializers; int4jit reads constant weights only")
        zp = inits.get(inputs[3]) if inputs[3] else None
        if inputs[3] and zp is None:
            raise ValueError(f"{name}: zero_points {inputs[3]!r} is not an initializer")
        K, N, block = int(a["K"]), int(a["N"]), int(a["block_size"])
        w, s, z = from_matmulnbits(inits[inputs[1]], inits[inputs[2]], zp, K=K, N=N, block_size=block,
                                   bits=int(a.get("bits", 4)))
        out[name] = MatMulNBitsWeights(name, w, s, z, K, N, block)
    return out
