"""Several GPUs in one process, on the CPU: a fake driver with two devices models what the real
ones enforce -- one primary context (CUDA) or current device (HIP) per thread, and handles
(modules, functions, streams, memory, events, graphs) that belong to the device current when
they were made; using one while another device is current fails as the driver would. Both
backends, the ctypes and the cuda-bindings launch paths, one thread and several."""
import ctypes
import itertools
import threading

import numpy as np
import pytest

import int4jit
from int4jit import api, backends, benchmark, cli, compiler, launch, tuner
from int4jit.backends import cuda, hip
from int4jit.backends._args import PackedArgs
from int4jit.compiler import CompiledKernel
from int4jit.errors import DriverError
from int4jit.plan import plan
from int4jit.shapes import GemvShape
from int4jit.spec import make_spec

from test_backend_launch_path import Props, Status, exercise

INVALID_CONTEXT, INVALID_HANDLE = 201, 400


class FakeDevices:
    """The driver's view: `names[i]` is device i; `local.current` the calling thread's current
    device (None: none); `owner[handle]` the device a handle was made on."""

    def __init__(self, names):
        self.names = list(names)
        self.local = threading.local()
        self.owner = {}
        self.launches = []  # (thread, function, device current at the launch)
        self._ids = itertools.count(0x10_0000, 0x100)
        self._lock = threading.Lock()

    @property
    def current(self):
        return getattr(self.local, "current", None)

    @current.setter
    def current(self, ordinal):
        self.local.current = ordinal

    def make(self):
        """A new handle owned by the current device."""
        if self.current is None:
            return Status(INVALID_CONTEXT), None
        with self._lock:
            h = next(self._ids)
            self.owner[h] = self.current
        return Status(0), h

    def status(self, *handles) -> Status:
        """INVALID_HANDLE if a handle belongs to another device than the current one; the null
        stream (0/None) is the current device's."""
        if self.current is None:
            return Status(INVALID_CONTEXT)
        for h in handles:
            if h and self.owner.get(int(h)) != self.current:
                return Status(INVALID_HANDLE)
        return Status(0)

    def launched(self, fn, stream):
        err = self.status(fn, stream)
        if err == 0:
            with self._lock:
                self.launches.append((threading.current_thread().name, int(fn), self.current))
        return err


CTX_BASE = 0x7000_0000  # device i's primary context handle: CTX_BASE + 0x1000 * i


