"""Rendering: every grid point, every group, both kernels and vendors; the variant fields reach the
source and each one compiles with NVRTC (partial row blocks and K % 128 != 0 included)."""
import re
from dataclasses import replace

import pytest

from int4jit import compiler, plan
from int4jit.shapes import SUPPORTED_GROUPS, GemvShape, LaunchConfig, candidate_grid
from int4jit.spec import TEMPLATE_OF, TEMPLATES, Variant, choose_kernel, make_spec

from conftest import require_compiler

SHAPE = GemvShape(4096, 4096, 128, False)
ELF = b"\x7fELF"


@pytest.mark.parametrize("arch,kernel", [("sm_80", "tc"), ("sm_90", "tc"), ("sm_80", "simt"), ("sm_90", "simt"),
                                         ("gfx90a", "simt"), ("gfx1030", "simt"), ("gfx900", "simt")])
def test_every_grid_point_renders_completely(arch, kernel):
    for cfg in candidate_grid(True):
        spec = make_spec(SHAPE, arch, kernel, cfg, pdl=arch == "sm_90")
        name, src = compiler.render(spec)
        assert "$" not in src, f"{cfg}: unsubstituted parameter"
        if kernel == "tc":  # 32 steps of 128 elements: every BS/32 fits
            assert f"constexpr int KSPLIT = {cfg.BS // 32};" in src and f"constexpr int TW = {cfg.TN // 2};" in src
        else:
            assert f"constexpr int BS = {cfg.BS};" in src and f"constexpr int TN = {cfg.TN};" in src
        assert f"{spec.name}(" in src and name == f"{spec.name}_{arch}.hip"


@pytest.mark.parametrize("arch,warp,dot2", [("sm_90", 32, None), ("gfx90a", 64, 1), ("gfx1030", 32, 1),
                                            ("gfx900", 64, 0), ("gfx1010", 32, 0), ("gfx942", 64, 1)])
def test_vendor_prelude(arch, warp, dot2):
    _, src = compiler.render(make_spec(GemvShape(64, 256, 32, True), arch, "simt", LaunchConfig(64, 2)))
    if arch.startswith("sm_"):
        assert "asm(" in src and "__builtin_amdgcn" not in src
    else:
        assert f"#define I4_WARP {warp}" in src and f"#define I4_HAS_DOT2 {dot2}" in src
        assert "griddepcontrol" not in src


@pytest.mark.parametrize("kernel", ["simt", "tc"])
def test_specialisation_changes_source(kernel):
    shapes = [SHAPE, GemvShape(4096, 4096, 64, False), GemvShape(4096, 4096, 128, True),
              GemvShape(4095, 4096, 128, False), GemvShape(4096, 4224, 128, False)]
    srcs = {compiler.render(make_spec(s, "sm_90", kernel, LaunchConfig(128, 4)))[1] for s in shapes}
    assert len(srcs) == len(shapes)


@pytest.mark.parametrize("kernel,arch", [("simt", "gfx90a"), ("tc", "sm_80")])
def test_every_group_renders(kernel, arch):
    for g in SUPPORTED_GROUPS:
        _, src = compiler.render(make_spec(GemvShape(32, 512, g, False), arch, kernel, LaunchConfig(64, 4)))
        assert re.search(rf"constexpr int GROUP = {g};", src)
        if kernel == "tc":  # groups under 128 walk K in contiguous ranges per warp
            assert f"constexpr bool CONTIG = {'true' if g < 128 else 'false'};" in src


@pytest.mark.parametrize("name", sorted(set(TEMPLATE_OF.values())) + ["prelude_cuda.hip", "prelude_hip.hip"])
def test_no_parameter_inside_a_preprocessor_conditional(name):
    """One way of switching: compile-time constants. `${X}` is substituted only outside #if blocks."""
    depth = 0
    for n, line in enumerate((TEMPLATES / name).read_text().splitlines(), 1):
        s = line.strip()
        if s.startswith("#if"):
            depth += 1
        elif s.startswith("#endif"):
            depth -= 1
        assert not (depth and "${" in line), f"{name}:{n}: parameter inside #if: {line.strip()}"
    assert depth == 0


# -- which kernel ---------------------------------------------------------------------------
@pytest.mark.parametrize("N,K,arch,kernel", [
    (4096, 4096, "sm_90", "tc"), (2048, 896, "sm_80", "tc"),
    (2047, 4096, "sm_90", "simt"),    # fewer rows than TC_MIN_ROWS: the simt kernel keeps the SMs busy
    (4096, 4112, "sm_90", "simt"),    # K % 32 != 0
    (4096, 4096, "sm_75", "simt"),    # no m16n8k16 f16 step
    (4096, 4096, "gfx90a", "simt")])
def test_default_kernel_choice(N, K, arch, kernel):
    assert plan.target(GemvShape(N, K, 16, False), arch)[1] == kernel


