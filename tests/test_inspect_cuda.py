"""`int4jit inspect` on NVIDIA targets with no GPU: NVRTC builds the cubin, codeobj reads it
(.nv.info registers and frame, .nv.shared size; nvdisasm counts where it is installed)."""
from __future__ import annotations

import pytest

from int4jit import codeobj, inspection


@pytest.fixture(scope="module")
def nvrtc():
    from int4jit.backends import cuda
    from int4jit.errors import BackendUnavailable
    try:
        cuda.compiler_version()
    except (BackendUnavailable, RuntimeError, OSError, ImportError) as e:
        pytest.skip(f"no NVRTC here ({str(e).splitlines()[0]}); pip install cuda-bindings nvidia-cuda-nvrtc")


def test_sm90_tensor_core_build(nvrtc):
    f = inspection.inspect_kernel(4096, 4096, 128, False, "sm_90", (128, 4))
    c = f.code
    assert f.plan.kernel == "tc" and c.vendor == "nvidia" and c.wave == 32
    assert 24 <= c.vgprs <= 255 and c.scratch_bytes == 0 and c.lds_bytes > 0
    assert c.occupancy.blocks_per_cu >= 1 and not inspection.efficiency_problems(f), inspection.format_facts(f)
    if c.counts is None:
        assert "nvdisasm" in c.counts_note
    else:
        assert c.spills == 0 and c.counts.mma > 0 and c.counts.stream_wide > 0 and c.counts.stream_narrow == 0, \
            c.counts.summary()


def test_sm90_simt_build_without_disassembler(nvrtc):
    f = inspection.inspect_kernel(896, 896, 128, True, "sm_90", (128, 2), disassemble=False)
    c = f.code
    assert f.plan.kernel == "simt" and c.counts is None and "disassemble=False" in c.counts_note
    assert c.vgprs > 0 and c.spills == 0 and c.scratch_bytes == 0   # frame 0: nothing can spill
    assert "skipped" in inspection.format_facts(f)


@pytest.mark.parametrize("block,regs,smem,blocks,limiter", [
    (128, 68, 1536, 7, "regs"),      # 68 x 32 -> 2304 a warp; 28 warps -> 7 blocks of 4
    (64, 32, 0, 32, "threads"),      # 2048 / 64 = 32, also the block cap
    (256, 40, 100 << 10, 2, "smem"),  # 228 KB / (100 KB + 1 KB)
])
def test_cuda_occupancy_rule(block, regs, smem, blocks, limiter):
    occ = codeobj.cuda_occupancy("sm_90", block, regs, smem)
    assert (occ.blocks_per_cu, occ.limiter) == (blocks, limiter), occ


def test_not_an_elf_is_refused():
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        codeobj.code_facts(b"PK\x03\x04 not a code object", "k", "gfx90a", 64)
