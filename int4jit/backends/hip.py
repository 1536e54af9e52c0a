"""AMD backend: hiprtc (hip-python) compiles to a code object; the HIP module API loads
and launches. The same interface as backends/cuda.py, call for call."""
from __future__ import annotations

import functools
import os
import re

import numpy as np

from ..errors import BackendUnavailable, CompileError, DriverError
from ..trace import trace
from ._args import PackedArgs
from ._common import MadeOnMiss, ThreadCurrent, make_check, median_event_ms, status_name

NAME = "hip"
BINARY_KIND = "hsaco"
PRELUDE = "prelude_hip.hip"
_ARCH = re.compile(r"^gfx([0-9]{1,2})([0-9a-f])([0-9a-f])$")

# Targets with v_dot2_f32_f16 (__builtin_amdgcn_fdot2). Not gfx900/902/904/909/90c, gfx1010/1013.
DOT2_TARGETS = frozenset({
    "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950",
    "gfx1011", "gfx1012", "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
    "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153",
    "gfx1200", "gfx1201",
})
# Every AMD target with the oldest HIP (major, minor) whose hiprtc knows it. hiprtc 5.2 aborts
# the process on an --offload-arch it does not know (munmap_chunk(): invalid pointer, for
# gfx940, gfx1100 and for names that are no target at all, e.g. gfx90b), so int4jit refuses
# first. (5, 0): every one of them compiles with Debian's ROCm 5.2, checked one by one.
_BASE_TARGETS = ("gfx600", "gfx601", "gfx602", "gfx700", "gfx701", "gfx702", "gfx703", "gfx704", "gfx705",
                 "gfx801", "gfx802", "gfx803", "gfx805", "gfx810", "gfx900", "gfx902", "gfx904", "gfx906",
                 "gfx908", "gfx909", "gfx90a", "gfx90c", "gfx1010", "gfx1011", "gfx1012", "gfx1013",
                 "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036")
_FIRST_HIP = {**{t: (5, 0) for t in _BASE_TARGETS},
              "gfx940": (5, 5), "gfx941": (5, 5), "gfx942": (5, 7), "gfx950": (6, 4),
              "gfx1100": (5, 4), "gfx1101": (5, 4), "gfx1102": (5, 4), "gfx1103": (5, 5),
              "gfx1150": (6, 2), "gfx1151": (6, 2), "gfx1152": (6, 3), "gfx1153": (6, 4),
              "gfx1200": (6, 3), "gfx1201": (6, 3)}
# The newest HIP the table above describes: a newer hiprtc may know targets it does not list,
# which a probe compile in a child process (where an abort costs nothing) decides.
_NEWEST_KNOWN = (6, 4)


# Debian/Ubuntu's ROCm packages (libamdhip64-5: ROCm 5.2, hiprtc inside libamdhip64.so.5)
# have no ROCM_PATH tree; hip-python wants $ROCM_PATH/lib/libhiprtc.so and libamdhip64.so.
_DISTRO_HIP = ("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5", "/usr/lib/aarch64-linux-gnu/libamdhip64.so.5")


_rocm_links: str | None = None  # the ROCM_PATH this process made, if any


def _rocm_links_dir() -> str:
    """A private folder (0700, inside the user's own cache dir) for the library links; one
    owned by someone else or open to group/others is refused: its libraries would be loaded."""
    from .. import cache
    root = cache.cache_dir() / "rocm"
    lib = root / "lib"
    try:
        cache.make_private_dirs(lib)
        cache.check_private(root, strict=True)
        cache.check_private(lib, strict=True)
    except OSError as e:
        raise BackendUnavailable(f"hip: refusing the ROCm library folder {root}: {e}") from None
    return str(root)


def _locate_rocm():
    """Point hip-python at a distribution's ROCm through a folder of links, when no
    ROCm tree is configured (ROCM_PATH/ROCM_HOME unset, no /opt/rocm)."""
    global _rocm_links
    if os.environ.get("ROCM_PATH") or os.environ.get("ROCM_HOME") or os.path.isdir("/opt/rocm/lib"):
        return
    lib = next((p for p in _DISTRO_HIP if os.path.exists(p)), None)
    if lib is None:
        return
    root = _rocm_links_dir()
    for name in ("libhiprtc.so", "libamdhip64.so"):
        link = os.path.join(root, "lib", name)
        if not (os.path.islink(link) and os.readlink(link) == lib):
            tmp = f"{link}.{os.getpid()}.tmp"
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(lib, tmp)
            os.replace(tmp, link)
    os.environ["ROCM_PATH"] = _rocm_links = root
    trace("hip: no ROCm tree configured; using %s through ROCM_PATH=%s", lib, root)


