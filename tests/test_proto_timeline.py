"""bench/proto/timeline.py patches the tuned gemv_tc.hip source with %globaltimer stamps: the
text each patch looks for must still be in the template, once, and the stamped source compile."""
import sys
from pathlib import Path

import pytest

from int4jit import compiler
from int4jit.shapes import GemvShape, LaunchConfig

from conftest import require_compiler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "proto"))
import timeline  # noqa: E402


@pytest.mark.parametrize("shape,cfg", [
    (GemvShape(28672, 4096, 128, False), LaunchConfig(128, 4)),   # streamed, RAW_A
    (GemvShape(5120, 17920, 128, False), LaunchConfig(256, 2)),   # streamed, XWARP
    (GemvShape(28672, 4096, 32, False), LaunchConfig(128, 8))])   # plain, on the diagonal
def test_stamps_apply_to_the_template_and_compile(shape, cfg):
    require_compiler("cuda")
    from int4jit.backends import cuda
    name, source = compiler.render_gemv_source(shape, cfg, "sm_90")
    for old, new in timeline.PATCHES:
        assert source.count(old) == 1, f"timeline.py looks for {old.strip()!r}"
        source = source.replace(old, new)
    source = timeline.STAMP_MACRO.replace("BUFADDR", "0x1000ULL") + source
    assert source.count("I4TL(") == 1 + 6 and "I4TL_SM();" in source  # the macro, six stamps, the SM id
    assert cuda.compile_source(source, name, "sm_90", compiler.COMPILE_OPTIONS["cuda"])[:4] == b"\x7fELF"
