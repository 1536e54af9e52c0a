"""The keys that travel between modules: problem shape and launch geometry."""
from __future__ import annotations

import re
from dataclasses import dataclass

SUPPORTED_GROUPS = (16, 32, 64, 128, 256)
DEFAULT_GRID_BS, DEFAULT_GRID_TN = (64, 128, 256), (2, 4, 8)
EXHAUSTIVE_GRID_BS, EXHAUSTIVE_GRID_TN = (32, 64, 128, 256, 512), (2, 4, 8, 16)


ACTIVATION_DTYPES = ("float16", "bfloat16")
MAX_TOKENS = 16  # tokens (M) one GEMV launch serves; more is prefill (dequantise + matmul)


@dataclass(frozen=True, order=True)
class GemvShape:
    """One GEMV problem: y[M, N] = x[M, K] @ dequant(w)[N, K]^T, groups of `group` along K.
    dtype: the activations' (and output's) type; scale_dtype: the scales'."""
    N: int
    K: int
    group: int
    symmetric: bool
    M: int = 1
    dtype: str = "float16"
    scale_dtype: str = "float16"

    def __post_init__(self):
        if self.group not in SUPPORTED_GROUPS:
            raise ValueError(f"group size {self.group} is not supported: expected one of {SUPPORTED_GROUPS}")
        if self.N < 1 or self.K < 1:
            raise ValueError(f"N and K must be positive; got N={self.N}, K={self.K}")
        if self.K % self.group:
            raise ValueError(f"K={self.K} must be a multiple of the group size {self.group}")
        if not 1 <= self.M <= MAX_TOKENS:
            raise ValueError(f"M={self.M} tokens: one GEMV launch serves 1..{MAX_TOKENS}")
        if self.dtype not in ACTIVATION_DTYPES or self.scale_dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"activations and scales must be one of {ACTIVATION_DTYPES}; "
                             f"got {self.dtype} and {self.scale_dtype}")

    @property
    def bytes_moved(self) -> int:
        """Bytes a call must move: int4 weights, scales, zero points, x and y."""
        groups = self.N * (self.K // self.group)
        return (self.N * self.K // 2 + 2 * groups + (0 if self.symmetric else groups)
                + 2 * self.M * (self.K + self.N))

    def key(self) -> str:
        """'4096x4096/g128/asym', with '/m8', '/bfloat16', '/sbfloat16' where they differ."""
        extra = (f"/m{self.M}" if self.M > 1 else "") + (f"/{self.dtype}" if self.dtype != "float16" else "") \
            + (f"/s{self.scale_dtype}" if self.scale_dtype != "float16" else "")
        return f"{self.N}x{self.K}/g{self.group}/{'sym' if self.symmetric else 'asym'}{extra}"

    @classmethod
    def from_key(cls, key: str) -> "GemvShape":
        """The shape a key() names: '4096x4096/g128/asym', '4096x4096/g32/sym/m8/bfloat16', ..."""
        m = _KEY.fullmatch(key)
        if m is None:
            raise ValueError(f"bad shape key {key!r}: expected e.g. '4096x4096/g128/asym' or "
                             f"'4096x4096/g32/sym/m8/bfloat16/sbfloat16'")
        shape = cls(int(m["N"]), int(m["K"]), int(m["group"]), m["sym"] == "sym", int(m["M"] or 1),
                    m["dtype"] or "float16", m["scale_dtype"] or "float16")
        if shape.key() != key:  # e.g. '/m1', which key() never writes
            raise ValueError(f"bad shape key {key!r}: the shape it names is written {shape.key()!r}")
        return shape


_OTHER_DTYPES = "|".join(d for d in ACTIVATION_DTYPES if d != "float16")
_KEY = re.compile(rf"(?P<N>\d+)x(?P<K>\d+)/g(?P<group>\d+)/(?P<sym>a?sym)(?:/m(?P<M>\d+))?"
                  rf"(?:/(?P<dtype>{_OTHER_DTYPES}))?(?:/s(?P<scale_dtype>{_OTHER_DTYPES}))?", re.ASCII)


@dataclass(frozen=True, order=True)
class LaunchConfig:
    """Launch geometry: BS threads per block, TN output rows per thread tile."""
    BS: int
    TN: int

    def __post_init__(self):
        if self.BS not in EXHAUSTIVE_GRID_BS or self.TN not in EXHAUSTIVE_GRID_TN:
            raise ValueError(f"launch config ({self.BS}, {self.TN}) is outside the grid: "
                             f"BS in {EXHAUSTIVE_GRID_BS}, TN in {EXHAUSTIVE_GRID_TN}")

    def __str__(self) -> str:
        return f"{self.BS},{self.TN}"


def candidate_grid(exhaustive: bool) -> list[LaunchConfig]:
    bs, tn = (EXHAUSTIVE_GRID_BS, EXHAUSTIVE_GRID_TN) if exhaustive else (DEFAULT_GRID_BS, DEFAULT_GRID_TN)
    return [LaunchConfig(b, t) for b in bs for t in tn]
