"""Array adapters: DLPack capsules parsed field by field, __cuda_array_interface__, torch on CPU."""
import numpy as np
import pytest

from int4jit.arrays import DL_CUDA, describe


class DLPackOnGPU:
    """A numpy array's real DLPack capsule, presented as if it lived on CUDA device 3:
    exercises the capsule parsing that device arrays go through (no memory is touched)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return (DL_CUDA, 3)


@pytest.mark.parametrize("dtype,name", [(np.float16, "float16"), (np.uint8, "uint8"), (np.float32, "float32")])
def test_dlpack_capsule_fields(dtype, name):
    a = np.arange(24, dtype=dtype).reshape(4, 6)
    info = describe("w", DLPackOnGPU(a))
    assert info.framework == "dlpack" and info.on_device and info.device == ("gpu", 3)
    assert info.dtype == name and info.shape == (4, 6) and info.contiguous
    assert info.ptr == a.ctypes.data


def test_dlpack_strided_view_is_not_contiguous():
    a = np.arange(48, dtype=np.float16).reshape(4, 12)[:, ::2]
    info = describe("x", DLPackOnGPU(a))
    assert info.shape == (4, 6) and not info.contiguous
    assert info.ptr == a.ctypes.data


def test_dlpack_offset_view_points_at_its_first_element():
    base = np.arange(64, dtype=np.float16)
    view = base[8:]
    assert describe("x", DLPackOnGPU(view)).ptr == base.ctypes.data + 16


def test_host_dlpack_becomes_numpy():
    class HostOnly:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)
    info = describe("x", HostOnly(np.ones(8, np.float16)))
    assert info.framework == "numpy" and not info.on_device


def test_unsupported_dlpack_device():
    class OnTPU(DLPackOnGPU):
        def __dlpack_device__(self):
            return (13, 0)
    with pytest.raises(TypeError, match="DLPack device type 13"):
        describe("x", OnTPU(np.ones(8, np.float16)))


def test_torch_cpu_tensor_is_treated_as_host():
    torch = pytest.importorskip("torch")
    info = describe("x", torch.ones(16, dtype=torch.float16))
    assert info.framework == "numpy" and info.dtype == "float16" and info.shape == (16,)


def test_cuda_array_interface_strides():
    class CAI:
        def __init__(self, shape, strides, typestr="<f2"):
            self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": typestr,
                                             "data": (0x20000, False), "version": 3}
    assert describe("x", CAI((4, 8), None)).contiguous
    assert describe("x", CAI((4, 8), (16, 2))).contiguous
    assert not describe("x", CAI((4, 8), (32, 2))).contiguous
    assert describe("x", CAI((1, 8), (999, 2))).contiguous  # a size-1 dimension's stride does not matter
    assert describe("w", CAI((4, 8), None, "|u1")).dtype == "uint8"
