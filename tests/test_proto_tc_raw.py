"""gemv_tc.hip's RAW_A arithmetic (raw 1024 + q / 64 + q pairs in A, the step's offsets from a
second mma with x as A, D - C - z S at the fold), emulated with the PTX ISA's m16n8k16 fragment
layouts, computes the GEMV: every group size, symmetric and not, partial tiles and steps."""
import sys
from pathlib import Path

import numpy as np
import pytest

import int4jit
from int4jit import reference
from int4jit.shapes import GemvShape

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "proto"))
import emulate_tc_raw  # noqa: E402


@pytest.mark.parametrize("N,K,G,sym", [(16, 256, 128, False), (21, 96, 16, False), (40, 256, 32, True),
                                       (16, 192, 64, False), (9, 512, 256, True), (17, 160, 32, False)])
def test_raw_a_fragment_mapping_computes_the_gemv(N, K, G, sym):
    x, w, s, z = reference.random_problem(GemvShape(N, K, G, sym), np.random.default_rng(N * K + G))
    ref = int4jit.reference_gemv(x, w, s, z)
    y = emulate_tc_raw.emulate(x, w, s, z, N, K, G)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-12


def test_raw_a_emulation_notices_a_wrong_magic(monkeypatch):
    """The check above can fail: odd-k pairs at 1024 + q (offsets still assume 64) are wrong."""
    shape = GemvShape(16, 256, 128, False)
    x, w, s, z = reference.random_problem(shape, np.random.default_rng(3))
    ref = int4jit.reference_gemv(x, w, s, z)
    real = emulate_tc_raw._word_pairs_raw
    monkeypatch.setattr(emulate_tc_raw, "_word_pairs_raw",
                        lambda b: tuple((p[0] + 960, p[1] + 960) if i % 2 else p for i, p in enumerate(real(b))))
    y = emulate_tc_raw.emulate(x, w, s, z, 16, 256, 128)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) > 1e-3
