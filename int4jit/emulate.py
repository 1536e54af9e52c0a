"""Run a kernel spec on the CPU: its template rendered with the spec's parameters and the
target's traits (wave size, dot2), over templates/prelude_cpu.hip instead of the vendor prelude,
built by the host's C++ compiler (g++ or clang++, $CXX first) into a shared library in a private
temp dir, and launched through ctypes.

What this checks without a GPU: the kernel bodies' indexing, work split, reductions and
arithmetic for any spec, the AMD targets' wave sizes and dot-product forms included, and the
prefill GEMM's Hopper units (mbarriers, bulk copies, wgmma: prelude_cpu.hip stands in for the
template's own, which it keeps out with I4_EMULATED). What it does not: the vendor preludes
(inline PTX, hiprtc builtins), timing, memory ordering between blocks (they run one after the
other, a cluster's blocks together, so a block that waits for a later one is reported). `int4jit` on a
machine without a GPU uses it to check a few blocks of each kernel it compiles; the CPU tests
(tests/test_kernels_cpu.py) run whole grids."""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import string
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from . import compiler
from .spec import TEMPLATES, KernelSpec, gemm_workspace_bytes, read_template
from .trace import trace

# Kernels that take the token count as a sixth argument: the prefill GEMM and its x layout.
TOKENS_ARG = ("xperm", "gemm")
CXX_FLAGS = ("-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w")
STD_HEADER = "i4emu_std.h"  # the prelude's standard headers, precompiled once a process (_private_dir)
_libs: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()
_run_lock = threading.Lock()
_dir: Path | None = None


def compiler_path() -> str | None:
    """$CXX where it names an executable, else g++ or clang++ on PATH (None: none)."""
    cxx = os.environ.get("CXX")
    return shutil.which(cxx) if cxx else shutil.which("g++") or shutil.which("clang++")


def unavailable() -> str | None:
    """Why no kernel can run on the CPU here (None: they can): no C++ compiler."""
    if compiler_path() is None:
        cxx = os.environ.get("CXX")
        return f"CXX={cxx!r} is no executable" if cxx else "no C++ compiler (g++ or clang++) on PATH"
    return None


def cluster_size(spec: KernelSpec) -> int:
    return spec.variant.kcluster if spec.kernel == "tc" else 1


def source(spec: KernelSpec) -> str:
    """The CPU prelude, then the spec's template once for each block of a cluster (in its own
    namespace, its shared memory in its own section), then an extern "C" launcher, as one C++
    source (the prelude's standard headers first: build() precompiles them)."""
    params = compiler.template_params(spec)
    prelude = string.Template((TEMPLATES / "prelude_cpu.hip").read_text()).substitute(params)
    body = string.Template(read_template(spec.template)).substitute(params).replace('extern "C" ', "")
    kc = cluster_size(spec)
    copies = "".join(f'#define I4_SMEM_SECTION "i4smem{r}"\nnamespace i4blk{r} {{\n{body}\n}}\n#undef I4_SMEM_SECTION\n'
                     for r in range(kc))
    args = "(const u16*)x, (const u8*)w, (const u16*)s, (const u8*)z, (u16*)y"
    args += ", tokens" if spec.kernel in TOKENS_ARG else ""
    launch = "".join(f"extern char __start_i4smem{r}[] __attribute__((weak));\n" for r in range(kc))
    launch += "".join(f"alignas(1024) static char i4dynamic{r}[{max(spec.smem, 1)}];\n" for r in range(kc))
    launch += (f'extern "C" const char* i4emu_launch(const void* x, const void* w, const void* s, const void* z, void* y,\n'
               f'                                    long long tokens, const int* clusters, int count) {{\n'
               + "".join(f"    i4emu::smem[{r}] = __start_i4smem{r};\n    i4emu::dynamic_smem[{r}] = i4dynamic{r};\n"
                         for r in range(kc))
               + "    i4emu::fault_text.clear();\n"
               + f"    i4emu::run({spec.grid}, {spec.block}, {kc}, clusters, count, [&](int rank) {{\n"
               + "".join(f"        if (rank == {r}) i4blk{r}::{spec.name}({args});\n" for r in range(kc))
               + "    });\n    return i4emu::fault_text.empty() ? nullptr : i4emu::fault_text.c_str();\n}\n")
    return f"{prelude}\n{copies}\n{launch}"


def _private_dir() -> Path:
    """This process's build dir (0700), holding the standard headers precompiled once where the
    compiler is GCC (they are half of each ~1.1 s build)."""
    global _dir
    if _dir is None:
        folder = Path(tempfile.mkdtemp(prefix="int4jit-emulator-"))
        atexit.register(shutil.rmtree, folder, True)
        headers = folder / STD_HEADER
        prelude = (TEMPLATES / "prelude_cpu.hip").read_text()
        headers.write_text("".join(f"{line}\n" for line in prelude.splitlines() if line.startswith("#include <")))
        version = subprocess.run([compiler_path(), "--version"], capture_output=True, text=True).stdout
        if "clang" not in version:
            done = subprocess.run([compiler_path(), *CXX_FLAGS[:2], *CXX_FLAGS[3:], "-x", "c++-header", str(headers),
                                   "-o", f"{headers}.gch"], capture_output=True, text=True)
            if done.returncode:
                trace("emulator: precompiling the standard headers failed, each build parses them: %s",
                      done.stderr[-500:])
        _dir = folder
    return _dir


