"""Backend conformance (issue 17 item 5): both vendor modules provide what the
`backends.BackendModule` and `backends.Device` Protocols state, with the same parameter names,
and a Device built on fake bindings satisfies the Protocol and runs the launch path on the CPU."""
import inspect

import pytest

from int4jit import backends
from int4jit.backends import BackendModule, Device, cuda, hip
from int4jit.spec import TEMPLATES

from conftest import require_compiler
from test_backend_launch_path import exercise, fake_cuda, fake_hip  # noqa: F401 (fixtures)

MODULES = {"cuda": cuda, "hip": hip}
GOOD_ARCH = {"cuda": ("sm_90", "sm_90"), "hip": ("gfx90a:sramecc+:xnack-", "gfx90a")}
BAD_ARCH = {"cuda": "gfx90a", "hip": "sm_90"}


def protocol_methods(proto) -> dict:
    return {n: v for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")}


def parameters(fn, drop_self: bool) -> list[tuple]:
    params = list(inspect.signature(fn).parameters.values())[1 if drop_self else 0:]
    return [(p.name, p.kind, p.default) for p in params]


def test_the_protocols_are_not_empty():
    assert {"parse_arch", "kernel_traits", "compiler_version", "compile_source", "available"} <= set(protocol_methods(BackendModule))
    assert {"load", "launcher", "launch", "alloc", "time_ms"} <= set(protocol_methods(Device))
    assert {"arch", "name", "sm_count", "supports_overlap"} <= set(Device.__annotations__)


@pytest.mark.parametrize("name", backends.NAMES)
def test_module_level_interface(name):
    mod = backends.module_for(name)
    assert mod is MODULES[name] and mod.NAME == name
    assert (TEMPLATES / mod.PRELUDE).is_file()
    assert inspect.isclass(mod.Device)
    for fname, proto_fn in protocol_methods(BackendModule).items():
        fn = getattr(mod, fname, None)
        assert callable(fn), f"backends/{name}.py has no {fname}()"
        fn = inspect.unwrap(fn)  # lru_cache'd functions keep their signature underneath
        assert parameters(fn, False) == parameters(proto_fn, True), f"{name}.{fname} signature differs from the Protocol"
    raw, parsed = GOOD_ARCH[name]
    assert mod.parse_arch(raw) == parsed and backends.module_for_arch(parsed) is mod
    with pytest.raises(ValueError):
        mod.parse_arch(BAD_ARCH[name])
    assert set(mod.kernel_traits(parsed)) == set(cuda.kernel_traits("sm_90")) >= {"WARP", "HAS_DOT2", "TENSOR_CORES"}
    ok, why = mod.available()
    assert isinstance(ok, bool) and isinstance(why, str)


@pytest.mark.parametrize("name", backends.NAMES)
def test_compiler_version_and_compile(name):
    require_compiler(name)
    mod = MODULES[name]
    version = mod.compiler_version()
    assert isinstance(version, str) and version
    src = 'extern "C" __global__ void k(float* o) { o[0] = 1.0f; }\n'
    assert mod.compile_source(src, "k.cu", GOOD_ARCH[name][1])[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", backends.NAMES)
def test_device_class_has_every_protocol_method(name):
    cls = MODULES[name].Device
    for mname, proto_fn in protocol_methods(Device).items():
        fn = getattr(cls, mname, None)
        assert callable(fn), f"{name}.Device has no {mname}()"
        assert parameters(fn, True) == parameters(proto_fn, True), f"{name}.Device.{mname} signature differs"


@pytest.mark.parametrize("name", backends.NAMES)
def test_device_satisfies_the_protocol_and_launches(name, request):
    """A Device made on fake bindings: every Protocol attribute is there with its type, and the
    whole path from load to launch, graph capture and timing runs (hip included, on the CPU)."""
    request.getfixturevalue(f"fake_{name}")
    dev = MODULES[name].Device(0)
    assert isinstance(dev, Device)
    types = {"str": str, "int": int, "bool": bool}
    for attr, kind in Device.__annotations__.items():
        assert isinstance(getattr(dev, attr), types[kind]), f"{name}.Device.{attr} is not {kind}"
    assert dev.arch == GOOD_ARCH[name][1]
    assert dev.supports_overlap is (name == "cuda")  # PDL exists on CUDA sm_90 only
    fn, stream, ptrs = exercise(dev)
    assert fn is not None and len(ptrs) == 5