class FakeCudaBindings(FakeDevices):
    """cuda-bindings' driver module over FakeDevices; contexts are CTX_BASE + 0x1000 * ordinal."""

    def __init__(self, names):
        super().__init__(names)
        self.CUresult = Status
        self.CUstreamCaptureMode = type("M", (), {"CU_STREAM_CAPTURE_MODE_RELAXED": 2})
        self.CUlaunchAttributeID = type("L", (), {"CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION": 6})
        names_ = ("COMPUTE_CAPABILITY_MAJOR", "COMPUTE_CAPABILITY_MINOR", "MULTIPROCESSOR_COUNT", "L2_CACHE_SIZE",
                  "MAX_THREADS_PER_MULTIPROCESSOR", "MAX_REGISTERS_PER_MULTIPROCESSOR", "MAX_GRID_DIM_X")
        self.CUdevice_attribute = type("A", (), {f"CU_DEVICE_ATTRIBUTE_{n}": n for n in names_})
        self.attributes = dict(zip(names_, (9, 0, 132, 60 << 20, 2048, 65536, 2**31 - 1)))

    @staticmethod
    def ctx_of(ordinal):
        return None if ordinal is None else CTX_BASE + 0x1000 * ordinal

    @staticmethod
    def ordinal_of(ctx):
        return None if not ctx else (int(ctx) - CTX_BASE) // 0x1000

    @staticmethod
    def CUlaunchAttribute():
        return type("Attr", (), {"id": None, "value": type("V", (), {"programmaticStreamSerializationAllowed": 0})()})()

    @staticmethod
    def CUlaunchConfig():
        return type("Config", (), {})()

    # device queries (no context needed)
    def cuInit(self, flags): return (Status(0),)
    def cuDeviceGetCount(self): return Status(0), len(self.names)
    def cuDeviceGet(self, i): return (Status(0), i) if 0 <= i < len(self.names) else (Status(101), None)
    def cuDevicePrimaryCtxRetain(self, dev): return Status(0), self.ctx_of(dev)
    def cuDeviceGetAttribute(self, a, dev): return Status(0), self.attributes[a]
    def cuDeviceGetName(self, n, dev): return Status(0), self.names[dev].encode() + b"\0\0"
    def cuDeviceTotalMem(self, dev): return Status(0), 141 << 30

    # the calling thread's context
    def cuCtxGetCurrent(self): return Status(0), self.ctx_of(self.current) or 0
    def cuCtxGetDevice(self): return (Status(0), self.current) if self.current is not None else (Status(INVALID_CONTEXT), None)

    def cuCtxSetCurrent(self, ctx):
        self.current = self.ordinal_of(ctx)
        return (Status(0),)

    # handles
    def cuModuleLoadData(self, binary): return self.make()

    def cuModuleGetFunction(self, module, name):
        return self.make() if self.status(module) == 0 else (self.status(module), None)

    def cuMemAlloc(self, n): return self.make()
    def cuMemFree(self, p): return (self.status(p),)
    def cuMemcpyHtoDAsync(self, dst, src, n, s): return (self.status(dst, s),)
    def cuMemcpyDtoHAsync(self, dst, src, n, s): return (self.status(src, s),)
    def cuMemcpyDtoDAsync(self, dst, src, n, s): return (self.status(dst, src, s),)
    def cuStreamCreate(self, flags): return self.make()
    def cuStreamDestroy(self, s): return (self.status(s),)
    def cuStreamSynchronize(self, s): return (self.status(s),)
    def cuStreamIsCapturing(self, s): return self.status(s), 0
    def cuStreamBeginCapture(self, s, mode): return (self.status(s),)
    def cuStreamEndCapture(self, s): return self.make() if self.status(s) == 0 else (self.status(s), None)
    def cuGraphInstantiate(self, g, flags): return self.make() if self.status(g) == 0 else (self.status(g), None)
    def cuGraphLaunch(self, e, s): return (self.status(e, s),)
    def cuGraphExecDestroy(self, e): return (self.status(e),)
    def cuGraphDestroy(self, g): return (self.status(g),)
    def cuEventCreate(self, flags): return self.make()
    def cuEventRecord(self, e, s): return (self.status(e, s),)
    def cuEventSynchronize(self, e): return (Status(0),)
    def cuEventElapsedTime(self, a, b): return Status(0), 0.5
    def cuEventDestroy(self, e): return (Status(0),)
    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra): return (self.launched(f, s),)
    def cuLaunchKernelEx(self, config, f, params, extra): return (self.launched(f, config.hStream),)


class FakeLibcuda:
    """libcuda as ctypes calls it, over the same FakeCudaBindings state."""

    def __init__(self, drv: FakeCudaBindings):
        self.drv = drv

    def cuCtxGetCurrent(self, out):
        out[0] = self.drv.ctx_of(self.drv.current)
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.drv.current = self.drv.ordinal_of(ctx.value)
        return 0

    def cuLaunchKernelEx(self, config_ref, f, params, extra):
        return int(self.drv.launched(f.value, config_ref._obj.hStream))


