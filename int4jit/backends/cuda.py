"""NVIDIA backend: NVRTC (cuda-bindings) compiles to cubin; the driver API loads and launches."""
from __future__ import annotations

import ctypes
import functools
import os
import re
import threading
from typing import Optional

import numpy as np

from ..errors import BackendUnavailable, CompileError, DriverError
from ..trace import trace
from ._args import PackedArgs
from ._common import MadeOnMiss, ThreadCurrent, make_check, median_event_ms, status_name

NAME = "cuda"
BINARY_KIND = "cubin"
PRELUDE = "prelude_cuda.hip"
DEFAULT_DYNAMIC_SMEM = 48 * 1024  # dynamic shared memory a launch may ask for without opting in
_ARCH = re.compile(r"^sm_(\d{2,3})([af]?)$")


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise BackendUnavailable("the cuda backend needs cuda-bindings: pip install 'int4jit[cuda]'") from e
    return driver


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise BackendUnavailable("compiling for sm_* needs NVRTC: pip install 'int4jit[cuda]' "
                                 "(cuda-bindings and nvidia-cuda-nvrtc)") from e
    return nvrtc


check = make_check(NAME)


@functools.lru_cache(maxsize=None)
def _libcuda():
    """The driver library through ctypes, for the per-call launch: cuda-bindings' wrapper
    builds Python objects for every argument on every call. None where it cannot be loaded."""
    name = "nvcuda.dll" if os.name == "nt" else "libcuda.so.1"
    try:
        return ctypes.CDLL(name)
    except OSError as e:
        trace("%s not loadable through ctypes (%s): kernels launch through cuda-bindings", name, e)
        return None


class _ThreadContext(threading.local):
    """Per thread: the one-pointer buffer cuCtxGetCurrent writes the current context into (a
    buffer shared by threads would race between the query and the read)."""

    def __init__(self):
        self.buf = (ctypes.c_void_p * 1)()


_thread_context = _ThreadContext()


def _context_calls(drv):
    """(probe(buf), put(c_void_p) -> status): read the calling thread's current context into
    buf[0] (None: none is current), and set it. libcuda through ctypes where it loads (the probe
    runs on every launch: ~0.2 us, the GIL kept for what is a thread-local read in the driver),
    else cuda-bindings."""
    lib = _libcuda()
    if isinstance(lib, ctypes.CDLL):
        return ctypes.PyDLL(lib._name, handle=lib._handle).cuCtxGetCurrent, lib.cuCtxSetCurrent
    if hasattr(lib, "cuCtxGetCurrent"):  # a stand-in library (tests)
        return lib.cuCtxGetCurrent, lib.cuCtxSetCurrent

    def probe(buf):
        err, ctx = drv.cuCtxGetCurrent()
        buf[0] = (int(ctx) or None) if int(err) == 0 else None

    def put(ctx):
        (err,) = drv.cuCtxSetCurrent(ctx.value or 0)
        return int(err)
    return probe, put


