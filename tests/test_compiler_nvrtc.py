"""NVRTC compiles (no GPU needed), compile errors, and the content-addressed cache."""
import pytest

from int4jit import cache, compiler
from int4jit.backends import cuda
from int4jit.errors import CompileError
from int4jit.shapes import GemvShape, LaunchConfig

from conftest import require_compiler


@pytest.fixture(autouse=True)
def _nvrtc():
    require_compiler("cuda")
    compiler._memo.clear()


CUBIN_MAGIC = b"\x7fELF"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("shape,cfg", [
    (GemvShape(4096, 4096, 128, False), LaunchConfig(256, 4)),
    (GemvShape(7, 48, 16, True), LaunchConfig(32, 16)),
    (GemvShape(11008, 14336, 256, False), LaunchConfig(512, 2)),
    (GemvShape(896, 896, 32, True), LaunchConfig(64, 8)),
])
def test_compiles_to_cubin(arch, shape, cfg):
    ck = compiler.compile_gemv(shape, cfg, arch)
    assert ck.binary[:4] == CUBIN_MAGIC and len(ck.binary) > 1000
    assert ck.kernel.encode() in ck.binary  # the entry point is in the symbol table
    assert ck.arch == arch and ck.backend == "cuda"


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
    shape, cfg = GemvShape(1024, 2048, 64, False), LaunchConfig(128, 2)
    first = compiler.compile_gemv(shape, cfg, "sm_90")
    compiler._memo.clear()  # a fresh process: only the disk cache remains
    second = compiler.compile_gemv(shape, cfg, "sm_90")
    assert len(calls) == 1 and first.binary == second.binary
    assert compiler.code_object_path(first.key).is_file()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_cached_file_is_rebuilt(monkeypatch, damage):
    shape, cfg = GemvShape(512, 1024, 32, True), LaunchConfig(64, 4)
    good = compiler.compile_gemv(shape, cfg, "sm_90")
    path = compiler.code_object_path(good.key)
    blob = path.read_bytes()
    path.write_bytes({"truncate": blob[: len(blob) // 2], "garbage": b"x" * len(blob), "empty": b""}[damage])
    compiler._memo.clear()
    calls = []
    real = cuda.compile_source
    monkeypatch.setattr(cuda, "compile_source", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = compiler.compile_gemv(shape, cfg, "sm_90")
    assert len(calls) == 1 and again.binary == good.binary
    assert cache.read_code_object(path) == good.binary


def test_key_depends_on_everything_that_changes_the_binary():
    base = dict(source="s", arch="sm_90", backend="cuda", options=["-a"], compiler_version="nvrtc-13.0")
    keys = {compiler.cache_key(**base)}
    for field, value in [("source", "t"), ("arch", "sm_80"), ("options", ["-b"]), ("compiler_version", "nvrtc-13.1")]:
        keys.add(compiler.cache_key(**{**base, field: value}))
    assert len(keys) == 5
    assert compiler.cache_key(**{**base, "options": ["-b", "-a"]}) == compiler.cache_key(**{**base, "options": ["-a", "-b"]})