def build(spec: KernelSpec) -> ctypes.CDLL:
    """The spec's kernel as a CPU library, built once per source in this process. RuntimeError
    with the compiler's output when it fails."""
    src = source(spec)
    key = hashlib.sha256(src.encode()).hexdigest()[:32]
    lib = _libs.get(key)
    if lib is not None:
        return lib
    with _lock:
        folder = _private_dir()
    cpp, so = folder / f"{key}.cpp", folder / f"{key}.so"
    cpp.write_text(f'#include "{STD_HEADER}"\n{src}')
    done = subprocess.run([compiler_path(), *CXX_FLAGS, "-I", str(folder), "-o", str(so), str(cpp)],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"emulating {spec.kernel} {spec.label()} for {spec.shape.key()} on {spec.arch}: the C++ "
                           f"compiler failed:\n{done.stderr[-4000:]}")
    lib = ctypes.CDLL(str(so))
    lib.i4emu_launch.restype = ctypes.c_char_p  # what went wrong, or None
    lib.i4emu_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_longlong, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    with _lock:
        return _libs.setdefault(key, lib)


def run(spec: KernelSpec, x: np.ndarray, w: np.ndarray, scales: np.ndarray, zeros, out: np.ndarray,
        blocks=None, tokens: int | None = None) -> np.ndarray:
    """Launch the spec on host arrays (x, scales and out as 16-bit words: float16, or bfloat16
    bits in uint16): the whole grid, or only `blocks` (indices; with their clusters' other
    blocks). `out` is written in place. tokens: the runtime token count of the kernels that take
    one (TOKENS_ARG: x is [tokens, K], out the GEMM's workspace)."""
    if (tokens is None) != (spec.kernel not in TOKENS_ARG):
        raise ValueError(f"tokens is {'needed' if tokens is None else 'not taken'} by the {spec.kernel} kernel")
    reason = unavailable()
    if reason:
        raise NotImplementedError(f"{spec.kernel} {spec.label()} on {spec.arch} cannot be emulated: {reason}")
    arrays = [np.ascontiguousarray(a) for a in (x, w, scales)]
    z = None if zeros is None else np.ascontiguousarray(zeros)
    if not out.flags.c_contiguous or out.dtype.itemsize != 2:
        raise ValueError(f"out must be a contiguous array of 16-bit words; got {out.dtype} {out.shape}")
    sh = spec.shape  # sizes checked: the kernel would read or write past a smaller array
    if spec.kernel == "xperm":  # x [tokens, K] into the GEMM's workspace; no weights read
        sizes = {"x": (arrays[0].nbytes, 2 * tokens * sh.K),
                 "out": (out.nbytes, gemm_workspace_bytes(tokens, sh.K, int(spec.param("GEMM_GRID"))))}
    else:
        rows = tokens if spec.kernel == "gemm" else sh.M
        sizes = {"x": (arrays[0].nbytes, 0 if spec.kernel == "dequant" else
                       gemm_workspace_bytes(tokens, sh.K, spec.grid) if spec.kernel == "gemm" else 2 * rows * sh.K),
                 "w": (arrays[1].nbytes, sh.N * sh.K // 2), "scales": (arrays[2].nbytes, 2 * sh.N * (sh.K // sh.group)),
                 "zeros": (0 if z is None else z.nbytes, 0 if sh.symmetric else sh.N * (sh.K // sh.group)),
                 "out": (out.nbytes, 2 * (sh.N * sh.K if spec.kernel == "dequant" else rows * sh.N))}
    for name, (have, need) in sizes.items():
        if have < need or (name == "zeros" and sh.symmetric and z is not None):
            raise ValueError(f"{name} must hold {need} bytes for {spec.kernel} {sh.key()}; got {have}")
    if spec.kernel == "gemm" and blocks is not None:
        raise ValueError("the GEMM's blocks wait for lower-numbered ones' partial sums: run its whole grid")
    ids = np.arange(spec.grid, dtype=np.int32) if blocks is None else np.asarray(blocks, dtype=np.int32)
    if ids.size and (ids.min() < 0 or ids.max() >= spec.grid):
        raise ValueError(f"blocks must lie in 0..{spec.grid - 1}; got {ids.min()}..{ids.max()}")
    ids = np.unique(ids // cluster_size(spec)).astype(np.int32)  # a block runs with its whole cluster
    lib = build(spec)
    with _run_lock:  # a library's emulated block state (its barriers, shared memory) serves one launch at a time
        fault = lib.i4emu_launch(*(a.ctypes.data for a in arrays), None if z is None else z.ctypes.data,
                                 out.ctypes.data, tokens or 0, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
                                 int(ids.size))
    if fault:
        raise RuntimeError(f"emulated {spec.kernel} {spec.label()} for {sh.key()}: {fault.decode()}")
    return out


def rows_of_block(spec: KernelSpec, block: int) -> range:
    """The output rows block `block` of the spec's grid writes (every kernel but dequant)."""
    first = (block // spec.variant.kcluster if spec.kernel == "tc" else block) * spec.rows_per_block
    return range(first, min(first + spec.rows_per_block, spec.shape.N))
