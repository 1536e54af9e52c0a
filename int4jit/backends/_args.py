"""Kernel argument packing shared by both backends. Every int4jit kernel takes
device pointers only, so an argument list is a list of 64-bit addresses."""
from __future__ import annotations

import ctypes

# HIP's markers for hipModuleLaunchKernel's `extra` array (hip_runtime_api.h).
HIP_LAUNCH_PARAM_BUFFER_POINTER = 0x01
HIP_LAUNCH_PARAM_BUFFER_SIZE = 0x02
HIP_LAUNCH_PARAM_END = 0x03


class PackedArgs:
    """Kernel arguments laid out both ways a driver takes them:
    `params` (void*[]: one pointer to each value, CUDA's kernelParams) and
    `extra` (HIP's {BUFFER_POINTER, buf, BUFFER_SIZE, &size, END} over one packed buffer).
    The ctypes objects live as long as this object; drivers copy them at launch."""

    __slots__ = ("values", "params", "size", "extra")

    def __init__(self, pointers):
        n = len(pointers)
        self.values = (ctypes.c_uint64 * n)(*pointers)
        base = ctypes.addressof(self.values)
        self.params = (ctypes.c_void_p * n)(*(base + 8 * i for i in range(n)))
        self.size = ctypes.c_size_t(8 * n)
        self.extra = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER, base,
                                           HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self.size),
                                           HIP_LAUNCH_PARAM_END)

    @property
    def params_address(self) -> int:
        return ctypes.addressof(self.params)

    @property
    def extra_address(self) -> int:
        return ctypes.addressof(self.extra)

    def buffer_bytes(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self.values), self.size.value)
