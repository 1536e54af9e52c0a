"""Loaded kernels: a compiled code object bound to a device, ready to launch."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from . import compiler
from .backends._args import PackedArgs
from .env import env_flag
from .errors import DriverError
from .shapes import GemvShape, LaunchConfig
from .trace import trace


@dataclass
class Kernel:
    """One specialised GEMV kernel loaded on one device."""
    device: object
    shape: GemvShape
    config: LaunchConfig
    module: object
    function: object
    grid: int
    block: int
    overlap: bool = False   # programmatic dependent launch (INT4JIT_PDL, sm_90+)

    def __post_init__(self):
        # (args, stream) -> None, prepared by the device once: the per-call launch.
        self.launch_packed = self.device.launcher(self.function, self.grid, self.block, self.overlap)

    def __call__(self, x_ptr: int, w_ptr: int, s_ptr: int, z_ptr: int, y_ptr: int, stream: int = 0):
        self.launch_packed(PackedArgs((x_ptr, w_ptr, s_ptr, z_ptr, y_ptr)), stream)


_loaded: dict[tuple, Kernel] = {}
_lock = threading.Lock()


def load_kernel(device, shape: GemvShape, cfg: LaunchConfig) -> Kernel:
    """Compile (or fetch from cache) and load the kernel; a cached code object that the
    driver rejects is deleted and rebuilt once."""
    overlap = env_flag("INT4JIT_PDL", True) and device.supports_overlap
    key = (id(device), shape, cfg, compiler.template_for(shape, device.arch), overlap)
    k = _loaded.get(key)
    if k is not None:
        return k
    geo = compiler.kernel_geometry(shape, cfg, device.arch)
    if not geo.persistent and geo.grid > device.max_grid_x:  # checked before compiling or loading anything
        raise ValueError(f"N={shape.N} needs {geo.grid} blocks with config {cfg}, more than this "
                         f"device's grid limit {device.max_grid_x}; pick a larger TN or BS")
    compiled = compiler.compile_gemv(shape, cfg, device.arch)
    try:
        module, fn = device.load(compiled.binary, compiled.kernel)
    except DriverError as e:
        trace("cached code object %s failed to load (%s); rebuilding", compiled.key[:12], e.status)
        compiler.forget(compiled)
        compiled = compiler.compile_gemv(shape, cfg, device.arch)
        module, fn = device.load(compiled.binary, compiled.kernel)
    grid = geo.grid
    if geo.persistent:
        # A grid-stride kernel: as many blocks as the device holds at once, no more.
        grid = min(grid, max(1, device.blocks_per_sm(fn, geo.block)) * device.sm_count)
    k = Kernel(device, shape, cfg, module, fn, grid, geo.block, overlap)
    with _lock:
        _loaded[key] = k
    return k
