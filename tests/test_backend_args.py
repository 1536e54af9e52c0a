"""Kernel argument packing, the part of the launch path testable without a GPU."""
import ctypes
import struct

from int4jit.backends import _args
from int4jit.backends import cuda, hip


def test_packed_buffer_is_naturally_aligned_pointers():
    ptrs = [0x7F0000001000, 0x7F0000002010, 0, 0xDEADBEEF00, 1 << 40]
    a = _args.PackedArgs(ptrs)
    assert a.buffer_bytes() == struct.pack("<5Q", *ptrs)
    assert a.size.value == 40


def test_cuda_kernel_params_point_at_each_value():
    ptrs = [11, 22, 33, 44, 55]
    a = _args.PackedArgs(ptrs)
    params = (ctypes.c_void_p * 5).from_address(a.params_address)
    assert [ctypes.c_uint64.from_address(p).value for p in params] == ptrs


def test_hip_extra_array_layout():
    ptrs = [1, 2, 3, 4, 5]
    a = _args.PackedArgs(ptrs)
    extra = (ctypes.c_void_p * 5).from_address(a.extra_address)
    assert extra[0] == _args.HIP_LAUNCH_PARAM_BUFFER_POINTER
    assert ctypes.string_at(extra[1], 40) == struct.pack("<5Q", *ptrs)
    assert extra[2] == _args.HIP_LAUNCH_PARAM_BUFFER_SIZE
    assert ctypes.c_size_t.from_address(extra[3]).value == 40
    assert extra[4] == _args.HIP_LAUNCH_PARAM_END


def test_hip_markers_match_hip_python():
    from conftest import require_compiler
    require_compiler("hip")
    from hip import hip as hipmod
    assert int(hipmod.HIP_LAUNCH_PARAM_BUFFER_POINTER) == _args.HIP_LAUNCH_PARAM_BUFFER_POINTER
    assert int(hipmod.HIP_LAUNCH_PARAM_BUFFER_SIZE) == _args.HIP_LAUNCH_PARAM_BUFFER_SIZE
    assert int(hipmod.HIP_LAUNCH_PARAM_END) == _args.HIP_LAUNCH_PARAM_END


def test_backends_have_the_same_interface():
    names = lambda m: {n for n in dir(m) if not n.startswith("_") and callable(getattr(m, n))}
    common = {"parse_arch", "kernel_traits", "compile_source", "compiler_version", "available", "check"}
    assert common <= names(cuda) and common <= names(hip)
    methods = lambda c: {n for n in dir(c) if not n.startswith("_")}
    assert methods(cuda.Device) == methods(hip.Device)
    assert cuda.Device.launch.__code__.co_varnames[:6] == hip.Device.launch.__code__.co_varnames[:6]
