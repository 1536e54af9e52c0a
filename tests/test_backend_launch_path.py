"""Both backends' Device classes driven through fake bindings: every call up to the driver is
exercised on a CPU machine, and the kernel arguments the driver would read are checked at the
moment of the launch. This is how the hip launch path is tested without an AMD GPU."""
import ctypes
import itertools
import struct

import numpy as np
import pytest

from int4jit.backends import _args, cuda, hip
from int4jit.backends._args import PackedArgs
from int4jit.errors import DriverError


class Status(int):
    @property
    def name(self):
        return "SUCCESS" if self == 0 else f"ERROR_{int(self)}"


class FakeBinding:
    """Any call returns (success, a fresh handle) and is recorded; overrides per name."""

    def __init__(self, **overrides):
        self.calls, self.overrides, self._ids = [], overrides, itertools.count(0x1000, 0x100)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            if name in self.overrides:
                return self.overrides[name](*args)
            return Status(0), next(self._ids)
        return call


class Props:
    gcnArchName = b"gfx90a:sramecc+:xnack-"
    multiProcessorCount, l2CacheSize, maxThreadsPerMultiProcessor = 110, 8 << 20, 2048
    regsPerMultiprocessor, maxGridSize, warpSize, name = 65536, (2**31 - 1, 65535, 65535), 64, b"AMD Instinct MI210"


def decode_hip_extra(address):
    extra = (ctypes.c_void_p * 5).from_address(address)
    assert (extra[0], extra[2], extra[4]) == (_args.HIP_LAUNCH_PARAM_BUFFER_POINTER,
                                             _args.HIP_LAUNCH_PARAM_BUFFER_SIZE, _args.HIP_LAUNCH_PARAM_END)
    size = ctypes.c_size_t.from_address(extra[3]).value
    return list(struct.unpack(f"<{size // 8}Q", ctypes.string_at(extra[1], size)))


def decode_cuda_params(address, n):
    params = (ctypes.c_void_p * n).from_address(address)
    return [ctypes.c_uint64.from_address(p).value for p in params]


