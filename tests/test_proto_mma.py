"""The tensor-core kernel (templates/gemv_mma.hip, issue 4): its lane/fragment mapping, emulated with the
PTX ISA's documented m16n8k16 layouts, computes the GEMV; and it compiles for sm_80/sm_90."""
import sys
from pathlib import Path

import numpy as np
import pytest

import int4jit
from int4jit import reference
from int4jit.shapes import GemvShape

from conftest import require_compiler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "proto"))
import emulate_mma  # noqa: E402
import run_mma_proto  # noqa: E402


@pytest.mark.parametrize("N,K,G,sym", [(16, 128, 32, False), (21, 96, 16, False), (40, 256, 128, True),
                                       (16, 160, 32, False), (3, 64, 64, False)])
def test_fragment_mapping_computes_the_gemv(N, K, G, sym):
    x, w, s, z = reference.random_problem(GemvShape(N, K, G, sym))
    ref = int4jit.reference_gemv(x, w, s, z)
    assert np.linalg.norm(emulate_mma.emulate(x, w, s, z, N, K, G) - ref) / np.linalg.norm(ref) < 1e-12


def test_prototype_compiles():
    require_compiler("cuda")
    from int4jit.backends import cuda
    from int4jit.shapes import GemvShape
    for arch in ("sm_80", "sm_90"):
        name, src = run_mma_proto.render(GemvShape(4097, 2080, 16, False), 8, 2, 1, 2)
        assert cuda.compile_source(src, name + ".cu", arch, ("-default-device",))[:4] == b"\x7fELF"
