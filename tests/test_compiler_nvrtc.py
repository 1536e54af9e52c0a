"""NVRTC compiles (no GPU needed), compile errors, and the content-addressed cache."""
import pytest

from int4jit import cache, compiler
from int4jit.backends import cuda
from int4jit.errors import CompileError
from int4jit.shapes import GemvShape, LaunchConfig
from int4jit.spec import Variant, make_spec

from conftest import require_compiler


@pytest.fixture(autouse=True)
def _nvrtc():
    require_compiler("cuda")
    compiler._memo.clear()


CUBIN_MAGIC = b"\x7fELF"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("shape,kernel,cfg", [
    (GemvShape(4096, 4096, 128, False), "tc", LaunchConfig(256, 4)),
    (GemvShape(7, 48, 16, True), "simt", LaunchConfig(32, 16)),
    (GemvShape(11008, 14336, 256, False), "tc", LaunchConfig(512, 2)),
    (GemvShape(896, 896, 32, True), "simt", LaunchConfig(64, 8)),
])
def test_compiles_to_cubin(arch, shape, kernel, cfg):
    spec = make_spec(shape, arch, kernel, cfg, pdl=arch == "sm_90")
    ck = compiler.build(spec)
    assert ck.binary[:4] == CUBIN_MAGIC and len(ck.binary) > 1000
    assert ck.kernel == spec.name and ck.kernel.encode() in ck.binary  # the entry point is in the symbol table
    assert ck.spec is spec and ck.backend == "cuda" and compiler.is_cached(spec)


def test_compile_error_carries_log_and_source_lines():
    src = "extern \"C\" __global__ void k(float* o) {\n  o[0] = 1.0f;\n  this_is_not_defined(o);\n}\n"
    with pytest.raises(CompileError) as info:
        cuda.compile_source(src, "broken_kernel.cu", "sm_90")
    e = info.value
    assert "this_is_not_defined" in e.log and e.arch == "sm_90" and e.backend == "cuda"
    msg = str(e)
    assert "broken_kernel.cu" in msg and "sm_90" in msg
    assert ">    3 |   this_is_not_defined(o);" in msg


def test_bad_arch_is_rejected_before_compiling():
    with pytest.raises(ValueError, match="sm_XY"):
        cuda.compile_source("", "x.cu", "sm90")


def test_second_compile_is_a_cache_hit(monkeypatch):
    calls = []
    real = cuda.compile_source
    monkeypatch.setattr(cuda, "compile_source", lambda *a, **k: calls.append(a) or real(*a, **k))
    spec = make_spec(GemvShape(2048, 2048, 64, False), "sm_90", "tc", LaunchConfig(128, 2))
    assert not compiler.is_cached(spec)
    first = compiler.build(spec)
    assert compiler.build(spec) is first  # the in-process memo
    compiler._memo.clear()  # a fresh process: only the disk cache remains
    assert compiler.is_cached(spec)
    second = compiler.build(spec)
    assert len(calls) == 1 and first.binary == second.binary and first.key == second.key
    assert compiler.code_object_path(first.key).is_file()
    # another variant of the same (shape, BS, TN) is another build, not a hit
    other = compiler.build(make_spec(spec.shape, "sm_90", "tc", spec.config, Variant(loads=8)))
    assert len(calls) == 2 and other.key != first.key and other.binary != first.binary


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_cached_file_is_rebuilt(monkeypatch, damage):
    spec = make_spec(GemvShape(512, 1024, 32, True), "sm_90", "simt", LaunchConfig(64, 4))
    good = compiler.build(spec)
    path = compiler.code_object_path(good.key)
    blob = path.read_bytes()
    path.write_bytes({"truncate": blob[: len(blob) // 2], "garbage": b"x" * len(blob), "empty": b""}[damage])
    compiler._memo.clear()
    calls = []
    real = cuda.compile_source
    monkeypatch.setattr(cuda, "compile_source", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = compiler.build(spec)
    assert len(calls) == 1 and again.binary == good.binary
    assert cache.read_code_object(path) == good.binary


def test_key_depends_on_everything_that_changes_the_binary():
    base = dict(source="s", arch="sm_90", backend="cuda", options=["-a"], compiler_version="nvrtc-13.0")
    keys = {compiler.cache_key(**base)}
    for field, value in [("source", "t"), ("arch", "sm_80"), ("options", ["-b"]), ("compiler_version", "nvrtc-13.1")]:
        keys.add(compiler.cache_key(**{**base, field: value}))
    assert len(keys) == 5
    assert compiler.cache_key(**{**base, "options": ["-b", "-a"]}) == compiler.cache_key(**{**base, "options": ["-a", "-b"]})


def test_forget_drops_the_file_and_the_memo():
    spec = make_spec(GemvShape(512, 1024, 32, True), "sm_90", "simt", LaunchConfig(64, 4))
    ck = compiler.build(spec)
    compiler.forget(ck)
    assert not compiler.code_object_path(ck.key).exists() and not compiler.is_cached(spec)
    assert compiler.build(spec).binary == ck.binary and compiler.is_cached(spec)


@pytest.mark.parametrize("dtype,symmetric", [("float16", False), ("bfloat16", True)])
def test_prefill_gemm_compiles_for_sm90a(dtype, symmetric):
    """The prefill GEMM (wgmma, bulk copies, mbarriers) in both tile heights and its x layout
    kernel build as sm_90a code."""
    from int4jit.spec import make_gemm_spec, make_xperm_spec
    shape = GemvShape(6144, 4096, 128, symmetric, dtype=dtype)
    for spec in (make_gemm_spec(shape, "sm_90", 132, 128), make_gemm_spec(shape, "sm_90", 132, 192),
                 make_xperm_spec(shape, "sm_90", 132)):
        ck = compiler.build(spec)
        assert ck.binary[:4] == CUBIN_MAGIC and ck.kernel.encode() in ck.binary and spec.arch == "sm_90a"