class FakeHip(FakeDevices):
    """hip-python's hip module over FakeDevices (the current device defaults to 0, as in HIP)."""

    def __init__(self, names):
        super().__init__(names)
        self.hipError_t = Status
        self.hipStreamCaptureMode = type("M", (), {"hipStreamCaptureModeRelaxed": 2})

    @property
    def current(self):
        return getattr(self.local, "current", 0)

    @current.setter
    def current(self, ordinal):
        self.local.current = ordinal

    def hipGetDeviceCount(self): return Status(0), len(self.names)
    def hipDeviceProp_t(self): return Props()

    def hipGetDeviceProperties(self, props, i):
        props.name = self.names[i].encode()
        return (Status(0),)

    def hipDeviceTotalMem(self, i): return Status(0), 64 << 30
    def hipGetDevice(self): return Status(0), self.current

    def hipSetDevice(self, i):
        self.current = i
        return (Status(0),)

    def hipModuleLoadData(self, binary): return self.make()

    def hipModuleGetFunction(self, module, name):
        return self.make() if self.status(module) == 0 else (self.status(module), None)

    def hipMalloc(self, n): return self.make()
    def hipFree(self, p): return (self.status(p),)
    def hipMemcpyHtoDAsync(self, dst, src, n, s): return (self.status(dst, s),)
    def hipMemcpyDtoHAsync(self, dst, src, n, s): return (self.status(src, s),)
    def hipMemcpyDtoDAsync(self, dst, src, n, s): return (self.status(dst, src, s),)
    def hipStreamCreateWithFlags(self, flags): return self.make()
    def hipStreamDestroy(self, s): return (self.status(s),)
    def hipStreamSynchronize(self, s): return (self.status(s),)
    def hipStreamIsCapturing(self, s): return self.status(s), 0
    def hipStreamBeginCapture(self, s, mode): return (self.status(s),)
    def hipStreamEndCapture(self, s): return self.make() if self.status(s) == 0 else (self.status(s), None)
    def hipGraphInstantiate(self, g, a, b, flags): return self.make()
    def hipGraphLaunch(self, e, s): return (self.status(e, s),)
    def hipGraphExecDestroy(self, e): return (Status(0),)
    def hipGraphDestroy(self, g): return (Status(0),)
    def hipEventCreate(self): return self.make()
    def hipEventRecord(self, e, s): return (self.status(e, s),)
    def hipEventSynchronize(self, e): return (Status(0),)
    def hipEventElapsedTime(self, a, b): return Status(0), 0.5
    def hipEventDestroy(self, e): return (Status(0),)
    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra): return (self.launched(f, s),)


NAMES = ("NVIDIA H200", "NVIDIA H200")


@pytest.fixture(params=["cuda-ctypes", "cuda-bindings", "hip"])
def fake(request, monkeypatch):
    """(backend module, fake driver) with two visible devices; `backends.device` opens them."""
    if request.param == "hip":
        drv = FakeHip(("AMD Instinct MI210", "AMD Instinct MI210"))
        monkeypatch.setattr(hip, "_hip", lambda: drv)
        mod = hip
    else:
        drv = FakeCudaBindings(NAMES)
        lib = FakeLibcuda(drv) if request.param == "cuda-ctypes" else None
        monkeypatch.setattr(cuda, "_driver", lambda: drv)
        monkeypatch.setattr(cuda, "_libcuda", lambda: lib)
        mod = cuda
    _fake_backend(monkeypatch, mod)
    return mod, drv


def _fake_backend(monkeypatch, mod):
    monkeypatch.setattr(mod, "available", lambda: (True, ""))
    monkeypatch.setattr(mod, "compiler_version", lambda: f"fake-{mod.NAME}")  # builds are faked too
    monkeypatch.setenv("INT4JIT_BACKEND", mod.NAME)
    monkeypatch.setattr(launch, "_loaded", {})  # keyed by id(device): fresh devices here
    monkeypatch.setattr(api, "_kernels", {})
    backends._open_device.cache_clear()  # and again after the test (_no_fake_devices_left)
    monkeypatch.setattr(compiler, "build", lambda spec: CompiledKernel(spec, b"\x7fELF fake", mod.NAME, "k" * 64))


@pytest.fixture(autouse=True)
def _no_fake_devices_left():
    yield
    backends._open_device.cache_clear()


def a_thread_with(drv, current, fn):
    """Run fn() in a new thread whose current device is `current` (None: none); re-raise."""
    box = {}

    def body():
        drv.current = current
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            box["error"] = e
    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


# -- the launch path ------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [False, True])
def test_interleaved_launches_on_two_devices_from_one_thread(fake, overlap):
    """Device 0's and device 1's kernels alternately, from one thread whose current device is 0
    (as torch leaves it): each launch runs in its own device's context, and the thread's current
    device is 0 again after each -- torch's notion of the current device never changes."""
    mod, drv = fake
    d0, d1 = backends.device(0), backends.device(1)
    assert d0 is not d1 and (d0.ordinal, d1.ordinal) == (0, 1)
    drv.current = 0
    (_, f0), (_, f1) = d0.load(b"x", "k"), d1.load(b"x", "k")
    assert (drv.owner[int(f0)], drv.owner[int(f1)]) == (0, 1)  # each loaded on its own device
    assert drv.current == 0
    r0, r1 = d0.launcher(f0, 64, 128, overlap), d1.launcher(f1, 64, 128, overlap)
    args = PackedArgs([1, 2, 3, 4, 5])
    for _ in range(3):
        r1(args, 0)
        assert drv.current == 0
        r0(args, 0)
        assert drv.current == 0
    assert [(f, dev) for _, f, dev in drv.launches] == [(int(f1), 1), (int(f0), 0)] * 3


