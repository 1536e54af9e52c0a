"""GPU backends: one module per vendor (cuda.py, hip.py) with the same small interface, stated
below as Protocols: `BackendModule` (no GPU needed: targets, compiling) and `Device` (one GPU:
loading, launching, memory, streams, graphs, timing). A conformance test holds both to it."""
from __future__ import annotations

import functools
import importlib
import logging
import operator
import threading
from typing import Callable, ContextManager, Protocol, runtime_checkable

from ..env import env_choice
from ..errors import BackendUnavailable

log = logging.getLogger("int4jit")


@runtime_checkable
class Device(Protocol):
    """One GPU. Pointers and streams are ints; `fn` is what load() returned. Several devices
    live in one process: every method (the launchers included) runs with its own device current
    and leaves the calling thread's current device as it found it; only make_current() changes it."""
    arch: str                 # 'sm_90', 'gfx90a'
    name: str
    ordinal: int
    sm_count: int
    l2_bytes: int
    max_grid_x: int
    max_threads_per_sm: int
    regs_per_sm: int
    warp_size: int
    supports_overlap: bool    # programmatic dependent launch (CUDA sm_90+)

    def make_current(self) -> None: ...
    def active(self) -> ContextManager: ...
    def total_memory(self) -> int: ...
    def load(self, binary: bytes, kernel: str) -> tuple: ...
    def launcher(self, fn, grid: int, block: int, overlap: bool = False, smem: int = 0) -> Callable: ...
    def launch(self, fn, grid: int, block: int, args, stream: int = 0, overlap: bool = False, smem: int = 0) -> None: ...
    def alloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def copy_htod(self, dst: int, src, stream: int = 0) -> None: ...
    def copy_dtoh(self, dst, src: int, stream: int = 0) -> None: ...
    def copy_dtod(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None: ...
    def create_stream(self) -> int: ...
    def destroy_stream(self, stream: int) -> None: ...
    def synchronize(self, stream: int = 0) -> None: ...
    def is_capturing(self, stream: int) -> bool: ...
    def capture_graph(self, run, stream: int): ...
    def replay(self, graph, stream: int) -> None: ...
    def destroy_graph(self, graph) -> None: ...
    def time_ms(self, run, repeats: int, stream: int = 0) -> float: ...


class BackendModule(Protocol):
    """What backends/cuda.py and backends/hip.py provide at module level."""
    NAME: str                 # 'cuda' | 'hip'
    PRELUDE: str              # the template prelude for this vendor
    Device: type

    def parse_arch(self, arch: str) -> str: ...
    def kernel_traits(self, arch: str) -> dict: ...
    def compiler_version(self) -> str: ...
    def compile_source(self, source: str, name: str, arch: str, options=()) -> bytes: ...
    def available(self) -> tuple[bool, str]: ...
    def device_count(self) -> int: ...
    def current_ordinal(self) -> int: ...


NAMES = ("cuda", "hip")


def module_for(name: str):
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}: expected one of {NAMES}")
    return importlib.import_module(f"{__name__}.{name}")


def module_for_arch(arch: str):
    """The backend whose compiler targets `arch` (sm_* -> cuda, gfx* -> hip)."""
    if arch.startswith("sm_"):
        return module_for("cuda")
    if arch.startswith("gfx"):
        return module_for("hip")
    raise ValueError(f"unknown target {arch!r}: expected an NVIDIA 'sm_XY' or an AMD 'gfxNNN' name")


_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _open_device(name: str, ordinal: int):
    if isinstance(ordinal, bool) or not hasattr(ordinal, "__index__"):
        raise TypeError(f"device must be a GPU ordinal (an int); got {ordinal!r}")
    ordinal = operator.index(ordinal)
    mod = module_for(name)
    count = mod.device_count()
    if not 0 <= ordinal < count:
        visible = "CUDA_VISIBLE_DEVICES" if name == "cuda" else "HIP_VISIBLE_DEVICES"
        raise ValueError(f"device must be a GPU ordinal in 0..{count - 1} ({count} {name} GPU"
                         f"{'s' if count != 1 else ''} visible; {visible} selects which); got {ordinal}")
    return mod.Device(ordinal)


def _backend_name(backend: str | None) -> str:
    """INT4JIT_BACKEND (or `backend`), else the first backend with a GPU."""
    chosen = backend or env_choice("INT4JIT_BACKEND", NAMES)
    names = (chosen,) if chosen else NAMES
    reasons = []
    for name in names:
        ok, why = module_for(name).available()
        if ok:
            return name
        reasons.append(f"{name}: {why}")
    raise BackendUnavailable("no GPU backend can run kernels here (" + "; ".join(reasons) + ")")


def device(ordinal: int = 0, backend: str | None = None):
    """The device that runs kernels, one object per (backend, ordinal) for the process:
    INT4JIT_BACKEND, else the first backend with a GPU. An ordinal the backend does not see
    is a ValueError naming the visible range."""
    with _lock:
        return _open_device(_backend_name(backend), ordinal)


def current_ordinal(backend: str | None = None) -> int:
    """The calling thread's current GPU on the backend that runs kernels (what
    torch.cuda.set_device, cudaSetDevice or hipSetDevice chose); 0 where none is current, or
    where no backend can run (device() then says why)."""
    try:
        name = _backend_name(backend)
    except BackendUnavailable:
        return 0
    return module_for(name).current_ordinal()


def devices(backend: str | None = None) -> list:
    """Every GPU the backend sees, in ordinal order."""
    name = _backend_name(backend)
    return [device(i, name) for i in range(module_for(name).device_count())]


def gpu_available() -> bool:
    return any(module_for(n).available()[0] for n in NAMES)
