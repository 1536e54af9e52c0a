"""The tensor-core kernel (templates/gemv_mma.hip, issue 4): its lane/fragment mapping, emulated with the
PTX ISA's documented m16n8k16 layouts, computes the GEMV; and it compiles for sm_80/sm_90."""
import sys
from pathlib import Path

import numpy as np
import pytest

import int4jit

from conftest import require_compiler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "proto"))
import emulate_mma  # noqa: E402
import run_mma_proto  # noqa: E402


@pytest.mark.parametrize("N,K,G,sym", [(16, 128, 32, False), (21, 96, 16, False), (40, 256, 128, True),
                                       (16, 160, 32, False), (3, 64, 64, False)])
def test_fragment_mapping_computes_the_gemv(N, K, G, sym):
    rng = np.random.default_rng()
    w = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
    s = (rng.random((N, K // G)) * 0.02 + 1e-3).astype(np.float16)
    z = None if sym else rng.integers(0, 16, (N, K // G), dtype=np.uint8)
    x = rng.standard_normal(K).astype(np.float16)
    ref = int4jit.reference_gemv(x, w, s, z)
    y = emulate_mma.emulate(x, w, s, z, N, K, G)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-12


def test_prototype_compiles():
    require_compiler("cuda")
    from int4jit.backends import cuda
    from int4jit.shapes import GemvShape
    for arch in ("sm_80", "sm_90"):
        name, src = run_mma_proto.render(GemvShape(4097, 2080, 16, False), 8, 2, 1, 2)
        assert cuda.compile_source(src, name + ".cu", arch, ("-default-device",))[:4] == b"\x7fELF"


@pytest.mark.parametrize("kernel", ["simt", "mma"])
def test_next_ab_patch_still_applies_and_compiles(kernel, monkeypatch):
    """bench/proto/ab_next.py patches the templates for the issue-barrier experiment: its
    anchors must still be in the templates, and the patched kernels must compile."""
    require_compiler("cuda")
    import ab_next
    from int4jit import compiler
    from int4jit.shapes import GemvShape, LaunchConfig
    real = compiler._read_template
    monkeypatch.setenv("INT4JIT_KERNEL", kernel)  # restored (unset) after the test
    try:
        ab_next.use_variant(True, kernel)
        c = compiler.compile_gemv(GemvShape(4097, 4096, 128, False), LaunchConfig(128, 4), "sm_90")
        assert c.binary[:4] == b"\x7fELF"
        assert "issue_barrier(all)" in compiler.render_gemv_source(GemvShape(64, 256, 32, False), LaunchConfig(64, 2), "sm_90")[1]
    finally:
        compiler._read_template = real
        compiler._classic_geometry = ab_next._REAL_CLASSIC
        compiler._memo.clear()


def test_next_ab_pdl_variant_compiles(monkeypatch):
    require_compiler("cuda")
    monkeypatch.setenv("INT4JIT_KERNEL", "simt")  # restored (unset) after the test
    import ab_next
    from int4jit import compiler
    from int4jit.shapes import GemvShape, LaunchConfig
    real = compiler._read_template
    try:
        ab_next.use_pdl_template()
        shape, cfg = GemvShape(2048, 2048, 128, False), LaunchConfig(64, 4)
        assert compiler.render_gemv_source(shape, cfg, "sm_90")[1].count("griddepcontrol.") == 2
        assert compiler.compile_gemv(shape, cfg, "sm_90").binary[:4] == b"\x7fELF"
    finally:
        compiler._read_template = real
        compiler._classic_geometry = ab_next._REAL_CLASSIC
        compiler._memo.clear()


@pytest.mark.parametrize("K", [4096, 2064])  # 16- and 8-byte weight loads
def test_next_ab_cpasync_variant_compiles(K, monkeypatch):
    require_compiler("cuda")
    import ab_next
    from int4jit import compiler
    from int4jit.shapes import GemvShape, LaunchConfig
    monkeypatch.setenv("INT4JIT_KERNEL", "simt")  # restored (unset) after the test
    real = compiler._read_template
    try:
        ab_next.use_cpasync_template()
        shape, cfg = GemvShape(1000, K, 16, False), LaunchConfig(64, 8)
        assert "cp.async.commit_group" in compiler.render_gemv_source(shape, cfg, "sm_90")[1]
        assert compiler.compile_gemv(shape, cfg, "sm_90").binary[:4] == b"\x7fELF"
    finally:
        compiler._read_template = real
        compiler._classic_geometry = ab_next._REAL_CLASSIC
        compiler._memo.clear()