def _hip():
    _locate_rocm()
    try:
        from hip import hip
    except ImportError as e:
        raise BackendUnavailable("the hip backend needs hip-python (pip install hip-python) "
                                 "and a ROCm runtime (ROCM_PATH)") from e
    return hip


def _hiprtc():
    _locate_rocm()
    try:
        from hip import hiprtc
    except ImportError as e:
        raise BackendUnavailable("compiling for gfx* needs hip-python's hiprtc and ROCm's libhiprtc "
                                 "(set ROCM_PATH to the directory holding lib/libhiprtc.so)") from e
    return hiprtc


check = make_check(NAME)


def parse_arch(arch: str) -> str:
    """'gfx90a:sramecc+:xnack-' (a gcnArchName) -> 'gfx90a'."""
    base = arch.split(":", 1)[0].strip().lower() if isinstance(arch, str) else arch
    if not isinstance(base, str) or not _ARCH.match(base):
        raise ValueError(f"not an AMD target: {arch!r}; expected a gcnArchName such as 'gfx90a' "
                         f"or 'gfx1100' (features like ':xnack-' are dropped)")
    return base


def wave_size(arch: str) -> int:
    """64 on GCN/CDNA (gfx9xx and older), 32 on RDNA (gfx10xx and newer)."""
    return 64 if int(_ARCH.match(parse_arch(arch)).group(1)) < 10 else 32


def kernel_traits(arch: str) -> dict:
    arch = parse_arch(arch)
    # TENSOR_CORES: no MFMA/WMMA analogue of gemv_tc.hip yet; AMD runs the simt kernel.
    return {"WARP": wave_size(arch), "HAS_DOT2": int(arch in DOT2_TARGETS), "TENSOR_CORES": 0}


@functools.lru_cache(maxsize=None)
def hip_version() -> tuple[int, int, int]:
    try:
        v = check(_hip().hipRuntimeGetVersion(), "hipRuntimeGetVersion")
    except RuntimeError as e:  # hip-python's loader: the ROCm library is not installed
        raise BackendUnavailable(f"ROCm's HIP runtime is not installed ({e}); install ROCm or "
                                 f"Debian's libamdhip64-5, or set ROCM_PATH") from None
    return v // 10_000_000, (v // 100_000) % 100, v % 100_000


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    major, minor, patch = hip_version()
    return f"hiprtc-{major}.{minor}.{patch}"


def _target_error(arch: str, why: str) -> CompileError:
    return CompileError(NAME, arch, [], why, "", "<target check>")


def known_targets(have: tuple[int, int]) -> list[str]:
    """The targets the table says a HIP (major, minor) knows."""
    return sorted((t for t, need in _FIRST_HIP.items() if have >= need), key=lambda t: (len(t), t))


_PROBE = """
import sys
from hip import hiprtc
err, prog = hiprtc.hiprtcCreateProgram(b'extern "C" __global__ void k(float* p) { p[0] = 1.0f; }', b"probe.hip", 0, [], [])
(err,) = hiprtc.hiprtcCompileProgram(prog, 1, [("--offload-arch=" + sys.argv[1]).encode()])
sys.exit(0 if int(err) == 0 else 3)
"""


@functools.lru_cache(maxsize=None)
def _probe(arch: str) -> str:
    """'' when this hiprtc compiles for `arch`, else why not: the probe runs in a child process,
    where an abort on an unknown target costs nothing."""
    import subprocess
    import sys
    _locate_rocm()
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, arch], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the probe compile did not finish ({e})"
    if r.returncode == 0:
        return ""
    if r.returncode < 0:
        return f"a probe compile for {arch} killed its process (signal {-r.returncode})"
    return f"a probe compile for {arch} failed ({(r.stderr.strip().splitlines() or ['exit ' + str(r.returncode)])[-1][:200]})"


def check_target_known(arch: str):
    """Refuse a target this hiprtc does not know, before it can abort the process: a known
    target newer than the compiler names the ROCm it needs; an unknown one lists the known."""
    need = _FIRST_HIP.get(arch)
    have = hip_version()[:2]
    if need is not None:
        if have < need:
            raise _target_error(arch, f"{compiler_version()} predates {arch} (first supported in HIP "
                                      f"{need[0]}.{need[1]}); install ROCm {need[0]}.{need[1]} or newer")
        return
    if have <= _NEWEST_KNOWN:
        raise _target_error(arch, f"{arch} is not an AMD target {compiler_version()} knows; it knows "
                                  f"{', '.join(known_targets(have))}")
    why = _probe(arch)
    if why:
        raise _target_error(arch, f"{compiler_version()} does not know {arch}: {why}")