def test_kernel_choice_from_the_environment(monkeypatch):
    monkeypatch.setenv("INT4JIT_KERNEL", "simt")
    assert plan.target(SHAPE, "sm_90")[1] == "simt"
    monkeypatch.setenv("INT4JIT_KERNEL", "TC")
    assert plan.target(SHAPE, "sm_90")[1] == "tc"
    assert plan.target(GemvShape(64, 4096, 128, False), "sm_90")[1] == "tc"  # asked for: even below TC_MIN_ROWS
    for shape, arch in [(GemvShape(4096, 4112, 16, False), "sm_90"), (SHAPE, "gfx90a"), (SHAPE, "sm_75")]:
        with pytest.raises(ValueError, match="INT4JIT_KERNEL=tc"):  # no silent fallback
            plan.target(shape, arch)
    for bad in ("tensor", "mma"):  # mma was removed with gemv_mma.hip
        monkeypatch.setenv("INT4JIT_KERNEL", bad)
        with pytest.raises(ValueError, match=f"INT4JIT_KERNEL='{bad}': expected one of auto, simt, tc"):
            plan.target(SHAPE, "sm_90")
    assert choose_kernel(SHAPE, True, "auto") == "tc" and choose_kernel(SHAPE, False, "auto") == "simt"


# -- the variant fields in the source, compiled ----------------------------------------------
def _nvrtc(spec) -> bytes:
    require_compiler("cuda")
    from int4jit.backends import cuda
    name, source = compiler.render(spec)
    return cuda.compile_source(source, name, spec.arch, compiler.COMPILE_OPTIONS["cuda"])


def _b(v):
    return "true" if v else "false"


@pytest.mark.parametrize("N,K,group,streaming", [(8200, 4224, 128, True), (4100, 4160, 32, False)])
def test_tc_default_schedules_compile(N, K, group, streaming):
    """Both schedules of gemv_tc.hip render as the default rule says and compile, on a partial
    last row block (and K % 128 != 0 for the plain one)."""
    spec = make_spec(GemvShape(N, K, group, False), "sm_90", "tc", LaunchConfig(256, 4), pdl=True)
    assert spec.variant.streaming is streaming
    _, source = compiler.render(spec)
    assert f"constexpr bool STREAMING = {_b(streaming)};" in source and f"constexpr bool XSMEM = {_b(streaming)};" in source
    assert _nvrtc(spec)[:4] == ELF


@pytest.mark.parametrize("N,K,group,sym", [(8200, 4224, 128, False), (8200, 4096, 256, True), (1000, 2080, 16, False),
                                           (1001, 4160, 32, True), (333, 4864, 64, False),
                                           (4096, 28672, 128, False)])  # x does not fit shared memory
def test_tc_streaming_raw_a_compiles_for_every_group(N, K, group, sym):
    """streaming + raw_a asked for through the variant record compiles for every group class, tails
    and partial steps included: the switch is correct C++ wherever the tuner may turn it on."""
    spec = make_spec(GemvShape(N, K, group, sym), "sm_90", "tc", LaunchConfig(256, 4),
                     Variant(streaming=True, raw_a=True), pdl=True)
    _, source = compiler.render(spec)
    assert "constexpr bool RAW_A = true;" in source and "constexpr bool STREAMING = true;" in source
    assert f"constexpr bool XSMEM = {_b(2 * K + 4 * 8 * 32 <= 48 << 10)};" in source
    assert _nvrtc(spec)[:4] == ELF


def test_tc_kcluster_compiles_for_sm_90_and_the_template_refuses_sm_80():
    """The cluster build compiles for sm_90; a spec forced onto sm_80 (make_spec would normalise
    kcluster away) meets the template's static_assert, which says why."""
    from int4jit.errors import CompileError
    spec = make_spec(GemvShape(4097, 17920, 32, False), "sm_90", "tc", LaunchConfig(128, 4), Variant(kcluster=2))
    _, source = compiler.render(spec)
    assert "constexpr int KC = 2;" in source and "__cluster_dims__(2, 1, 1)" in source
    assert _nvrtc(spec)[:4] == ELF
    with pytest.raises(CompileError, match="cluster needs sm_90"):
        _nvrtc(replace(spec, arch="sm_80"))


@pytest.mark.parametrize("variant,text", [
    (Variant(one_wave=True), "__launch_bounds__(128, 7)"),   # 896 blocks on 132 SMs
    (Variant(loads=8), "constexpr int UNROLL = 2;"),         # 8 loads over 2 tiles a warp
    (Variant(prefetch=2), "constexpr int PREFETCH = 2;"),
    (Variant(prefetch=1), "constexpr int PREFETCH = 1;")])
def test_tc_variant_field_reaches_the_source_and_compiles(variant, text):
    spec = make_spec(GemvShape(28672, 4096, 32, False), "sm_90", "tc", LaunchConfig(128, 4), variant, pdl=True,
                     sm_count=132)
    default = make_spec(spec.shape, "sm_90", "tc", spec.config, Variant(), pdl=True, sm_count=132)
    src, base = compiler.render(spec)[1], compiler.render(default)[1]
    assert text in src and (text not in base or variant == Variant(prefetch=1))
    assert src != base or variant == Variant()
    assert _nvrtc(spec)[:4] == ELF


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("N,K,group,sym", [(7, 48, 16, True), (4097, 4160, 64, False)])
def test_simt_compiles(arch, N, K, group, sym):
    """The simt kernel on both NVIDIA generations: 8-byte loads (K % 32 == 16), odd row tails."""
    spec = make_spec(GemvShape(N, K, group, sym), arch, "simt", LaunchConfig(64, 8), pdl=arch == "sm_90")
    assert spec.param("VEC") == (8 if K % 32 else 16)
    assert _nvrtc(spec)[:4] == ELF
