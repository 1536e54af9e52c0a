"""GPU backends: one module per vendor with the same small interface.

Module level (no GPU needed): `parse_arch(s)`, `compile_source(source, name, arch, options)`,
`compiler_version()`, `kernel_traits(arch)`, `available()`.
`Device(ordinal)`: `arch`, `name`, `sm_count`, `l2_bytes`, `load(binary, kernel)`,
`launch(fn, grid, block, args, stream)`, `alloc/free/copy_htod/copy_dtoh`,
`create_stream/destroy_stream/synchronize`, `time_ms(run, repeats, stream)`.
"""
from __future__ import annotations

import functools
import importlib
import logging
import threading

from ..env import env_choice
from ..errors import BackendUnavailable

log = logging.getLogger("int4jit")
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
    return module_for(name).Device(ordinal)


def device(ordinal: int = 0, backend: str | None = None):
    """The device that runs kernels: INT4JIT_BACKEND, else the first backend with a GPU."""
    chosen = backend or env_choice("INT4JIT_BACKEND", NAMES)
    names = (chosen,) if chosen else NAMES
    reasons = []
    with _lock:
        for name in names:
            mod = module_for(name)
            ok, why = mod.available()
            if ok:
                return _open_device(name, ordinal)
            reasons.append(f"{name}: {why}")
    raise BackendUnavailable("no GPU backend can run kernels here (" + "; ".join(reasons) + ")")


def gpu_available() -> bool:
    return any(module_for(n).available()[0] for n in NAMES)