def compile_source(source: str, name: str, arch: str, options=()) -> bytes:
    """Compile HIP source for `arch` ('gfx90a') to a code object. Needs no GPU."""
    hiprtc = _hiprtc()
    arch = parse_arch(arch)
    check_target_known(arch)
    opts = [f"--offload-arch={arch}", "-std=c++17", *options]
    prog = check(hiprtc.hiprtcCreateProgram(source.encode(), name.encode(), 0, [], []), "hiprtcCreateProgram")
    try:
        (err,) = hiprtc.hiprtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        size = check(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
        buf = bytearray(size)
        if size:
            check(hiprtc.hiprtcGetProgramLog(prog, buf), "hiprtcGetProgramLog")
        log = bytes(buf).rstrip(b"\0 ").decode(errors="replace")
        if int(err) != 0:
            raise CompileError(NAME, arch, opts, log or status_name(err), source, name)
        size = check(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        code = bytearray(size)
        check(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
        return bytes(code)
    finally:
        hiprtc.hiprtcDestroyProgram(prog.createRef())


def device_count() -> int:
    """How many HIP devices this process sees (HIP_VISIBLE_DEVICES applies); 0 where none can run."""
    ok, _ = available()
    return check(_hip().hipGetDeviceCount(), "hipGetDeviceCount") if ok else 0


def current_ordinal() -> int:
    """The calling thread's current device (what torch.cuda.set_device or hipSetDevice chose; 0
    by default)."""
    if not available()[0]:
        return 0
    result = _hip().hipGetDevice()
    return int(result[1]) if int(result[0]) == 0 else 0


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    """(True, '') when a HIP device can run kernels, else (False, why)."""
    try:
        count = check(_hip().hipGetDeviceCount(), "hipGetDeviceCount")
    except (BackendUnavailable, DriverError, RuntimeError, OSError) as e:
        return False, str(e).splitlines()[0]
    return (count > 0, "" if count > 0 else "no HIP device")


class Device(ThreadCurrent):
    """One HIP device. Launch path written symmetric with backends/cuda.py; not run in CI. Every
    call that needs a device runs with this one current and leaves the calling thread's own
    current device as it found it: several devices can be driven from one thread, and torch or
    cupy never see their current device change under them."""

    def __init__(self, ordinal: int = 0):
        self._hip = hip = _hip()
        self.ordinal = self._mine = ordinal
        props = hip.hipDeviceProp_t()
        check(hip.hipGetDeviceProperties(props, ordinal), "hipGetDeviceProperties")
        gcn = props.gcnArchName
        self.full_arch = gcn.decode() if isinstance(gcn, bytes) else str(gcn)
        self.arch = parse_arch(self.full_arch)
        self.sm_count = props.multiProcessorCount
        self.l2_bytes = props.l2CacheSize
        self.max_threads_per_sm = props.maxThreadsPerMultiProcessor
        self.regs_per_sm = props.regsPerMultiprocessor
        self.max_grid_x = props.maxGridSize[0]
        self.warp_size = props.warpSize
        name = props.name
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.has_dot2 = self.arch in DOT2_TARGETS
        self.supports_overlap = False  # HIP has no programmatic dependent launch
        self._launchers = MadeOnMiss(lambda key: self._make_launcher(*key), 4096)  # (function, grid, block, smem) -> launch callable

    def __repr__(self):
        return f"<int4jit hip device {self.ordinal}: {self.name} ({self.full_arch}, {self.sm_count} CUs)>"

    def total_memory(self) -> int:
        """The device's memory in bytes."""
        return int(check(self._hip.hipDeviceTotalMem(self.ordinal), "hipDeviceTotalMem"))

    # -- context -----------------------------------------------------------------------
    def _current(self) -> int:
        """The calling thread's current device ordinal."""
        return check(self._hip.hipGetDevice(), "hipGetDevice")

    def _set_current(self, ordinal: int):
        check(self._hip.hipSetDevice(ordinal), "hipSetDevice")

    # -- code --------------------------------------------------------------------------
    def load(self, binary: bytes, kernel: str):
        with self.active():
            module = check(self._hip.hipModuleLoadData(binary), "hipModuleLoadData")
            fn = check(self._hip.hipModuleGetFunction(module, kernel.encode()), "hipModuleGetFunction")
        return module, fn

    def launch(self, fn, grid: int, block: int, args: PackedArgs, stream: int = 0, overlap: bool = False,
               smem: int = 0):
        """Launch on `stream`. overlap (programmatic dependent launch) is CUDA's; HIP launches
        stay stream-ordered and the kernel's wait point is compiled out (prelude_hip.hip).
        smem: dynamic shared memory (LDS) a block, bytes."""
        self.launcher(fn, grid, block, overlap, smem)(args, stream)

    def launcher(self, fn, grid: int, block: int, overlap: bool = False, smem: int = 0):
        """A callable (args, stream) launching `fn` over `grid` blocks of `block` threads with
        `smem` bytes of dynamic shared memory, with everything that does not change between
        calls bound once (the per-call path)."""
        return self._launchers[(fn, grid, block, smem)]

    def _make_launcher(self, fn, grid: int, block: int, smem: int = 0):
        launch, in_context, current, ordinal = self._hip.hipModuleLaunchKernel, self._in_context, self._current, self.ordinal

        def run_here(args: PackedArgs, stream: int = 0):
            # HIP takes arguments as one packed buffer through `extra`; hip-python wants None
            # for the null stream.
            result = launch(fn, grid, 1, 1, block, 1, 1, smem, stream or None, None, args.extra_address)
            err = result[0] if isinstance(result, tuple) else result
            if int(err) != 0:
                raise DriverError(NAME, "hipModuleLaunchKernel", status_name(err))

        def run(args: PackedArgs, stream: int = 0):
            # The per-call device check: one hipGetDevice when ours is current (the usual case),
            # a switch there and back when another is (_in_context).
            prev = current()
            if prev != ordinal:
                return in_context(run_here, args, stream, prev)
            run_here(args, stream)
        return run

    # -- memory ------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        with self.active():
            return int(check(self._hip.hipMalloc(max(1, nbytes)), "hipMalloc"))

    def free(self, ptr: int):
        with self.active():
            check(self._hip.hipFree(ptr), "hipFree")

    def copy_htod(self, dst: int, src: np.ndarray, stream: int = 0):
        src = np.ascontiguousarray(src)
        with self.active():
            check(self._hip.hipMemcpyHtoDAsync(dst, src.ctypes.data, src.nbytes, stream or None), "hipMemcpyHtoDAsync")

    def copy_dtoh(self, dst: np.ndarray, src: int, stream: int = 0):
        with self.active():
            check(self._hip.hipMemcpyDtoHAsync(dst.ctypes.data, src, dst.nbytes, stream or None), "hipMemcpyDtoHAsync")

    def copy_dtod(self, dst: int, src: int, nbytes: int, stream: int = 0):
        with self.active():
            check(self._hip.hipMemcpyDtoDAsync(dst, src, nbytes, stream or None), "hipMemcpyDtoDAsync")

    # -- streams and timing ------------------------------------------------------------
    # Stream 0 means the current device's null stream: these run with ours current.
    def create_stream(self) -> int:
        with self.active():
            return int(check(self._hip.hipStreamCreateWithFlags(1), "hipStreamCreateWithFlags"))  # non-blocking

    def destroy_stream(self, stream: int):
        with self.active():
            check(self._hip.hipStreamDestroy(stream), "hipStreamDestroy")

    def synchronize(self, stream: int = 0):
        with self.active():
            check(self._hip.hipStreamSynchronize(stream or None), "hipStreamSynchronize")

    def is_capturing(self, stream: int) -> bool:
        with self.active():
            status = check(self._hip.hipStreamIsCapturing(stream or None), "hipStreamIsCapturing")
        return int(status) != 0

    def capture_graph(self, run, stream: int):
        """Record the launches run() makes on `stream` (not the default stream) into an
        executable graph; returns (graph, exec)."""
        hip = self._hip
        with self.active():
            check(hip.hipStreamBeginCapture(stream or None, hip.hipStreamCaptureMode.hipStreamCaptureModeRelaxed), "hipStreamBeginCapture")
            try:
                run()
            finally:
                graph = check(hip.hipStreamEndCapture(stream or None), "hipStreamEndCapture")
            return graph, check(hip.hipGraphInstantiate(graph, None, None, 0), "hipGraphInstantiate")

    def replay(self, graph, stream: int):
        with self.active():
            check(self._hip.hipGraphLaunch(graph[1], stream or None), "hipGraphLaunch")

    def destroy_graph(self, graph):
        hip = self._hip
        with self.active():
            hip.hipGraphExecDestroy(graph[1])
            hip.hipGraphDestroy(graph[0])

    def time_ms(self, run, repeats: int, stream: int = 0) -> float:
        """Median of `repeats` event-timed calls of run() on `stream`, in ms."""
        hip = self._hip

        class Events:
            create = staticmethod(lambda: check(hip.hipEventCreate(), "hipEventCreate"))
            record = staticmethod(lambda e: check(hip.hipEventRecord(e, stream or None), "hipEventRecord"))
            wait = staticmethod(lambda e: check(hip.hipEventSynchronize(e), "hipEventSynchronize"))
            elapsed = staticmethod(lambda a, b: check(hip.hipEventElapsedTime(a, b), "hipEventElapsedTime"))
            destroy = staticmethod(lambda e: hip.hipEventDestroy(e))

        with self.active():  # events belong to the device current when they are made
            return median_event_ms(Events, run, repeats)
