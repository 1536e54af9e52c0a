"""Run a kernel spec's template on the CPU: the template rendered with the spec's parameters and
the target's traits (wave size, dot2), over tests/emulator/prelude_cpu.hip instead of the vendor
prelude, compiled by the host C++ compiler into a shared library and launched through ctypes.

What this checks without a GPU: the kernel bodies' indexing, work split, reductions and
arithmetic for any spec, the AMD targets' wave sizes and dot-product forms included. What it
does not: the vendor preludes (inline PTX, hiprtc builtins), timing, memory ordering between
blocks (blocks run one after the other) and thread block clusters (kcluster > 1)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import string
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from int4jit import compiler
from int4jit.spec import KernelSpec, read_template

PRELUDE = Path(__file__).parent / "emulator" / "prelude_cpu.hip"
CXX_FLAGS = ("-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w")


def compiler_path() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def can_emulate(spec: KernelSpec) -> str | None:
    """Why `spec` cannot run here (None: it can)."""
    if compiler_path() is None:
        return "no C++ compiler (g++ or clang++) on PATH"
    if spec.kernel == "tc" and spec.variant.kcluster > 1:
        return "thread block clusters are not emulated"
    return None


def source(spec: KernelSpec) -> str:
    params = compiler.template_params(spec)
    prelude = string.Template(PRELUDE.read_text()).substitute(params)
    body = string.Template(read_template(spec.template)).substitute(params)
    launch = (f'extern "C" void i4emu_launch(const void* x, const void* w, const void* s, const void* z, void* y) {{\n'
              f'    i4emu::run({spec.grid}, {spec.block}, [&] {{ {spec.name}((const u16*)x, (const u8*)w, '
              f'(const u16*)s, (const u8*)z, (u16*)y); }});\n}}\n')
    return f"{prelude}\n{body}\n{launch}"


_libs: dict[str, ctypes.CDLL] = {}


def build(spec: KernelSpec) -> ctypes.CDLL:
    """The spec's kernel as a CPU library (compiled once per source, kept in a temp dir)."""
    src = source(spec)
    key = hashlib.sha256(src.encode()).hexdigest()[:24]
    lib = _libs.get(key)
    if lib is None:
        out_dir = Path(tempfile.gettempdir()) / f"int4jit-emulator-{os.getuid()}"
        out_dir.mkdir(mode=0o700, exist_ok=True)
        so = out_dir / f"{key}.so"
        if not so.exists():
            cpp = out_dir / f"{key}.cpp"
            cpp.write_text(src)
            tmp = out_dir / f"{key}.{os.getpid()}.so"
            done = subprocess.run([compiler_path(), *CXX_FLAGS, "-o", str(tmp), str(cpp)], capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"emulating {spec.label()} {spec.shape.key()}: the C++ compiler failed:\n{done.stderr[-4000:]}")
            os.replace(tmp, so)
        lib = _libs[key] = ctypes.CDLL(str(so))
        lib.i4emu_launch.restype = None
        lib.i4emu_launch.argtypes = [ctypes.c_void_p] * 5
    return lib


def run(spec: KernelSpec, x: np.ndarray, w: np.ndarray, scales: np.ndarray, zeros, out: np.ndarray) -> np.ndarray:
    """Launch the spec on host arrays (x, scales, out as their 16-bit words: float16, or bfloat16
    bits in uint16); `out` is written in place and returned."""
    arrays = [np.ascontiguousarray(a) for a in (x, w, scales)]
    z = None if zeros is None else np.ascontiguousarray(zeros)
    assert out.flags.c_contiguous
    build(spec).i4emu_launch(*(a.ctypes.data for a in arrays), None if z is None else z.ctypes.data, out.ctypes.data)
    return out
