"""The keys that travel between modules: problem shape and launch geometry."""
from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_GROUPS = (16, 32, 64, 128, 256)
DEFAULT_GRID_BS, DEFAULT_GRID_TN = (64, 128, 256), (2, 4, 8)
EXHAUSTIVE_GRID_BS, EXHAUSTIVE_GRID_TN = (32, 64, 128, 256, 512), (2, 4, 8, 16)


@dataclass(frozen=True, order=True)
class GemvShape:
    """One GEMV problem: y[N] = dequant(w)[N, K] @ x[K], groups of `group` along K."""
    N: int
    K: int
    group: int
    symmetric: bool

    def __post_init__(self):
        if self.group not in SUPPORTED_GROUPS:
            raise ValueError(f"group size {self.group} is not supported: expected one of {SUPPORTED_GROUPS}")
        if self.N < 1 or self.K < 1:
            raise ValueError(f"N and K must be positive; got N={self.N}, K={self.K}")
        if self.K % self.group:
            raise ValueError(f"K={self.K} must be a multiple of the group size {self.group}")

    @property
    def weight_bytes(self) -> int:
        """Bytes a call must move: int4 weights, scales, zero points, x and y."""
        groups = self.N * (self.K // self.group)
        return self.N * self.K // 2 + 2 * groups + (0 if self.symmetric else groups) + 2 * self.K + 2 * self.N

    def key(self) -> str:
        return f"{self.N}x{self.K}/g{self.group}/{'sym' if self.symmetric else 'asym'}"


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
