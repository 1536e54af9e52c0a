"""Rendering: every grid point, every group, both vendors; derived geometry invariants."""
import re

import pytest

from int4jit import compiler
from int4jit.shapes import SUPPORTED_GROUPS, GemvShape, LaunchConfig, candidate_grid

ARCHS = ["sm_80", "sm_90", "gfx90a", "gfx1030", "gfx900", "gfx1151"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cfg", candidate_grid(True), ids=str)
def test_every_grid_point_renders_completely(arch, cfg):
    shape = GemvShape(4096, 4096, 128, False)
    name, src = compiler.render_gemv_source(shape, cfg, arch)
    assert "${" not in src and "$" not in src
    assert f"constexpr int BS = {cfg.BS};" in src and f"constexpr int TN = {cfg.TN};" in src
    assert f"{compiler.kernel_name(shape, cfg)}(" in src
    assert name.endswith(f"_{arch}.hip")


@pytest.mark.parametrize("arch,warp,dot2", [("sm_90", 32, None), ("gfx90a", 64, 1), ("gfx1030", 32, 1),
                                            ("gfx900", 64, 0), ("gfx1010", 32, 0), ("gfx942", 64, 1)])
def test_vendor_prelude(arch, warp, dot2):
    _, src = compiler.render_gemv_source(GemvShape(64, 256, 32, True), LaunchConfig(64, 2), arch)
    if arch.startswith("sm_"):
        assert "#define I4_WARP 32" in src and "asm(" in src and "__builtin_amdgcn" not in src
    else:
        assert f"#define I4_WARP {warp}" in src and f"#define I4_HAS_DOT2 {dot2}" in src


def test_specialisation_changes_source():
    base = GemvShape(4096, 4096, 128, False)
    srcs = {compiler.render_gemv_source(s, LaunchConfig(128, 4), "sm_90")[1]
            for s in [base, GemvShape(4096, 4096, 64, False), GemvShape(4096, 4096, 128, True),
                      GemvShape(4095, 4096, 128, False), GemvShape(4096, 4224, 128, False)]}
    assert len(srcs) == 5


@pytest.mark.parametrize("N", [1, 7, 896, 4097, 11008])
@pytest.mark.parametrize("K", [16, 48, 896, 4096, 14336])
@pytest.mark.parametrize("cfg", candidate_grid(True), ids=str)
def test_geometry_covers_every_row_and_chunk(N, K, cfg):
    shape = GemvShape(N, K, 16, False)
    geo = compiler.kernel_geometry(shape, cfg)
    assert geo.vec == (16 if K % 32 == 0 else 8)
    assert cfg.BS % geo.kt == 0 and geo.kt & (geo.kt - 1) == 0
    assert geo.grid * geo.rows_per_block >= N > (geo.grid - 1) * geo.rows_per_block
    chunks = K // (2 * geo.vec)
    assert geo.kt < 2 * chunks or geo.kt == 1  # no more than half the K lanes idle
    assert geo.block == cfg.BS


def test_every_group_renders():
    for g in SUPPORTED_GROUPS:
        _, src = compiler.render_gemv_source(GemvShape(32, 512, g, False), LaunchConfig(64, 4), "gfx90a")
        assert re.search(rf"constexpr int GROUP = {g};", src)


def test_template_hash_is_stable_and_short():
    assert compiler.template_hash() == compiler.template_hash()
    assert re.fullmatch(r"[0-9a-f]{16}", compiler.template_hash())