@pytest.fixture
def fake_hip(monkeypatch):
    seen = {}

    def launch(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        seen["launch"] = (f, gx, gy, gz, bx, by, bz, shmem, stream, params, decode_hip_extra(extra))
        return (Status(0),)

    fake = FakeBinding(hipModuleLaunchKernel=launch, hipDeviceProp_t=lambda: Props(),
                       hipGetDeviceProperties=lambda props, i: (Status(0),),
                       hipEventElapsedTime=lambda a, b: (Status(0), 0.5),
                       hipStreamIsCapturing=lambda s: (Status(0), 0))
    fake.hipStreamCaptureMode = type("M", (), {"hipStreamCaptureModeRelaxed": 2})
    fake.hipError_t = Status
    monkeypatch.setattr(hip, "_hip", lambda: fake)
    return fake, seen


@pytest.fixture
def fake_cuda(monkeypatch):
    seen = {}

    def launch(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        seen["launch"] = (f, gx, gy, gz, bx, by, bz, shmem, stream, decode_cuda_params(params, 5), extra)
        return (Status(0),)

    attrs = type("A", (), {n: n for n in ("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
                                           "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE",
                                           "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR",
                                           "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR", "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X")})
    values = {"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 9, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0,
              "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 132, "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE": 60 << 20,
              "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR": 2048,
              "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR": 65536, "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X": 2**31 - 1}
    fake = FakeBinding(cuLaunchKernel=launch, cuDeviceGetAttribute=lambda a, d: (Status(0), values[a]),
                       cuDeviceGetName=lambda n, d: (Status(0), b"NVIDIA H200\0\0"),
                       cuEventElapsedTime=lambda a, b: (Status(0), 0.5), cuStreamIsCapturing=lambda s: (Status(0), 0),
                       cuInit=lambda f: (Status(0),), cuCtxSetCurrent=lambda c: (Status(0),))
    fake.CUdevice_attribute = attrs
    fake.CUstreamCaptureMode = type("M", (), {"CU_STREAM_CAPTURE_MODE_RELAXED": 2})
    fake.CUresult = Status
    fake.CUlaunchAttributeID = type("L", (), {"CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION": 6})
    monkeypatch.setattr(cuda, "_driver", lambda: fake)
    # Launches go through cuda-bindings here; the ctypes path has its own tests (fake libcuda).
    monkeypatch.setattr(cuda, "_libcuda", lambda: None)
    return fake, seen


def exercise(dev):
    module, fn = dev.load(b"\x7fELF code object", "int4jit_gemv_k")
    stream = dev.create_stream()
    ptrs = [dev.alloc(n) for n in (8192, 4096, 512, 256, 8192)]
    dev.copy_htod(ptrs[0], np.arange(16, dtype=np.float16), stream)
    out = np.empty(4, np.float16)
    dev.copy_dtoh(out, ptrs[4], stream)
    dev.launch(fn, 512, 256, PackedArgs(ptrs), stream)
    assert dev.time_ms(lambda: None, 3, stream) == 0.5
    graph = dev.capture_graph(lambda: dev.launch(fn, 512, 256, PackedArgs(ptrs), stream), stream)
    dev.replay(graph, stream)
    dev.destroy_graph(graph)
    assert dev.is_capturing(stream) is False
    dev.synchronize(stream)
    dev.destroy_stream(stream)
    for p in ptrs:
        dev.free(p)
    return fn, stream, ptrs


def test_hip_device_launch_path(fake_hip):
    fake, seen = fake_hip
    dev = hip.Device(0)
    assert (dev.arch, dev.full_arch, dev.warp_size, dev.has_dot2) == ("gfx90a", "gfx90a:sramecc+:xnack-", 64, True)
    assert dev.supports_overlap is False  # no programmatic dependent launch in HIP
    fn, stream, ptrs = exercise(dev)
    f, gx, gy, gz, bx, by, bz, shmem, s, params, packed = seen["launch"]
    assert (f, gx, gy, gz, bx, by, bz, shmem, s, params) == (fn, 512, 1, 1, 256, 1, 1, 0, stream, None)
    assert packed == ptrs  # what the kernel reads: the five pointers, in order, 8 bytes each
    names = [c[0] for c in fake.calls]
    assert names.count("hipModuleLaunchKernel") == 2 and "hipStreamBeginCapture" in names
    assert ("hipModuleLoadData", (b"\x7fELF code object",)) in fake.calls
    assert ("hipModuleGetFunction", (fake.calls[names.index("hipModuleGetFunction")][1][0], b"int4jit_gemv_k")) in fake.calls


def test_cuda_device_launch_path(fake_cuda):
    fake, seen = fake_cuda
    dev = cuda.Device(0)
    assert (dev.arch, dev.sm_count, dev.name) == ("sm_90", 132, "NVIDIA H200")
    assert dev.supports_overlap is True  # sm_90: programmatic dependent launch
    fn, stream, ptrs = exercise(dev)
    f, gx, gy, gz, bx, by, bz, shmem, s, params, extra = seen["launch"]
    assert (f, gx, gy, gz, bx, by, bz, shmem, s, extra) == (fn, 512, 1, 1, 256, 1, 1, 0, stream, 0)
    assert params == ptrs


@pytest.mark.parametrize("backend", ["hip", "cuda"])
def test_driver_errors_name_the_call_and_status(backend, fake_hip, fake_cuda):
    fake = (fake_hip if backend == "hip" else fake_cuda)[0]
    dev = (hip if backend == "hip" else cuda).Device(0)
    name = "hipModuleLoadData" if backend == "hip" else "cuModuleLoadData"
    fake.overrides[name] = lambda *a: (Status(200), None)
    with pytest.raises(DriverError, match=f"{name} failed with ERROR_200"):
        dev.load(b"garbage", "k")


def test_hip_default_stream_is_passed_as_null(fake_hip):
    _, seen = fake_hip
    dev = hip.Device(0)
    _, fn = dev.load(b"x", "k")
    dev.launch(fn, 1, 64, PackedArgs([1, 2, 3, 4, 5]), 0)
    assert seen["launch"][8] is None  # hip-python takes None for the null stream


class FakeLibcuda:
    """libcuda as ctypes would call it: each launch decodes its ctypes arguments the way the
    driver reads them (handles, dimensions, the void** kernel parameters, the launch config)."""

    def __init__(self, status=0):
        self.launches, self.status = [], status

    def cuLaunchKernelEx(self, config_ref, f, params, extra):
        c = config_ref._obj
        attrs = [(c.attrs[i].id, ctypes.c_int.from_buffer_copy(bytes(c.attrs[i].value[:4])).value)
                 for i in range(c.numAttrs)]
        self.launches.append(("cuLaunchKernelEx", f.value, tuple(c.gridDim), tuple(c.blockDim), c.sharedMemBytes,
                              c.hStream, decode_cuda_params(ctypes.addressof(params), 5), extra, attrs))
        return self.status


@pytest.mark.parametrize("overlap", [False, True])
def test_cuda_prepared_launch_through_ctypes(overlap, fake_cuda, monkeypatch):
    """The per-call launch (libcuda through ctypes, cuLaunchKernelEx either way): function, grid,
    block, stream and the five pointers reach the driver as given; with overlap the config
    carries exactly one attribute, programmatic stream serialization = 1, without it none. A
    second call with new pointers and another stream reuses the launcher and sends the new values."""
    lib = FakeLibcuda()
    monkeypatch.setattr(cuda, "_libcuda", lambda: lib)
    dev = cuda.Device(0)
    _, fn = dev.load(b"x", "k")
    run = dev.launcher(fn, 896, 128, overlap)
    assert dev.launcher(fn, 896, 128, overlap) is run
    args = PackedArgs([0x1000, 0x2000, 0x3000, 0, 0x5000])
    run(args, 0x77)
    args.values[0] = 0x1100
    run(args, 0x88)
    attr = [(6, 1)] if overlap else []
    assert lib.launches == [("cuLaunchKernelEx", fn, (896, 1, 1), (128, 1, 1), 0, 0x77, [0x1000, 0x2000, 0x3000, 0, 0x5000], None, attr),
                            ("cuLaunchKernelEx", fn, (896, 1, 1), (128, 1, 1), 0, 0x88, [0x1100, 0x2000, 0x3000, 0, 0x5000], None, attr)]


@pytest.mark.parametrize("smem", [0, 48 * 1024, 132160])
def test_cuda_launch_with_dynamic_shared_memory(smem, fake_cuda, monkeypatch):
    """A launch's dynamic shared memory reaches the config; past 48 KB the function opts in
    first (cuFuncSetAttribute, once per launcher), at or under it it does not."""
    fake, _ = fake_cuda
    opted = []
    fake.CUfunction_attribute = type("F", (), {"CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES": 8})
    fake.overrides["cuFuncSetAttribute"] = lambda f, attr, value: opted.append((f, attr, value)) or (Status(0),)
    lib = FakeLibcuda()
    monkeypatch.setattr(cuda, "_libcuda", lambda: lib)
    dev = cuda.Device(0)
    _, fn = dev.load(b"x", "k")
    run = dev.launcher(fn, 132, 256, False, smem)
    run(PackedArgs([1, 2, 3, 4, 5]), 0x77)
    run(PackedArgs([1, 2, 3, 4, 5]), 0x77)
    assert [launch[4] for launch in lib.launches] == [smem, smem]
    assert opted == ([(fn, 8, smem)] if smem > 48 * 1024 else [])


def test_hip_launch_with_dynamic_shared_memory(fake_hip):
    _, seen = fake_hip
    dev = hip.Device(0)
    _, fn = dev.load(b"x", "k")
    dev.launch(fn, 64, 256, PackedArgs([1, 2, 3, 4, 5]), 0, smem=32768)
    assert seen["launch"][7] == 32768


def test_cuda_ctypes_launch_error_names_the_call_and_status(fake_cuda, monkeypatch):
    monkeypatch.setattr(cuda, "_libcuda", lambda: FakeLibcuda(status=719))
    dev = cuda.Device(0)
    _, fn = dev.load(b"x", "k")
    for overlap in (True, False):
        with pytest.raises(DriverError, match="cuLaunchKernelEx failed with ERROR_719"):
            dev.launch(fn, 1, 32, PackedArgs([1, 2, 3, 4, 5]), 0, overlap=overlap)


def test_launch_config_struct_matches_cuda_h():
    """CUlaunchConfig / CUlaunchAttribute as cuda.h lays them out on 64-bit targets."""
    assert ctypes.sizeof(cuda._LaunchAttribute) == 72
    assert cuda._LaunchConfig.hStream.offset == 32 and cuda._LaunchConfig.attrs.offset == 40
    assert cuda._LaunchConfig.numAttrs.offset == 48 and ctypes.sizeof(cuda._LaunchConfig) == 56


def test_cuda_bindings_fallback_with_overlap(fake_cuda):
    """Without libcuda through ctypes, a PDL launch goes through cuda-bindings' cuLaunchKernelEx
    with one config per stream: grid, block, the stream and programmatic serialization set."""
    import types
    fake, _ = fake_cuda
    launched = []

    class Value:
        programmaticStreamSerializationAllowed = 0

    fake.CUlaunchAttribute = lambda: types.SimpleNamespace(id=None, value=Value())
    fake.CUlaunchConfig = types.SimpleNamespace
    fake.CUlaunchAttributeID = type("L", (), {"CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION": 6})
    fake.overrides["cuLaunchKernelEx"] = lambda cfg, f, params, extra: (
        launched.append((cfg, f, decode_cuda_params(params, 5), extra)) or (Status(0),))
    dev = cuda.Device(0)
    _, fn = dev.load(b"x", "k")
    run = dev.launcher(fn, 896, 128, True)
    for stream in (0x77, 0x88, 0x77):
        run(PackedArgs([1, 2, 3, 4, 5]), stream)
    assert [(c.gridDimX, c.blockDimX, c.hStream, c.numAttrs) for c, *_ in launched] == [(896, 128, 0x77, 1), (896, 128, 0x88, 1),
                                                                                          (896, 128, 0x77, 1)]
    assert launched[0][0] is launched[2][0] and launched[0][0] is not launched[1][0]  # one config per stream
    attr = launched[0][0].attrs[0]
    assert attr.id == 6 and attr.value.programmaticStreamSerializationAllowed == 1
    assert all(f == fn and params == [1, 2, 3, 4, 5] and extra == 0 for _, f, params, extra in launched)
