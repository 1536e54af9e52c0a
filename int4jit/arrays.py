"""What an argument is: a host numpy array, or a device array seen through torch's
tensor methods, __cuda_array_interface__ or DLPack, without importing any framework."""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import numpy as np

# DLPack device types (dlpack.h)
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM = 1, 2, 3, 10
_DL_DTYPES = {(0, 8): "int8", (1, 8): "uint8", (2, 16): "float16", (2, 32): "float32",
              (2, 64): "float64", (0, 32): "int32", (1, 16): "uint16", (4, 16): "bfloat16"}


@dataclass
class ArrayInfo:
    name: str
    obj: object            # the caller's object (kept alive for the launch)
    framework: str         # numpy | torch | cupy | cai | dlpack
    dtype: str
    shape: tuple
    contiguous: bool
    ptr: int = 0           # device address (0 for numpy)
    device: tuple | None = None  # ("gpu", ordinal) for device arrays

    @property
    def on_device(self) -> bool:
        return self.device is not None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * (2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize)

    def overlaps(self, other: "ArrayInfo") -> bool:
        """Whether two device arrays share memory (both contiguous: their byte ranges meet)."""
        return (self.on_device and other.on_device and self.device == other.device
                and ranges_overlap(self.ptr, self.nbytes, other.ptr, other.nbytes))


def ranges_overlap(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    """Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) meet (an empty one never does)."""
    return a_bytes > 0 and b_bytes > 0 and a < b + b_bytes and b < a + a_bytes


def _c_contiguous(shape, strides_elems) -> bool:
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides_elems)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(name: str, a, device_id: int) -> ArrayInfo:
    capsule = a.__dlpack__()
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] for i in range(t.ndim))
    dtype = _DL_DTYPES.get((t.dtype.code, t.dtype.bits), f"dlpack(code={t.dtype.code},bits={t.dtype.bits})")
    info = ArrayInfo(name, (a, capsule), "dlpack", dtype, shape,
                     strides is None or _c_contiguous(shape, strides),
                     (t.data or 0) + t.byte_offset, ("gpu", device_id))
    return info


def describe(name: str, a, written: bool = False) -> ArrayInfo:
    """Classify one argument. TypeError when it is no array int4jit can read. A host array in
    the other byte order (e.g. '>f2' from a file) is converted, since kernels read native
    bytes; one the call writes (`written`) cannot be and is refused."""
    if isinstance(a, np.ndarray):
        if not a.dtype.isnative:
            if written:
                raise TypeError(f"{name} must be in native byte order (it is written in place); got dtype {a.dtype.str!r}")
            a = a.astype(a.dtype.newbyteorder("="))
        return ArrayInfo(name, a, "numpy", a.dtype.name, a.shape, a.flags.c_contiguous)
    module = type(a).__module__.split(".", 1)[0]
    if module == "torch" and hasattr(a, "data_ptr"):
        if a.device.type == "cpu":  # a host array: numpy shares its memory (out= is written through)
            if str(a.dtype) == "torch.bfloat16":
                raise TypeError(f"{name} is a bfloat16 CPU tensor: host arrays are float16 (numpy or CPU "
                                f"tensors); bfloat16 runs on GPU tensors")
            return describe(name, a.detach().resolve_conj().resolve_neg().numpy(), written)
        return ArrayInfo(name, a, "torch", str(a.dtype).removeprefix("torch."), tuple(a.shape),
                         a.is_contiguous(), a.data_ptr(), ("gpu", a.device.index or 0))
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        dt = np.dtype(cai["typestr"])
        if not dt.isnative:
            raise TypeError(f"{name}: __cuda_array_interface__ typestr {cai['typestr']!r} is not in the "
                            f"GPU's (little-endian) byte order")
        strides = cai.get("strides")
        contiguous = strides is None or _c_contiguous(shape, [s // dt.itemsize for s in strides])
        dev = getattr(a, "device", None)
        ordinal = getattr(dev, "id", 0) if dev is not None else 0
        return ArrayInfo(name, a, "cupy" if module == "cupy" else "cai", dt.name, shape, contiguous,
                         int(cai["data"][0] or 0), ("gpu", int(ordinal)))
    if hasattr(a, "__dlpack__") and hasattr(a, "__dlpack_device__"):
        dev_type, dev_id = a.__dlpack_device__()
        if dev_type in (DL_CPU, DL_CUDA_HOST):
            return describe(name, np.from_dlpack(a))
        if dev_type in (DL_CUDA, DL_ROCM):
            return _from_dlpack(name, a, int(dev_id))
        raise TypeError(f"{name} lives on DLPack device type {dev_type}; expected host memory or a CUDA/ROCm GPU")
    raise TypeError(f"{name} must be a numpy array or a device array (torch/cupy, DLPack or "
                    f"__cuda_array_interface__); got {type(a).__module__}.{type(a).__qualname__}")
