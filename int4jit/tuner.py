"""Pick the launch geometry (BS, TN) for a shape, in four tiers:
  1. INT4JIT_CONFIG / MIGRAPHX_INT4_GEMV_CONFIG override
  2. this machine's tuning DB        3. the shipped table.json
  4. autotune over the grid, heuristic pick first (INT4JIT_TUNE=0: the heuristic alone)
ORT_MIGRAPHX_EXHAUSTIVE_TUNE=1 searches the 20-point grid even where tiers 2-3 have a row."""
from __future__ import annotations

import datetime
import functools
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import compiler
from .backends import module_for_arch
from .cache import warn_write_failure
from .env import env_flag, env_lookup
from .errors import Int4JitError
from .launch import load_kernel
from .reference import random_problem
from .shapes import GemvShape, LaunchConfig, candidate_grid
from .trace import trace
from .tuning_db import TuningDB, TuningRecord

TABLE_PATH = Path(__file__).parent / "table.json"


# -- tier 1: the override ---------------------------------------------------------------
def _parse_config(text: str, var: str, token: str) -> LaunchConfig:
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError("expected two numbers")
        return LaunchConfig(int(parts[0]), int(parts[1]))
    except ValueError as e:
        raise ValueError(f"{var}: bad entry {token!r} ({e}); expected 'BS,TN' with BS in "
                         f"32/64/128/256/512 and TN in 2/4/8/16, e.g. '256,4'") from None


def parse_override(value: str, var: str = "INT4JIT_CONFIG"):
    """'BS,TN' -> LaunchConfig; 'N:K=BS,TN;...;*=BS,TN' -> {(N, K) or '*': LaunchConfig}."""
    value = value.strip()
    if "=" not in value:
        return _parse_config(value, var, value)
    table = {}
    for token in value.split(";"):
        token = token.strip()
        if not token:
            continue
        lhs, sep, rhs = token.partition("=")
        if not sep:
            raise ValueError(f"{var}: bad entry {token!r}: expected 'N:K=BS,TN' or '*=BS,TN'")
        lhs = lhs.strip()
        if lhs == "*":
            key = "*"
        else:
            n, colon, k = lhs.partition(":")
            if not colon or not n.strip().isdigit() or not k.strip().isdigit():
                raise ValueError(f"{var}: bad shape {lhs!r} in {token!r}: expected 'N:K' (two integers) or '*'")
            key = (int(n), int(k))
        table[key] = _parse_config(rhs.strip(), var, token)
    return table


def override_for(shape: GemvShape):
    """(config, reason) from the override variable, or None when it does not decide."""
    found = env_lookup("INT4JIT_CONFIG")
    if found is None or not found[1].strip():
        return None
    var, value = found
    parsed = parse_override(value, var)
    if isinstance(parsed, LaunchConfig):
        return parsed, f"{var} (global)"
    hit = parsed.get((shape.N, shape.K))
    if hit is not None:
        return hit, f"{var} entry {shape.N}:{shape.K}"
    if "*" in parsed:
        return parsed["*"], f"{var} entry *"
    return None


# -- tier 3: the shipped table ----------------------------------------------------------
@functools.lru_cache(maxsize=None)
def shipped_table(path: Path = TABLE_PATH) -> dict:
    return json.loads(path.read_text())


def table_entry(shape: GemvShape, arch: str):
    row = shipped_table().get(arch, {}).get(shape.key())
    return None if row is None else LaunchConfig(*row["config"])


# -- the heuristic ----------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceModel:
    """What the heuristic knows of a GPU."""
    sm_count: int
    max_threads_per_sm: int
    regs_per_sm: int
    warp: int
    max_blocks_per_sm: int = 32
    # Weight bytes a multiprocessor wants in flight before bandwidth stops growing.
    # Little's law with the unloaded latency gives ~36 KB on an H200; fitted to the
    # measured sm_90 suite (bench/results/tuning-sm_90-*.json) the knee sits near 320 KB,
    # loaded HBM latency being far above the unloaded one.
    inflight_bytes: int = 320 << 10
    # Per-row fixed cost (reduction, store, row setup) in weight-byte equivalents, fitted alike.
    row_cost_bytes: int = 256


_KNOWN = {"sm_90": (132, 2048), "sm_80": (108, 2048), "sm_89": (128, 1536), "sm_86": (84, 1536),
          "gfx90a": (110, 2048), "gfx942": (304, 2048), "gfx908": (120, 2560), "gfx1030": (40, 2048),
          "gfx1100": (48, 2048), "gfx1151": (40, 2048)}


def device_model(arch: str, device=None) -> DeviceModel:
    if device is not None:
        return DeviceModel(device.sm_count, device.max_threads_per_sm, device.regs_per_sm, device.warp_size)
    sms, threads = _KNOWN.get(arch, (64, 2048))
    warp = 32 if arch.startswith("sm_") or not arch.startswith("gfx9") else 64
    return DeviceModel(sms, threads, 65536, warp)


