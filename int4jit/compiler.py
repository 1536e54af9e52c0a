"""Render the HIP-dialect template for one (shape, config, arch) and compile it once:
hiprtc for gfx*, NVRTC for sm_*. Code objects are cached on disk, content-addressed."""
from __future__ import annotations

import functools
import json
import string
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import backends, cache
from ._version import __version__
from .env import env_choice
from .shapes import GemvShape, LaunchConfig
from .trace import trace

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE_CLASSIC = "gemv.hip"
TEMPLATE_MMA = "gemv_mma.hip"
TEMPLATE_TC = "gemv_tc.hip"
CACHE_SCHEMA = 1
COMPILE_OPTIONS = {"cuda": ("-default-device",), "hip": ("-O3",)}


@functools.lru_cache(maxsize=None)
def _read_template(name: str) -> str:
    return (TEMPLATES / name).read_text()


@functools.lru_cache(maxsize=None)
def template_hash() -> str:
    """Hash of the kernel templates and both preludes: tuning results are valid for it only."""
    parts = [_read_template(n) for n in (TEMPLATE_CLASSIC, TEMPLATE_MMA, TEMPLATE_TC, "prelude_cuda.hip", "prelude_hip.hip")]
    return cache.sha256("\0".join(parts).encode())[:16]


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class KernelGeometry:
    """What a (shape, config, target) triple means for the kernel: derived, never tuned directly.
    The last five fields are what the heuristic needs, whichever template runs."""
    template: str                 # gemv.hip (any target) or gemv_mma.hip (NVIDIA tensor cores)
    params: tuple                 # (name, value) template parameters beyond the shape
    rows_per_block: int
    grid: int                     # row blocks; a persistent kernel is launched on fewer
    block: int
    persistent: bool              # grid-stride over row blocks (launch.py sizes the grid)
    k_efficiency: float           # busy fraction of the lanes along K
    inflight_bytes: int           # weight bytes one thread has in flight
    thread_bytes: int             # weight bytes one thread reads per row block
    rows_per_thread: int
    regs: int                     # registers per thread, estimated

    def param(self, name: str) -> int:
        return dict(self.params)[name]


# Shared memory the tensor-core kernel stages x in: 64 bytes per 32-element chunk (x paired and
# split into low/high halves), sums of 8 bytes per segment, a zero block; 48 KB is the static limit.
MMA_SMEM_LIMIT = 48 << 10