def test_a_launch_from_a_thread_with_another_device_current_or_none(fake):
    mod, drv = fake
    d0, d1 = backends.device(0), backends.device(1)
    _, f1 = a_thread_with(drv, 1, lambda: d1.load(b"x", "k"))
    for current in (0, None):
        if current is None and mod is hip:
            continue  # HIP always has a current device (0 by default)
        after = a_thread_with(drv, current, lambda: (d1.launch(f1, 8, 64, PackedArgs([1, 2, 3, 4, 5]), 0), drv.current)[1])
        assert after == current
    assert [dev for _, _, dev in drv.launches] == [1] * len(drv.launches) and drv.launches


def test_the_fake_driver_rejects_a_launch_in_the_wrong_context(fake):
    """The fake is strict: the checks above would fail if int4jit did not switch."""
    mod, drv = fake
    d1 = backends.device(1)
    drv.current = 1
    _, f1 = d1.load(b"x", "k")
    drv.current = 0
    with pytest.raises(DriverError, match="ERROR_400"):
        _launch_without_switch(mod, f1)
    d1.launch(f1, 8, 64, PackedArgs([1, 2, 3, 4, 5]), 0)  # int4jit's launch switches
    assert [dev for _, _, dev in drv.launches] == [1] and drv.current == 0


def _launch_without_switch(mod, fn):
    """What a launcher without the context check would do: call the driver as things stand."""
    drv = mod._driver() if mod is cuda else mod._hip()
    if mod is cuda:
        (err,) = drv.cuLaunchKernel(fn, 8, 1, 1, 64, 1, 1, 0, 0, 0, 0)
    else:
        (err,) = drv.hipModuleLaunchKernel(fn, 8, 1, 1, 64, 1, 1, 0, None, None, 0)
    if int(err):
        raise DriverError(mod.NAME, "launch", err.name)


def test_every_device_call_runs_on_its_own_device(fake):
    """Load, memory, copies, streams, timing, graph capture and replay on device 1 while device 0
    is current: nothing reaches the wrong device (the fake fails it), and 0 stays current."""
    mod, drv = fake
    d1 = backends.device(1)
    drv.current = 0
    fn, stream, ptrs = exercise(d1)
    assert drv.current == 0
    assert all(drv.owner[int(p)] == 1 for p in ptrs) and drv.owner[int(stream)] == 1
    assert [dev for _, _, dev in drv.launches] == [1, 1]  # the eager launch and the captured one


def test_make_current_leaves_the_device_current(fake):
    mod, drv = fake
    d1 = backends.device(1)
    drv.current = 0
    d1.make_current()
    assert drv.current == 1
    d1.make_current()
    assert drv.current == 1
    with backends.device(0).active():
        assert drv.current == 0
    assert drv.current == 1


