"""The tuner's measuring harness: compile candidates in parallel, then time each one by graph
replay over rotating weight copies (more bytes than L2 holds), median of several replays."""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import compiler
from .errors import Int4JitError
from .launch import load
from .reference import random_problem
from .shapes import GemvShape
from .spec import KernelSpec
from .trace import trace


def build_all(specs: list[KernelSpec]) -> dict[KernelSpec, object]:
    """Compile in parallel; a failure is traced and scores that candidate None (as Triton's inf)."""
    def one(spec):
        try:
            return spec, compiler.build(spec)
        except Int4JitError as e:
            trace("candidate %s for %s failed to compile: %s", spec.label(), spec.shape.key(), str(e).splitlines()[0])
            return spec, None
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(specs)))) as pool:
        return dict(pool.map(one, specs))


class BenchBuffers:
    """Random weights in enough rotating copies that L2 cannot hold them, on one device."""

    def __init__(self, device, shape: GemvShape, l2_multiple: float = 3.0, max_copies: int = 64,
                 seed: int | None = None):
        self.device = device
        # Random canonical bytes, not quantised weights: the kernel's time does not depend on
        # how the bytes were made, and quantising a 128256x4096 matrix alone takes seconds.
        x, w, s, z = random_problem(shape, np.random.default_rng(seed))
        self.host = (x, w, s, z)
        per_copy = w.nbytes + s.nbytes + (0 if z is None else z.nbytes)
        self.copies = int(min(max_copies, max(2, math.ceil(l2_multiple * device.l2_bytes / per_copy))))
        self._ptrs = []
        self.x = self._upload(x)
        self.y = device.alloc(2 * shape.M * shape.N)
        self._ptrs.append(self.y)
        first = (self._upload(w), self._upload(s), 0 if z is None else self._upload(z))
        self.sets = [first]
        for _ in range(self.copies - 1):
            self.sets.append((self._clone(first[0], w.nbytes), self._clone(first[1], s.nbytes),
                              0 if z is None else self._clone(first[2], z.nbytes)))
        device.synchronize()

    def _upload(self, a):
        p = self.device.alloc(a.nbytes)
        self._ptrs.append(p)
        self.device.copy_htod(p, a)
        return p

    def _clone(self, src, nbytes):
        p = self.device.alloc(nbytes)
        self._ptrs.append(p)
        self.device.copy_dtod(p, src, nbytes)
        return p

    def free(self):
        self.device.synchronize()
        for p in self._ptrs:
            self.device.free(p)
        self._ptrs.clear()


def time_kernel(kernel, bufs: BenchBuffers, stream: int, repeats: int = 7) -> float:
    """µs per call: graph replay of one launch per weight copy (back to back, as a decode chain
    launches them), median of `repeats`."""
    dev = bufs.device

    def run_all():
        for wp, sp, zp in bufs.sets:
            kernel(bufs.x, wp, sp, zp, bufs.y, stream)

    run_all()  # warm-up: module load, first-touch
    dev.synchronize(stream)
    graph = dev.capture_graph(run_all, stream)
    try:
        dev.replay(graph, stream)
        return 1e3 * dev.time_ms(lambda: dev.replay(graph, stream), repeats, stream) / len(bufs.sets)
    finally:
        dev.destroy_graph(graph)


def measure(device, specs: list[KernelSpec], repeats: int = 7) -> dict[KernelSpec, float | None]:
    """{spec: µs or None (failed)} for specs of one shape, compiled in parallel."""
    if not specs:
        return {}
    shape = specs[0].shape
    t0 = time.perf_counter()
    built = build_all(specs)
    t_compile = time.perf_counter() - t0
    bufs = BenchBuffers(device, shape)
    stream = device.create_stream()
    times = {}
    try:
        for spec in specs:
            if built.get(spec) is None:
                times[spec] = None
                continue
            try:
                times[spec] = time_kernel(load(device, spec), bufs, stream, repeats)
            except (Int4JitError, ValueError) as e:
                trace("candidate %s for %s failed to run: %s", spec.label(), shape.key(), e)
                times[spec] = None
    finally:
        device.synchronize(stream)
        device.destroy_stream(stream)
        bufs.free()
    trace("measured %s: %d candidates, compile %.2f s, benchmark %.2f s (%d weight copies)",
          shape.key(), len(specs), t_compile, time.perf_counter() - t0 - t_compile, bufs.copies)
    return times