def estimate_efficiency(shape: GemvShape, cfg: LaunchConfig, model: DeviceModel, arch: str) -> float:
    """Modelled fraction of peak bandwidth a config reaches: idle K lanes, padded rows,
    the last partial wave, bytes in flight per SM, and per-thread fixed cost."""
    geo = compiler.kernel_geometry(shape, cfg, arch)
    row_eff = shape.N / (geo.grid * geo.rows_per_block)
    per_sm = max(1, min(model.max_threads_per_sm // cfg.BS, model.max_blocks_per_sm,
                        model.regs_per_sm // (max(geo.regs, 32) * cfg.BS)))
    resident = min(per_sm, math.ceil(geo.grid / model.sm_count))
    waves = geo.grid / (per_sm * model.sm_count)
    wave_eff = waves / math.ceil(waves)
    inflight = resident * cfg.BS * geo.k_efficiency * geo.inflight_bytes
    mem_eff = min(1.0, inflight / model.inflight_bytes)
    fixed = model.row_cost_bytes * geo.rows_per_thread
    return geo.k_efficiency * row_eff * wave_eff * mem_eff * geo.thread_bytes / (geo.thread_bytes + fixed)


def heuristic(shape: GemvShape, arch: str, device=None, exhaustive: bool = False) -> LaunchConfig:
    """The modelled best config of the grid that will be searched."""
    model = device_model(arch, device)
    grid = candidate_grid(exhaustive)
    return max(grid, key=lambda c: (round(estimate_efficiency(shape, c, model, arch), 3), -c.TN, c.BS))


# -- selection --------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    config: LaunchConfig
    tier: str      # override | db | table | tuned | heuristic
    reason: str


def exhaustive_enabled(exhaustive: bool | None = None) -> bool:
    return env_flag("INT4JIT_EXHAUSTIVE_TUNE") if exhaustive is None else exhaustive


def select_config(shape: GemvShape, arch: str, device=None, exhaustive: bool | None = None,
                  tune: bool | None = None) -> Selection:
    """Walk the four tiers. Without a device (compile-only), tier 4 is the heuristic."""
    sel = _select(shape, arch, device, exhaustive, tune)
    trace("%s on %s: %s from tier %s (%s)", shape.key(), arch, sel.config, sel.tier, sel.reason)
    return sel


def _select(shape, arch, device, exhaustive, tune) -> Selection:
    hit = override_for(shape)
    if hit is not None:
        return Selection(hit[0], "override", hit[1])
    exhaustive = exhaustive_enabled(exhaustive)
    template = compiler.template_hash()
    db = TuningDB(arch)
    rec = db.get(shape, template)
    if rec is not None and (not exhaustive or rec.exhaustive):
        return Selection(rec.config, "db", f"tuned here {rec.date}, {rec.us:.2f} us")
    if not exhaustive:
        cfg = table_entry(shape, arch)
        if cfg is not None:
            return Selection(cfg, "table", f"shipped table.json row for {arch}")
    tune = env_flag("INT4JIT_TUNE", True) if tune is None else tune
    if device is None or not tune:
        why = "INT4JIT_TUNE=0" if device is not None else "no device to benchmark on"
        return Selection(heuristic(shape, arch, device, exhaustive), "heuristic", why)
    rec = autotune(shape, device, exhaustive=exhaustive)
    try:
        db.put(shape, rec)
    except (OSError, TimeoutError) as e:  # filelock's Timeout is a TimeoutError
        warn_write_failure(db.path, e)
    return Selection(rec.config, "tuned", f"benchmarked {len(rec.candidates)} candidates, {rec.us:.2f} us")


# -- tier 4: benchmarking ---------------------------------------------------------------
def _compile_all(shape, configs, arch):
    """Compile candidates in parallel; a failure is traced and drops that candidate."""
    def one(cfg):
        try:
            return cfg, compiler.compile_gemv(shape, cfg, arch)
        except Int4JitError as e:
            trace("candidate %s for %s failed to compile: %s", cfg, shape.key(), str(e).splitlines()[0])
            return cfg, None
    with ThreadPoolExecutor(max_workers=min(8, len(configs))) as pool:
        return dict(pool.map(one, configs))


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
        self.y = device.alloc(2 * shape.N)
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
    """µs per call: graph replay of one launch per weight copy, median of `repeats`."""
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


def benchmark(shape: GemvShape, device, configs, repeats: int = 7) -> dict:
    """{config: µs or None (failed)} for every config, compiled in parallel."""
    t0 = time.perf_counter()
    compiled = _compile_all(shape, configs, device.arch)
    t_compile = time.perf_counter() - t0
    bufs = BenchBuffers(device, shape)
    stream = device.create_stream()
    times = {}
    try:
        for cfg in configs:
            if compiled.get(cfg) is None:
                times[cfg] = None
                continue
            try:
                times[cfg] = time_kernel(load_kernel(device, shape, cfg), bufs, stream, repeats)
            except (Int4JitError, ValueError) as e:
                trace("candidate %s for %s failed to run: %s", cfg, shape.key(), e)
                times[cfg] = None
    finally:
        device.synchronize(stream)
        device.destroy_stream(stream)
        bufs.free()
    trace("tuned %s over %d candidates: compile %.2f s, benchmark %.2f s (%d weight copies)",
          shape.key(), len(configs), t_compile, time.perf_counter() - t0 - t_compile, bufs.copies)
    return times


def autotune(shape: GemvShape, device, exhaustive: bool = False) -> TuningRecord:
    """Benchmark the grid (heuristic pick first) and return the winner's record."""
    first = heuristic(shape, device.arch, device, exhaustive)
    configs = [first] + [c for c in candidate_grid(exhaustive) if c != first]
    times = benchmark(shape, device, configs)
    ok = {c: t for c, t in times.items() if t is not None}
    if not ok:
        raise Int4JitError(f"autotune for {shape.key()} on {device.arch}: every candidate failed "
                           f"(set INT4JIT_TRACE=1 to see why)")
    best = min(ok, key=ok.get)
    return TuningRecord(best.BS, best.TN, ok[best], {str(c): t for c, t in times.items()},
                        compiler.template_hash(), device.name, module_for_arch(device.arch).compiler_version(),
                        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), exhaustive)