def test_two_threads_drive_two_devices_at_once(fake):
    """Two threads, each with its own current device (0 and 1, as torch.cuda.set_device leaves
    them), each launching on both devices in turn, at the same time: every launch runs on its
    kernel's device and each thread keeps its own current device."""
    mod, drv = fake
    devs = [backends.device(0), backends.device(1)]
    fns = [a_thread_with(drv, i, lambda d=d: d.load(b"x", "k")[1]) for i, d in enumerate(devs)]
    start, errors, after = threading.Barrier(2), [], {}

    def worker(me):
        drv.current = me
        runs = [d.launcher(f, 32, 128) for d, f in zip(devs, fns)]
        start.wait()
        try:
            for i in range(400):
                runs[(i + me) % 2](PackedArgs([1, 2, 3, 4, 5]), 0)
                if drv.current != me:
                    raise AssertionError(f"thread {me}: current device {drv.current} after a launch")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        after[me] = drv.current

    threads = [threading.Thread(target=worker, args=(i,), name=f"t{i}") for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert after == {0: 0, 1: 1}
    assert len(drv.launches) == 800
    assert all(dev == drv.owner[f] for _, f, dev in drv.launches)
    assert {(t, dev) for t, _, dev in drv.launches} == {("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)}


# -- device objects, handle tables, plans -----------------------------------------------------
def test_one_device_object_per_ordinal_and_a_clear_error_for_an_unseen_one(fake):
    mod, drv = fake
    d0, d1 = backends.device(0), backends.device(1)
    assert backends.device(0) is d0 and backends.device(np.int64(1)) is d1
    assert [d.ordinal for d in backends.devices()] == [0, 1]
    with pytest.raises(ValueError, match=r"GPU ordinal in 0\.\.1 \(2 .* GPUs visible.*got 2"):
        backends.device(2)
    with pytest.raises(ValueError, match="got -1"):
        backends.device(-1)
    with pytest.raises(TypeError, match="GPU ordinal"):
        backends.device("1")


def test_current_ordinal_follows_the_thread(fake):
    mod, drv = fake
    assert a_thread_with(drv, 1, backends.current_ordinal) == 1
    assert a_thread_with(drv, 0, backends.current_ordinal) == 0
    if mod is cuda:  # no context current: device 0, as the CUDA runtime would pick
        assert a_thread_with(drv, None, backends.current_ordinal) == 0


def test_each_device_loads_its_own_handles(fake, monkeypatch):
    """The same spec on two devices: two loads, each on its own device, each cached per device;
    the compiled code object is shared (one build)."""
    mod, drv = fake
    monkeypatch.setenv("INT4JIT_KERNEL", "simt")
    builds = []
    fake_build = compiler.build
    monkeypatch.setattr(compiler, "build", lambda spec: builds.append(spec) or fake_build(spec))
    d0, d1 = backends.device(0), backends.device(1)
    drv.current = 0
    spec = plan(GemvShape(256, 512, 128, False), d0.arch, d0, tune=False).spec
    k0, k1 = launch.load(d0, spec), launch.load(d1, spec)
    assert launch.load(d0, spec) is k0 and launch.load(d1, spec) is k1 and k0 is not k1
    assert (drv.owner[int(k0.function)], drv.owner[int(k1.function)]) == (0, 1)
    assert drv.current == 0
    k1(1, 2, 3, 4, 5, 0)
    k0(1, 2, 3, 4, 5, 0)
    assert [dev for _, _, dev in drv.launches] == [1, 0]


class FakeDeviceArray:
    """A __cuda_array_interface__ array on GPU `ordinal` (as cupy shows one)."""

    def __init__(self, a: np.ndarray, ordinal: int):
        self.a, self.device = a, type("D", (), {"id": ordinal})()
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                                         "version": 3, "strides": None}


def _problem(N=256, K=512, g=128):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(K).astype(np.float16), rng.integers(0, 256, (N, K // 2), dtype=np.uint8),
            (rng.random((N, K // g)) * 0.01).astype(np.float16), rng.integers(0, 16, (N, K // g), dtype=np.uint8),
            np.zeros(N, np.float16))


def test_gemv_on_device_arrays_of_the_second_gpu(fake, monkeypatch):
    """gemv with every array on GPU 1 while GPU 0 is current: planned and launched on device 1."""
    mod, drv = fake
    monkeypatch.setenv("INT4JIT_TUNE", "0")
    drv.current = 0
    arrays = [FakeDeviceArray(a, 1) for a in _problem()]
    int4jit.gemv(*arrays[:4], out=arrays[4])
    assert [dev for _, _, dev in drv.launches] == [1] and drv.current == 0
    assert any(key[0] is backends.device(1) for key in api._kernels)
    with pytest.raises(ValueError, match="device=0 but the arrays are on GPU 1"):
        int4jit.gemv(*arrays[:4], out=arrays[4], device=0)
    mixed = [FakeDeviceArray(a, i % 2) for i, a in enumerate(_problem())]
    with pytest.raises((ValueError, TypeError), match="GPU|device"):
        int4jit.gemv(*mixed[:4], out=mixed[4])
    assert len(drv.launches) == 1  # neither bad call launched


@pytest.mark.parametrize("device, current, expected", [(1, 0, 1), (0, 1, 0), (None, 1, 1), (None, 0, 0)])
def test_numpy_inputs_run_on_the_device_asked_for(fake, monkeypatch, device, current, expected):
    """gemv(numpy..., device=i) copies to and launches on GPU i; without device=, on the calling
    thread's current device. Every allocation, copy and launch happens there."""
    mod, drv = fake
    monkeypatch.setenv("INT4JIT_TUNE", "0")
    x, w, s, z, _ = _problem()
    a_thread_with(drv, current, lambda: int4jit.gemv(x, w, s, z, device=device))
    assert [dev for _, _, dev in drv.launches] == [expected]
    allocated = {dev for h, dev in drv.owner.items() if h not in {f for _, f, _ in drv.launches}}
    assert expected in allocated


def test_numpy_device_out_of_range_is_a_clear_error(fake, monkeypatch):
    mod, drv = fake
    x, w, s, z, _ = _problem()
    with pytest.raises(ValueError, match=r"0\.\.1.*got 5"):
        int4jit.gemv(x, w, s, z, device=5)


def test_a_shape_tuned_on_one_gpu_is_reused_on_another_of_the_same_model(fake, monkeypatch):
    """Tier 4 runs once on GPU 0; GPU 1 (same device name) takes the tuning DB's record; a GPU of
    another model tunes for itself."""
    mod, drv = fake
    monkeypatch.setenv("INT4JIT_KERNEL", "simt")
    measured = []

    def measure(device, specs, repeats=7):
        measured.append(device.ordinal)
        return {s: 10.0 + i for i, s in enumerate(specs)}
    monkeypatch.setattr(benchmark, "measure", measure)
    shape = GemvShape(320, 1536, 128, False)  # not in the shipped table
    d0, d1 = backends.device(0), backends.device(1)
    p0 = plan(shape, d0.arch, d0)
    assert p0.tier == "tuned" and set(measured) == {0}
    n = len(measured)
    p1 = plan(shape, d1.arch, d1)
    assert p1.tier == "db" and p1.spec == p0.spec and len(measured) == n
    d1.name = "another GPU model"  # the DB record names the device it was measured on
    assert plan(shape, d1.arch, d1).tier == "tuned" and measured[-1] == 1


# -- int4jit info ----------------------------------------------------------------------------
def test_info_lists_every_gpu_of_each_backend(monkeypatch, capsys):
    cdrv, hdrv = FakeCudaBindings(("NVIDIA H200", "NVIDIA H100 80GB HBM3")), FakeHip(("AMD MI210",) * 3)
    monkeypatch.setattr(cuda, "_driver", lambda: cdrv)
    monkeypatch.setattr(cuda, "_libcuda", lambda: FakeLibcuda(cdrv))
    monkeypatch.setattr(hip, "_hip", lambda: hdrv)
    for mod in (cuda, hip):
        monkeypatch.setattr(mod, "available", lambda: (True, ""))
        monkeypatch.setattr(mod, "compiler_version", lambda: "fake-1.0")
    backends._open_device.cache_clear()
    assert cli.cmd_info(None) == 0
    out = capsys.readouterr().out
    assert "cuda: compiler fake-1.0; devices 2" in out and "hip: compiler fake-1.0; devices 3" in out
    assert "[0] NVIDIA H200: arch sm_90, 132 SMs/CUs, memory 141.0 GiB, L2 60 MB" in out
    assert "[1] NVIDIA H100 80GB HBM3: arch sm_90" in out
    assert [line.split("]")[0].strip() for line in out.splitlines() if "AMD MI210" in line] == ["[0", "[1", "[2"]
    assert "memory 64.0 GiB" in out


def test_info_without_gpus_says_so(monkeypatch, capsys):
    for mod in (cuda, hip):
        monkeypatch.setattr(mod, "available", lambda: (False, "no driver here"))
    assert cli.cmd_info(None) == 0
    out = capsys.readouterr().out
    assert out.count("devices none (no driver here)") == 2 and "[0]" not in out