def mma_smem_bytes(shape: GemvShape, warps: int) -> int:
    pad_chunks = 4 * -(-shape.K // 128)
    segs = 2 if shape.group == 16 else 1
    return 64 * pad_chunks + 8 * segs * pad_chunks + 32 + 4 * 16 * 8 * warps


KERNEL_CHOICES = ("auto", "tc", "mma", "simt")


# Below this many rows the tensor-core kernel (16 rows a warp) leaves multiprocessors idle and
# gemv.hip (rows split over fewer threads) wins: measured on the H200, bench/NOTES.md.
TC_MIN_ROWS = 2048


def template_for(shape: GemvShape, arch: str) -> str:
    """Which kernel template serves (shape, arch): gemv_tc.hip where the target has the
    m16n8k16 tensor-core step, K is whole 16-byte loads and N >= TC_MIN_ROWS; gemv.hip
    everywhere else. INT4JIT_KERNEL=simt|mma|tc asks for one (a template that cannot serve
    falls back, traced)."""
    choice = env_choice("INT4JIT_KERNEL", KERNEL_CHOICES) or "auto"
    if choice == "simt":
        return TEMPLATE_CLASSIC
    traits = backends.module_for_arch(arch).kernel_traits(arch)
    tensor_cores = bool(traits.get("TENSOR_CORES")) and shape.K % 32 == 0
    if choice == "mma":
        if tensor_cores and mma_smem_bytes(shape, 16) <= MMA_SMEM_LIMIT:
            return TEMPLATE_MMA
    elif choice == "tc" and tensor_cores:
        return TEMPLATE_TC
    elif choice == "auto":
        return TEMPLATE_TC if tensor_cores and shape.N >= TC_MIN_ROWS else TEMPLATE_CLASSIC
    trace("INT4JIT_KERNEL=%s: %s on %s cannot use that kernel; gemv.hip serves it", choice, shape.key(), arch)
    return TEMPLATE_CLASSIC


def _classic_geometry(shape: GemvShape, cfg: LaunchConfig, unroll_cap: int = 8) -> KernelGeometry:
    """gemv.hip: KT threads along K; each thread keeps at most `unroll_cap` weight loads
    (TN rows x UNROLL steps) in flight."""
    vec = 16 if shape.K % 32 == 0 else 8
    chunks = shape.K // (2 * vec)
    kt = min(cfg.BS, _next_pow2(chunks))
    iters = -(-chunks // kt)
    unroll = max(1, min(iters, unroll_cap // cfg.TN))
    rows_per_block = (cfg.BS // kt) * cfg.TN
    return KernelGeometry(
        TEMPLATE_CLASSIC, (("KT", kt), ("VEC", vec), ("UNROLL", unroll)), rows_per_block,
        -(-shape.N // rows_per_block), cfg.BS, False, chunks / (kt * iters),
        cfg.TN * unroll * vec, cfg.TN * iters * vec, cfg.TN,
        40 + cfg.TN * unroll * (vec // 4 + 8) + 4 * unroll + 2 * cfg.TN)


# Warps a launch should spread over (a few per scheduler on a big GPU): below it, the
# tensor-core kernel splits K across more warps of a block.
MMA_TARGET_WARPS = 4096


def _mma_geometry(shape: GemvShape, cfg: LaunchConfig) -> KernelGeometry:
    """(BS, TN) on the tensor-core kernel: BS/32 warps; a lane streams TN rows (TN/2 tiles of
    16 rows per warp). The warps of a block split K (KSPLIT, a power of two, at most one per
    step) until the launch has MMA_TARGET_WARPS warps: small N gets parallelism along K."""
    warps = cfg.BS // 32
    tw = cfg.TN // 2
    steps = -(-shape.K // 128)
    tiles = -(-shape.N // (16 * tw))
    ksplit = 1
    while 2 * ksplit <= min(warps, steps) and tiles * ksplit < MMA_TARGET_WARPS:
        ksplit *= 2
    per_warp = -(-steps // ksplit)
    unroll = max(1, min(4 // tw, per_warp))
    rows_per_block = (warps // ksplit) * 16 * tw
    k_eff = (shape.K // 32) / (4 * ksplit * per_warp)
    return KernelGeometry(
        TEMPLATE_MMA, (("WARPS", warps), ("KSPLIT", ksplit), ("TW", tw), ("UNROLL", unroll)), rows_per_block,
        -(-shape.N // rows_per_block), cfg.BS, True, k_eff, cfg.TN * unroll * 16, cfg.TN * per_warp * 16, cfg.TN,
        56 + 8 * tw * unroll + 4 * tw)


# Weight loads (16 bytes each) one thread of the tensor-core kernel keeps in flight.
TC_LOADS_IN_FLIGHT = 4
# Static shared memory a block may declare.
STATIC_SMEM_LIMIT = 48 << 10


# Where gemv_tc.hip streams (ROLL: each load slot refilled right after use, one issue fence per
# slot; XSMEM: x staged in shared memory; L2HINT: 256-byte L2 fetches): groups of 128 and more,
# K of 4096 or more (a warp then has steps enough to overlap; at K = 2048 it measured within
# +-5%) and weights of 24 Mi elements or more. Measured on the H200 (bench/NOTES.md, sessions
# 4 and 5): 3-12% faster there, 2-11% slower on smaller shapes and on g < 128.
TC_STREAM_MIN_WEIGHTS = 24 << 20
TC_STREAM_MIN_K = 4096


# RAW_A (A = raw 1024 + q / 64 + q, the offsets from one extra mma per step, shared by the warp's
# tiles) with x staged pre-paired (XPERM), on streamed builds with at least this many 16-row tiles
# a warp: measured on the H200 (bench/results/tc-ab-session6-raw-): 28672x4096 (128,4) 18.50 ->
# 17.55 us, 128256x4096 70.86 -> 68.72; with one tile a warp the offsets cost more than the
# subtractions they replace (4096x14336 (512,2) 12.34 -> 12.68), and on g < 128 it lost 10-20%.
TC_RAW_MIN_TILES = 2


def tc_streams(shape: GemvShape) -> bool:
    return shape.group >= 128 and shape.K >= TC_STREAM_MIN_K and shape.N * shape.K >= TC_STREAM_MIN_WEIGHTS


def _tc_geometry(shape: GemvShape, cfg: LaunchConfig, loads_in_flight: int = TC_LOADS_IN_FLIGHT,
                 contiguous: bool | None = None, stream: bool | None = None, raw_a: bool | None = None,
                 xperm: bool | None = None, xwarp: bool | None = None, wide_scales: bool = True,
                 l2hint: bool | None = None, kcluster: int = 1, min_blocks: int = 0,
                 one_wave_sms: int = 0) -> KernelGeometry:
    """(BS, TN) on gemv_tc.hip: a lane streams TN rows (TN/2 tiles of 16 rows per warp); the
    BS/32 warps of a block split K in steps of 128 elements (no more warps than steps).
    Groups under 128 (per-chunk scales) walk K in contiguous ranges per warp, larger groups
    interleave the warps' steps; large g >= 128 shapes stream (tc_streams). Each choice was
    measured faster on the H200 (bench/NOTES.md). kcluster > 1 (sm_90, opt-in): clusters of
    that many blocks split each row block's K (kcluster times the grid, the block sums added in
    block 0's shared memory); it falls back to 1 where K has fewer steps than that. min_blocks
    (opt-in) caps registers so that many blocks fit a SM; one_wave_sms=S asks for as many as a
    one-wave grid on S multiprocessors needs (at most 32)."""
    if contiguous is None:
        contiguous = shape.group < 128
    if stream is None:
        stream = tc_streams(shape)
    tw = cfg.TN // 2
    if raw_a is None:
        raw_a = stream and tw >= TC_RAW_MIN_TILES
    if xwarp is None:
        xwarp = stream and not raw_a
    if xperm is None:
        xperm = raw_a or xwarp
    if l2hint is None:
        l2hint = stream
    if xwarp and not (xperm and stream):
        raise ValueError("xwarp stages x paired (xperm) and only on streamed builds")
    steps = -(-shape.K // 128)
    kc = kcluster if steps >= kcluster else 1
    ksplit = min(cfg.BS // 32, steps // kc)
    per_warp = -(-steps // (ksplit * kc))
    unroll = max(1, min(loads_in_flight // (2 * tw), per_warp))
    rows_per_block = 16 * tw
    # x in shared memory where it fits the static limit beside the K-split partial sums.
    xsmem = stream and 2 * shape.K + 4 * (ksplit + (kc if kc > 1 else 0)) * rows_per_block <= STATIC_SMEM_LIMIT
    grid = kc * -(-shape.N // rows_per_block)
    if one_wave_sms and -(-grid // one_wave_sms) <= 32:
        min_blocks = -(-grid // one_wave_sms)
    flag = lambda b: "true" if b else "false"
    return KernelGeometry(
        TEMPLATE_TC, (("KSPLIT", ksplit), ("TW", tw), ("UNROLL", unroll), ("CONTIG", flag(contiguous)),
                      ("ROLL", flag(stream)), ("XSMEM", flag(xsmem)), ("L2HINT", int(l2hint)),
                      ("RAW_A", flag(raw_a)), ("XPERM", flag(xperm)), ("XWARP", flag(xwarp)),
                      ("WIDE_SCALES", flag(wide_scales)), ("KCLUSTER", kc), ("MIN_BLOCKS", min_blocks)),
        rows_per_block,
        grid, 32 * ksplit, False, (shape.K // 32) / (4 * ksplit * kc * per_warp),
        cfg.TN * unroll * 16, cfg.TN * per_warp * 16, cfg.TN, 48 + cfg.TN * unroll * 6 + 4 * tw)


def kernel_geometry(shape: GemvShape, cfg: LaunchConfig, arch: str) -> KernelGeometry:
    template = template_for(shape, arch)
    if template == TEMPLATE_TC:
        return _tc_geometry(shape, cfg)
    if template == TEMPLATE_MMA:
        return _mma_geometry(shape, cfg)
    return _classic_geometry(shape, cfg)


def kernel_name(shape: GemvShape, cfg: LaunchConfig) -> str:
    sym = "s" if shape.symmetric else "a"
    return f"int4jit_gemv_n{shape.N}_k{shape.K}_g{shape.group}{sym}_bs{cfg.BS}_tn{cfg.TN}"


def render_gemv_source(shape: GemvShape, cfg: LaunchConfig, arch: str) -> tuple[str, str]:
    """(source name, HIP-dialect source) specialised for one shape, config and target."""
    mod = backends.module_for_arch(arch)
    traits = mod.kernel_traits(arch)
    geo = kernel_geometry(shape, cfg, arch)
    params = {
        "N": shape.N, "K": shape.K, "GROUP": shape.group,
        "SYMMETRIC": "true" if shape.symmetric else "false",
        "BS": cfg.BS, "TN": cfg.TN, **dict(geo.params),
        "KERNEL_NAME": kernel_name(shape, cfg), **traits,
    }
    prelude = string.Template(_read_template(mod.PRELUDE)).substitute(params)
    body = string.Template(_read_template(geo.template)).substitute(params)
    name = f"{kernel_name(shape, cfg)}_{mod.parse_arch(arch)}.hip"
    return name, f"// {name}: generated by int4jit {__version__}\n{prelude}\n{body}"


@dataclass(frozen=True)
class CompiledKernel:
    kernel: str
    binary: bytes
    arch: str
    backend: str
    geometry: KernelGeometry
    key: str


def cache_key(source: str, arch: str, backend: str, options, compiler_version: str) -> str:
    record = {"schema": CACHE_SCHEMA, "int4jit": __version__, "backend": backend, "arch": arch,
              "compiler": compiler_version, "options": sorted(options), "source": cache.sha256(source.encode())}
    return cache.sha256(json.dumps(record, sort_keys=True).encode())


def code_object_path(key: str) -> Path:
    return cache.code_dir() / key[:2] / f"{key}.bin"


_memo: dict[tuple, CompiledKernel] = {}
_memo_lock = threading.Lock()


def compile_gemv(shape: GemvShape, cfg: LaunchConfig, arch: str) -> CompiledKernel:
    """The compiled kernel for (shape, cfg, arch), from memory, disk, or the compiler."""
    memo_key = (shape, cfg, arch, template_for(shape, arch))
    hit = _memo.get(memo_key)
    if hit is not None:
        return hit
    mod = backends.module_for_arch(arch)
    arch = mod.parse_arch(arch)
    name, source = render_gemv_source(shape, cfg, arch)
    options = COMPILE_OPTIONS[mod.NAME]
    key = cache_key(source, arch, mod.NAME, options, mod.compiler_version())
    path = code_object_path(key)
    binary = cache.read_code_object(path)
    if binary is not None:
        trace("code cache hit %s for %s %s (%s)", key[:12], shape.key(), cfg, arch)
    else:
        t0 = time.perf_counter()
        binary = mod.compile_source(source, name, arch, options)
        trace("code cache miss %s: compiled %s for %s in %.0f ms", key[:12], name, arch,
              1e3 * (time.perf_counter() - t0))
        cache.write_code_object(path, binary)
    compiled = CompiledKernel(kernel_name(shape, cfg), binary, arch, mod.NAME, kernel_geometry(shape, cfg, arch), key)
    with _memo_lock:
        _memo[memo_key] = compiled
    return compiled


def forget(compiled: CompiledKernel):
    """Drop a kernel whose binary failed to load: its cached file and memo entry go."""
    cache.discard(code_object_path(compiled.key))
    with _memo_lock:
        for k, v in list(_memo.items()):
            if v.key == compiled.key:
                del _memo[k]