def _per_stream(make) -> MadeOnMiss:
    """stream -> the value a launch passes for it, made on first use (at most 64 kept)."""
    return MadeOnMiss(make, 64)


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute (cuda.h): id, padding to 8 bytes, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h)."""
    _fields_ = [("gridDim", ctypes.c_uint * 3), ("blockDim", ctypes.c_uint * 3), ("sharedMemBytes", ctypes.c_uint),
                ("hStream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def _launch_config(grid: int, block: int, stream: int, pdl_attr_id: Optional[int], smem: int = 0) -> _LaunchConfig:
    """A launch config with `smem` bytes of dynamic shared memory; with pdl_attr_id, its one
    attribute allows programmatic stream serialization (PDL)."""
    attr = None
    if pdl_attr_id is not None:
        attr = _LaunchAttribute()
        attr.id = pdl_attr_id
        ctypes.c_int.from_buffer(attr.value).value = 1  # programmaticStreamSerializationAllowed
    config = _LaunchConfig((ctypes.c_uint * 3)(grid, 1, 1), (ctypes.c_uint * 3)(block, 1, 1), smem, stream,
                           None if attr is None else ctypes.pointer(attr), 0 if attr is None else 1)
    config._keep = attr  # the pointer does not keep its target alive
    return config


def parse_arch(arch: str) -> str:
    """'sm_90' -> 'sm_90'; anything else is a ValueError naming what was expected."""
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise ValueError(f"not an NVIDIA target: {arch!r}; expected 'sm_XY' such as 'sm_80' or 'sm_90'")
    return arch


def kernel_traits(arch: str) -> dict:
    """What the template needs to know about an NVIDIA target."""
    major = int(_ARCH.match(parse_arch(arch)).group(1)) // 10
    # mma.sync m16n8k16 f16 -> f32 (the tensor-core kernel's step) exists from sm_80 on.
    return {"WARP": 32, "HAS_DOT2": 0, "TENSOR_CORES": int(major >= 8)}


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    major, minor = check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return f"nvrtc-{major}.{minor}"


@functools.lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    """The sm_XY numbers this NVRTC compiles for (nvrtcGetSupportedArchs), e.g. (75, 80, ..., 120)."""
    return tuple(int(a) for a in check(_nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


def check_target_known(arch: str):
    """Refuse a target this NVRTC does not compile for, saying which ones it does (NVRTC's
    own answer is a bare 'invalid value for --gpu-architecture')."""
    number = int(_ARCH.match(arch).group(1))
    archs = supported_archs()
    if number in archs:
        return
    hint = ("a newer CUDA toolkit's NVRTC" if archs and number > max(archs) else
            "an older CUDA toolkit's NVRTC" if archs and number < min(archs) else "a real target")
    raise CompileError(NAME, arch, [], f"{compiler_version()} does not compile for {arch}; it supports "
                       f"{', '.join(f'sm_{a}' for a in archs)}; {arch} needs {hint}", "", "<target check>")


def compile_source(source: str, name: str, arch: str, options=()) -> bytes:
    """Compile CUDA-dialect source for `arch` ('sm_90') to a cubin. Needs no GPU."""
    nvrtc = _nvrtc()
    parse_arch(arch)
    check_target_known(arch)
    opts = [f"--gpu-architecture={arch}", "-std=c++17", *options]
    prog = check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if int(err) != 0:
            raise CompileError(NAME, arch, opts, log or status_name(err), source, name)
        size = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def device_count() -> int:
    """How many CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 where none can run."""
    ok, _ = available()
    return check(_driver().cuDeviceGetCount(), "cuDeviceGetCount") if ok else 0


def current_ordinal() -> int:
    """The device of the calling thread's current context (what torch.cuda.set_device or
    cudaSetDevice chose); 0 where no context is current."""
    if not available()[0]:
        return 0
    err, dev = _driver().cuCtxGetDevice()
    return int(dev) if int(err) == 0 else 0


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    """(True, '') when a CUDA device can run kernels, else (False, why)."""
    try:
        driver = _driver()
        check(driver.cuInit(0), "cuInit")
        count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    except (BackendUnavailable, DriverError, RuntimeError, OSError) as e:
        return False, str(e).splitlines()[0]
    return (count > 0, "" if count > 0 else "no CUDA device")


class Device(ThreadCurrent):
    """One CUDA device, used through its primary context (shared with torch and cupy). Every call
    that needs a context runs with this device's current and leaves the calling thread's own
    current context as it found it: several devices can be driven from one thread, and torch
    or cupy never see their current device change under them."""

    def __init__(self, ordinal: int = 0):
        self._drv = drv = _driver()
        check(drv.cuInit(0), "cuInit")
        self.ordinal = ordinal
        self._dev = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        self._ctx = check(drv.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        self._ctx_id = self._mine = int(self._ctx)
        self._probe_context, self._put_context = _context_calls(drv)
        attr = drv.CUdevice_attribute
        get = lambda a: check(drv.cuDeviceGetAttribute(a, self._dev), "cuDeviceGetAttribute")
        major = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.arch = f"sm_{major}{minor}"
        self.sm_count = get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.l2_bytes = get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        self.max_threads_per_sm = get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
        self.regs_per_sm = get(attr.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)
        self.max_grid_x = get(attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)
        self.warp_size = 32
        raw = check(drv.cuDeviceGetName(256, self._dev), "cuDeviceGetName")
        self.name = raw.split(b"\0", 1)[0].decode()
        self.has_dot2 = False
        self.supports_overlap = major >= 9  # programmatic dependent launch
        # (function, grid, block, overlap, smem) -> prepared launch callable
        self._launchers = MadeOnMiss(
            lambda key: self._make_launcher(*key[:3], key[3] and self.supports_overlap, key[4]), 4096)

    def __repr__(self):
        return f"<int4jit cuda device {self.ordinal}: {self.name} ({self.arch}, {self.sm_count} SMs)>"

    def total_memory(self) -> int:
        """The device's memory in bytes."""
        return int(check(self._drv.cuDeviceTotalMem(self._dev), "cuDeviceTotalMem"))

    # -- context -----------------------------------------------------------------------
    def _current(self):
        """The calling thread's current context, an int (None: no context is current)."""
        buf = _thread_context.buf
        self._probe_context(buf)
        return buf[0]

    def _set_current(self, ctx):
        if err := self._put_context(ctypes.c_void_p(ctx)):
            raise DriverError(NAME, "cuCtxSetCurrent", self._status(err))

    # -- code --------------------------------------------------------------------------
    def load(self, binary: bytes, kernel: str):
        """Load a cubin and return (module, function). Raises DriverError if it does not load."""
        with self.active():
            module = check(self._drv.cuModuleLoadData(binary), "cuModuleLoadData")
            fn = check(self._drv.cuModuleGetFunction(module, kernel.encode()), "cuModuleGetFunction")
        return module, fn

    def launch(self, fn, grid: int, block: int, args: PackedArgs, stream: int = 0, overlap: bool = False,
               smem: int = 0):
        """Launch on `stream`. overlap=True (sm_90+) lets the kernel start while the previous one
        on the stream drains (programmatic dependent launch): the kernel must wait
        (griddepcontrol.wait, I4_GRID_WAIT) before it reads anything. smem: dynamic shared
        memory a block, bytes."""
        self.launcher(fn, grid, block, overlap, smem)(args, stream)

    def launcher(self, fn, grid: int, block: int, overlap: bool = False, smem: int = 0):
        """A callable (args, stream) launching `fn` over `grid` blocks of `block` threads with
        `smem` bytes of dynamic shared memory, with everything that does not change between
        calls prepared once (the per-call path)."""
        return self._launchers[(fn, grid, block, overlap, smem)]

    def _make_launcher(self, fn, grid: int, block: int, overlap: bool, smem: int = 0):
        if smem > DEFAULT_DYNAMIC_SMEM:  # past 48 KB a function must opt in, once
            with self.active():
                check(self._drv.cuFuncSetAttribute(
                    fn, self._drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                    "cuFuncSetAttribute")
        raw = _libcuda()
        if raw is None:
            return self._bindings_launcher(fn, grid, block, overlap, smem)
        c_fn = ctypes.c_void_p(int(fn))
        # cuLaunchKernelEx for every launch, PDL or not: its four arguments cost ~1.2 us less per call
        # through ctypes than cuLaunchKernel's eleven (docs/performance.md, Per call from Python).
        launch_ex = raw.cuLaunchKernelEx
        attr_id = (int(self._drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
                   if overlap else None)
        configs = _per_stream(lambda s: ctypes.byref(_launch_config(grid, block, s, attr_id, smem)))
        # The per-call context check: one cuCtxGetCurrent when ours is current (the usual case),
        # a switch there and back when another device's is (_in_context).
        probe, thread, ctx, in_context = self._probe_context, _thread_context, self._ctx_id, self._in_context

        def run_here(args: PackedArgs, stream: int = 0):
            if err := launch_ex(configs[stream], c_fn, args.params, None):
                raise DriverError(NAME, "cuLaunchKernelEx", self._status(err))

        def run(args: PackedArgs, stream: int = 0):
            buf = thread.buf
            probe(buf)
            if buf[0] != ctx:
                return in_context(run_here, args, stream, buf[0])
            if err := launch_ex(configs[stream], c_fn, args.params, None):
                raise DriverError(NAME, "cuLaunchKernelEx", self._status(err))
        return run

    def _status(self, err: int) -> str:
        try:
            return status_name(self._drv.CUresult(err))
        except ValueError:
            return f"CUresult {err}"

    def _bindings_launcher(self, fn, grid: int, block: int, overlap: bool, smem: int = 0):
        """The same launch through cuda-bindings, where libcuda cannot be reached through ctypes."""
        drv, active = self._drv, self.active
        if overlap:
            configs = _per_stream(lambda s: self._overlap_config(grid, block, s, smem))

            def run(args: PackedArgs, stream: int = 0):
                with active():
                    (err,) = drv.cuLaunchKernelEx(configs[stream], fn, args.params_address, 0)
                if int(err) != 0:
                    raise DriverError(NAME, "cuLaunchKernelEx", status_name(err))
            return run

        def run(args: PackedArgs, stream: int = 0):
            with active():
                (err,) = drv.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, smem, stream, args.params_address, 0)
            if int(err) != 0:
                raise DriverError(NAME, "cuLaunchKernel", status_name(err))
        return run

    def _overlap_config(self, grid: int, block: int, stream: int, smem: int = 0):
        """cuda-bindings' CUlaunchConfig with programmatic stream serialization allowed."""
        drv = self._drv
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
        config.sharedMemBytes, config.hStream = smem, stream
        config.attrs, config.numAttrs = [attr], 1
        return config

    # -- memory ------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        with self.active():
            return int(check(self._drv.cuMemAlloc(max(1, nbytes)), "cuMemAlloc"))

    def free(self, ptr: int):
        with self.active():
            check(self._drv.cuMemFree(ptr), "cuMemFree")

    def copy_htod(self, dst: int, src: np.ndarray, stream: int = 0):
        src = np.ascontiguousarray(src)
        with self.active():
            check(self._drv.cuMemcpyHtoDAsync(dst, src.ctypes.data, src.nbytes, stream), "cuMemcpyHtoDAsync")

    def copy_dtoh(self, dst: np.ndarray, src: int, stream: int = 0):
        with self.active():
            check(self._drv.cuMemcpyDtoHAsync(dst.ctypes.data, src, dst.nbytes, stream), "cuMemcpyDtoHAsync")

    def copy_dtod(self, dst: int, src: int, nbytes: int, stream: int = 0):
        with self.active():
            check(self._drv.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")

    # -- streams and timing ------------------------------------------------------------
    # Stream 0 means the current context's default stream: these run with ours current.
    def create_stream(self) -> int:
        with self.active():
            return int(check(self._drv.cuStreamCreate(1), "cuStreamCreate"))  # non-blocking

    def destroy_stream(self, stream: int):
        with self.active():
            check(self._drv.cuStreamDestroy(stream), "cuStreamDestroy")

    def synchronize(self, stream: int = 0):
        with self.active():
            check(self._drv.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def is_capturing(self, stream: int) -> bool:
        with self.active():
            status = check(self._drv.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
        return int(status) != 0

    def capture_graph(self, run, stream: int):
        """Record the launches run() makes on `stream` (not the default stream) into an
        executable graph; returns (graph, exec)."""
        drv = self._drv
        with self.active():
            check(drv.cuStreamBeginCapture(stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
            try:
                run()
            finally:
                graph = check(drv.cuStreamEndCapture(stream), "cuStreamEndCapture")
            return graph, check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

    def replay(self, graph, stream: int):
        with self.active():
            check(self._drv.cuGraphLaunch(graph[1], stream), "cuGraphLaunch")

    def destroy_graph(self, graph):
        drv = self._drv
        with self.active():
            drv.cuGraphExecDestroy(graph[1])
            drv.cuGraphDestroy(graph[0])

    def time_ms(self, run, repeats: int, stream: int = 0) -> float:
        """Median of `repeats` event-timed calls of run() on `stream`, in ms."""
        drv = self._drv

        class Events:
            create = staticmethod(lambda: check(drv.cuEventCreate(0), "cuEventCreate"))
            record = staticmethod(lambda e: check(drv.cuEventRecord(e, stream), "cuEventRecord"))
            wait = staticmethod(lambda e: check(drv.cuEventSynchronize(e), "cuEventSynchronize"))
            elapsed = staticmethod(lambda a, b: check(drv.cuEventElapsedTime(a, b), "cuEventElapsedTime"))
            destroy = staticmethod(lambda e: drv.cuEventDestroy(e))

        with self.active():  # events belong to the context current when they are made
            return median_event_ms(Events, run, repeats)
