"""Loaded kernels: a compiled KernelSpec bound to a device, ready to launch."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from . import compiler
from .backends._args import PackedArgs
from .errors import DriverError
from .spec import KernelSpec
from .trace import trace


@dataclass
class Kernel:
    """One spec's code object loaded on one device, with its per-call launcher prepared."""
    device: object
    spec: KernelSpec
    module: object
    function: object

    def __post_init__(self):
        # (args, stream) -> None, prepared by the device once: the per-call launch.
        self.launch_packed = self.device.launcher(self.function, self.spec.grid, self.spec.block, self.spec.pdl,
                                                  self.spec.smem)

    def __call__(self, x_ptr: int, w_ptr: int, s_ptr: int, z_ptr: int, y_ptr: int, stream: int = 0):
        self.launch_packed(PackedArgs((x_ptr, w_ptr, s_ptr, z_ptr, y_ptr)), stream)


_loaded: dict[tuple, Kernel] = {}
_lock = threading.Lock()


def load(device, spec: KernelSpec) -> Kernel:
    """Compile (or fetch from cache) and load `spec` on `device`; a cached code object that the
    driver rejects is deleted and rebuilt once."""
    key = (device, spec)
    k = _loaded.get(key)
    if k is not None:
        return k
    if spec.grid > device.max_grid_x:  # checked before compiling or loading anything
        raise ValueError(f"N={spec.shape.N} needs {spec.grid} blocks with config {spec.label()}, more than "
                         f"this device's grid limit {device.max_grid_x}; pick a larger TN or BS")
    compiled = compiler.build(spec)
    try:
        module, fn = device.load(compiled.binary, compiled.kernel)
    except DriverError as e:
        trace("cached code object %s failed to load (%s); rebuilding", compiled.key[:12], e.status)
        compiler.forget(compiled)
        compiled = compiler.build(spec)
        module, fn = device.load(compiled.binary, compiled.kernel)
    k = Kernel(device, spec, module, fn)
    with _lock:
        _loaded[key] = k
    return k
