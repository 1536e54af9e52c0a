"""hiprtc compiles for real gfx targets (Debian's ROCm 5.2 on CPU machines), arch parsing."""
import pytest

from int4jit import compiler
from int4jit.backends import hip
from int4jit.errors import CompileError
from int4jit.shapes import GemvShape, LaunchConfig
from int4jit.spec import make_spec

from conftest import require_compiler

ELF = b"\x7fELF"


@pytest.fixture
def hiprtc():
    require_compiler("hip")
    compiler._memo.clear()


@pytest.mark.parametrize("arch,dot2,shape,cfg", [
    ("gfx90a", True, GemvShape(4096, 4096, 128, False), LaunchConfig(256, 4)),
    ("gfx90a", True, GemvShape(7, 48, 16, True), LaunchConfig(32, 16)),      # 8-byte loads, a tail
    ("gfx90a", True, GemvShape(896, 896, 64, False), LaunchConfig(512, 2)),
    ("gfx1030", True, GemvShape(4097, 4160, 32, True), LaunchConfig(128, 8)),  # wave32
    ("gfx900", False, GemvShape(896, 1792, 256, False), LaunchConfig(64, 4)),   # no fdot2
    ("gfx1010", False, GemvShape(7, 48, 16, False), LaunchConfig(64, 2)),      # wave32, no fdot2
    ("gfx908", True, GemvShape(4096, 4096, 128, True), LaunchConfig(256, 4)),
    ("gfx90a", True, GemvShape(4096, 4096, 128, False, 1, "bfloat16"), LaunchConfig(256, 4)),   # bf16 x and y
    ("gfx1030", True, GemvShape(7, 48, 16, True, 1, "bfloat16", "bfloat16"), LaunchConfig(64, 2)),  # bf16 scales
    ("gfx900", False, GemvShape(896, 1792, 32, False, 1, "float16", "bfloat16"), LaunchConfig(64, 4)),
], ids=lambda v: v.key() if isinstance(v, GemvShape) else str(v))
def test_compiles_code_object(hiprtc, arch, dot2, shape, cfg):
    assert hip.kernel_traits(arch)["HAS_DOT2"] == int(dot2)
    spec = make_spec(shape, arch, "simt", cfg)
    _, src = compiler.render(spec)
    assert f"#define I4_HAS_DOT2 {int(dot2)}" in src
    ck = compiler.build(spec)
    assert ck.binary[:4] == ELF and ck.kernel.encode() in ck.binary
    assert f"amdgcn-amd-amdhsa--{arch}".encode() in ck.binary or arch.encode() in ck.binary


def test_dot2_path_does_not_compile_where_the_target_lacks_it(hiprtc):
    """The table must be right: forcing fdot2 onto gfx900 is a compile error."""
    src = ('extern "C" __global__ void k(float* o, const _Float16* a) {\n'
           '  typedef _Float16 h2 __attribute__((ext_vector_type(2)));\n'
           '  h2 v = {a[0], a[1]};\n  o[0] = __builtin_amdgcn_fdot2(v, v, 0.f, false);\n}\n')
    assert hip.compile_source(src, "dot2.hip", "gfx90a")[:4] == ELF
    with pytest.raises(CompileError) as info:
        hip.compile_source(src, "dot2.hip", "gfx900")
    assert "dot" in info.value.log and info.value.arch == "gfx900"


def test_compile_error_carries_log(hiprtc):
    with pytest.raises(CompileError) as info:
        hip.compile_source('extern "C" __global__ void k() {\n  undefined_thing();\n}\n', "bad.hip", "gfx90a")
    assert "undefined_thing" in info.value.log and "gfx90a" in str(info.value)
    assert ">    2 |   undefined_thing();" in str(info.value)


def test_target_newer_than_the_compiler_is_refused_not_crashed(hiprtc, monkeypatch):
    monkeypatch.setattr(hip, "hip_version", lambda: (5, 2, 21153))
    with pytest.raises(CompileError, match="predates gfx1151"):
        hip.compile_source("", "x.hip", "gfx1151")


@pytest.mark.parametrize("raw,arch", [("gfx90a:sramecc+:xnack-", "gfx90a"), ("gfx1151", "gfx1151"),
                                      ("gfx942:sramecc+:xnack-", "gfx942"), ("GFX1030", "gfx1030")])
def test_arch_parsing(raw, arch):
    assert hip.parse_arch(raw) == arch


@pytest.mark.parametrize("bad", ["sm_90", "gfx", "gfx90az", "", "amdgcn", None])
def test_bad_arch(bad):
    with pytest.raises(ValueError, match="gcnArchName"):
        hip.parse_arch(bad)


@pytest.mark.parametrize("arch,wave", [("gfx900", 64), ("gfx90a", 64), ("gfx942", 64), ("gfx1030", 32),
                                       ("gfx1100", 32), ("gfx1201", 32)])
def test_wave_size(arch, wave):
    assert hip.wave_size(arch) == wave


ROCM52_TARGETS = ["gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a", "gfx90c", "gfx1010",
                  "gfx1011", "gfx1012", "gfx1013", "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034",
                  "gfx1035", "gfx1036"]


@pytest.mark.parametrize("arch", ROCM52_TARGETS)
def test_dot2_table_agrees_with_the_compiler(hiprtc, arch):
    """For every target this hiprtc knows, DOT2_TARGETS says fdot2 exactly where it compiles."""
    src = ('extern "C" __global__ void k(float* o, const _Float16* a) {\n'
           '  typedef _Float16 h2 __attribute__((ext_vector_type(2)));\n'
           '  h2 v = {a[0], a[1]};\n  o[0] = __builtin_amdgcn_fdot2(v, v, 0.f, false);\n}\n')
    try:
        hip.compile_source(src, "dot2.hip", arch)
        compiles = True
    except CompileError:
        compiles = False
    assert compiles == (arch in hip.DOT2_TARGETS)
