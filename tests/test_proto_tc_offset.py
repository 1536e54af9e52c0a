"""gemv_tc.hip's OFFSET form (session 4; off: slower on the H200 while blocks are short-lived): the lane and
fragment mapping of the raw-nibble mma steps and of the block's offsets table, emulated with the
PTX ISA's m16n8k16 layouts, computes the GEMV; and the kernel with it compiles for sm_80/sm_90."""
import functools
import sys
from pathlib import Path

import numpy as np
import pytest

import int4jit
from int4jit import compiler, reference
from int4jit.shapes import GemvShape, LaunchConfig

from conftest import require_compiler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "proto"))
import emulate_tc_offset  # noqa: E402


@pytest.mark.parametrize("N,K,G,sym", [(17, 256, 128, False), (16, 256, 256, True), (16, 160, 32, False),
                                       (21, 96, 16, False), (16, 128, 64, True)])
def test_offset_form_computes_the_gemv(N, K, G, sym):
    x, w, s, z = reference.random_problem(GemvShape(N, K, G, sym))
    x = (x.astype(np.float32) + 0.5).astype(np.float16)  # a mean, as activations have: C is large
    y = emulate_tc_offset.emulate(x, w, s, z, N, K, G)
    assert np.linalg.norm(y - int4jit.reference_gemv(x, w, s, z)) / np.linalg.norm(y) < 1e-12


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("N,K,G,sym", [(28672, 4096, 128, False), (4097, 4160, 16, True), (4096, 14336, 32, False)])
def test_offset_form_compiles(arch, N, K, G, sym, monkeypatch):
    require_compiler("cuda")
    from int4jit.backends import cuda
    monkeypatch.setattr(compiler, "_tc_geometry", functools.partial(compiler._tc_geometry, offset=True))
    monkeypatch.setenv("INT4JIT_KERNEL", "tc")
    name, source = compiler.render_gemv_source(GemvShape(N, K, G, sym), LaunchConfig(256, 4), arch)
    assert "constexpr bool OFFSET = true;" in source
    assert cuda.compile_source(source, name, arch, compiler.COMPILE_OPTIONS["cuda"])[:4] == b"\x7fELF"
