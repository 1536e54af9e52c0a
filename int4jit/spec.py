"""What one kernel launch is, as one frozen value: the KernelSpec.

A spec names the kernel (`simt`: templates/gemv.hip, any target, one token in fp16 or bf16; `tc`:
templates/gemv_tc.hip, NVIDIA tensor cores, 1..8 tokens in fp16 or bf16; `tc_batch`:
templates/gemv_tc_batch.hip, 9..16 tokens), its launch geometry (BS, TN), its variant record
(the tc kernel's searchable knobs), and everything derived from them: template parameters,
grid, block, whether the launch uses programmatic dependent launch (pdl). Rendering, compiling, loading, launching
and every cache key read the spec; nothing is derived twice. Pure functions, no I/O.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from .shapes import GemvShape, LaunchConfig

TEMPLATES = Path(__file__).parent / "templates"
KERNELS = ("simt", "tc", "tc_batch")   # the GEMV kernels
TEMPLATE_OF = {"simt": "gemv.hip", "tc": "gemv_tc.hip", "tc_batch": "gemv_tc_batch.hip", "dequant": "dequant.hip",
               "gemm": "gemm_sm90.hip", "xperm": "xperm.hip"}
PRELUDES = ("prelude_cuda.hip", "prelude_hip.hip")
SPEC_SCHEMA = 2


@functools.lru_cache(maxsize=None)
def read_template(name: str) -> str:
    return (TEMPLATES / name).read_text()


@functools.lru_cache(maxsize=None)
def template_hash(kernel: str) -> str:
    """Hash of one kernel's template and both preludes: tuning results are valid for it only."""
    text = "\0".join(read_template(n) for n in (TEMPLATE_OF[kernel], *PRELUDES))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- the variant record ---------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Variant:
    """The tc kernel's knobs beyond (BS, TN); searched by the tuner, named by the override
    (e.g. INT4JIT_CONFIG="128,4,streaming=1,kcluster=2"). docs/performance.md has the measurements.

    streaming  each load slot refilled as soon as it is used, x staged in shared memory, 256-byte
               L2 fetches (large g >= 128 shapes: 3-12% faster on the H200)
    raw_a      A = raw (1024 + q) pairs, offsets removed after the mma (streaming, >= 2 tiles a warp)
    kcluster   blocks of a sm_90 cluster splitting one row block's K (1, 2 or 4; K-long g32 tails,
               several tokens on shapes of few row blocks: searched by default there)
    one_wave   registers capped so a one-wave grid fits (a few g32 shapes)
    loads      16-byte weight loads a lane keeps in flight (4 or 8)
    prefetch   batches of weights asked into L2 before waiting for the previous kernel (0-2)
    early      PDL chains: the next kernel may launch at this one's start, and the first batch of
               weights is loaded before waiting for the previous kernel (x after it); implies
               streaming. Only for fixed weights (GemvWeights, Int4Linear): the tuner measures
               the pick against its early twin (tuner.early_twin), or applies a measured rule
               where it measures nothing; an override may name it.
    xahead     several tokens: x of a warp's next step loaded while this one computes (H200, M=8
               g128, tuned: the pick at 16384x2048 bf16, 9.07 -> 8.53 us; not on 11 other tunes)
    """
    streaming: bool = False
    raw_a: bool = False
    kcluster: int = 1
    one_wave: bool = False
    loads: int = 4
    prefetch: int = 0
    early: bool = False
    xahead: bool = False

    def text(self, base: "Variant | None" = None) -> str:
        """Only the fields that differ from `base` (the defaults): 'streaming=1,kcluster=2'."""
        base = base or Variant()
        return ",".join(f"{f.name}={int(getattr(self, f.name))}" for f in fields(self)
                        if getattr(self, f.name) != getattr(base, f.name))

    def as_dict(self) -> dict:
        return asdict(self)


VARIANT_RANGES = {"streaming": (0, 1), "raw_a": (0, 1), "kcluster": (1, 2, 4), "one_wave": (0, 1),
                  "loads": (4, 8), "prefetch": (0, 1, 2), "early": (0, 1),
                  "xahead": (0, 1)}
SIMT_VARIANT = Variant(prefetch=0)


def variant_from(values: dict, where: str) -> Variant:
    """A Variant from {name: int}; unknown names and values outside VARIANT_RANGES are errors
    naming `where` (the variable or record they came from)."""
    known = {f.name: f.type for f in fields(Variant)}
    kw = {}
    for name, value in values.items():
        if name not in known:
            raise ValueError(f"{where}: unknown variant field {name!r}; expected one of {', '.join(known)}")
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int) or value not in VARIANT_RANGES[name]:
            raise ValueError(f"{where}: {name}={value!r} is not one of {VARIANT_RANGES[name]}")
        kw[name] = bool(value) if known[name] == "bool" else value
    return Variant(**kw)


# -- the spec -------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelSpec:
    """One kernel build and launch. Frozen: a key in every memo and cache."""
    shape: GemvShape
    arch: str                # parsed target: 'sm_90', 'gfx90a'
    kernel: str              # simt | tc
    config: LaunchConfig     # (BS, TN)
    variant: Variant
    params: tuple            # (name, value) template parameters beyond the shape
    grid: int
    block: int
    pdl: bool                # launched with programmatic dependent launch (sm_90)
    # What the heuristic models (derived; part of the value so it is computed once):
    rows_per_block: int = field(compare=False)
    k_efficiency: float = field(compare=False)    # busy fraction of the lanes along K
    inflight_bytes: int = field(compare=False)    # weight bytes one thread has in flight
    thread_bytes: int = field(compare=False)      # weight bytes one thread reads per row block
    regs: int = field(compare=False)              # registers per thread, estimated
    smem: int = 0            # dynamic shared memory a block, bytes (the gemm kernel's ring)

    @property
    def template(self) -> str:
        return TEMPLATE_OF[self.kernel]

    @property
    def name(self) -> str:
        """The kernel's symbol (the code cache key tells builds apart, not the name)."""
        s = self.shape
        sym = "s" if s.symmetric else "a"
        geometry = f"bs{self.block}" if self.kernel == "gemm" else f"bs{self.config.BS}_tn{self.config.TN}"
        return f"int4jit_{self.kernel}_n{s.N}_k{s.K}_g{s.group}{sym}_{geometry}"

    def canonical(self) -> dict:
        """Everything that makes this build and launch, as plain JSON values."""
        record = {"schema": SPEC_SCHEMA, "shape": asdict(self.shape), "arch": self.arch, "kernel": self.kernel,
                  "config": [self.config.BS, self.config.TN], "variant": self.variant.as_dict(),
                  "params": [list(p) for p in self.params], "grid": self.grid, "block": self.block,
                  "pdl": self.pdl, "template": template_hash(self.kernel)}
        if self.smem:
            record["smem"] = self.smem
        return record

    @functools.cached_property
    def _key(self) -> str:
        return hashlib.sha256(json.dumps(self.canonical(), sort_keys=True).encode()).hexdigest()

    def key(self) -> str:
        return self._key

    def label(self) -> str:
        """'128,4' or '128,4,streaming=1': the override syntax, and the tuner's candidate name."""
        v = self.variant.text() if self.kernel in ("tc", "tc_batch") else ""
        return f"{self.config}" + (f",{v}" if v else "")

    def param(self, name: str):
        return dict(self.params)[name]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# -- which kernel ---------------------------------------------------------------------------
# Below this many rows the tc kernel (16 rows a warp) leaves multiprocessors idle and gemv.hip
# (rows split over fewer threads) wins on the H200 (docs/performance.md).
TC_MIN_ROWS = 2048


# Tokens the tc kernel serves in one launch: its D columns are the tokens (one mma column block).
TC_MAX_TOKENS = 8


def tc_possible(shape: GemvShape, tensor_cores: bool) -> bool:
    return tensor_cores and shape.K % 32 == 0


def choose_kernel(shape: GemvShape, tensor_cores: bool, requested: str = "auto") -> str:
    """One token (fp16 or bf16): `tc` where the target has the m16n8k16 step, K is whole 16-byte
    loads and N is large enough; `simt` elsewhere. requested='simt'|'tc' asks for one (tc where it
    cannot serve is a ValueError: nothing falls back silently). Several tokens need the
    tensor-core step (NotImplementedError elsewhere, AMD included): `tc` up to TC_MAX_TOKENS,
    `tc_batch` beyond."""
    if shape.M > 1:
        if not tc_possible(shape, tensor_cores):
            raise NotImplementedError(
                f"{shape.key()}: several tokens run on the tensor-core kernels, which need an NVIDIA "
                f"sm_80+ target and K % 32 == 0 (one token runs everywhere)")
        return "tc" if shape.M <= TC_MAX_TOKENS else "tc_batch"
    if requested == "simt":
        return "simt"
    if requested == "tc":
        if not tc_possible(shape, tensor_cores):
            raise ValueError(f"INT4JIT_KERNEL=tc: {shape.key()} cannot use the tc kernel "
                             f"(it needs an NVIDIA sm_80+ target and K % 32 == 0)")
        return "tc"
    return "tc" if tc_possible(shape, tensor_cores) and shape.N >= TC_MIN_ROWS else "simt"


# -- variants -------------------------------------------------------------------------------
# Where the tc kernel streams by default: groups of 128 and more at K of 2048 or more (H200, session 12:
# streaming won on 16 of 16 g128 tc shapes of 5.8-272 MB at K 2048-18944; 9728x896 was 11% slower).
TC_STREAM_MIN_K = 2048
# raw_a pays with at least this many 16-row tiles a warp (28672x4096 (128,4) 18.50 -> 17.55 us), on the
# shapes it was measured on: K of 4096 or more and weights of 24 Mi elements or more.
TC_RAW_MIN_TILES = 2
TC_RAW_MIN_K = 4096
TC_RAW_MIN_WEIGHTS = 24 << 20


def default_variant(shape: GemvShape, kernel: str, config: LaunchConfig) -> Variant:
    """The variant a (shape, config) gets without tuning: the measured rules."""
    if kernel != "tc":
        return SIMT_VARIANT
    streaming = shape.group >= 128 and shape.K >= TC_STREAM_MIN_K
    raw_a = (streaming and config.TN // 2 >= TC_RAW_MIN_TILES and shape.K >= TC_RAW_MIN_K
             and shape.N * shape.K >= TC_RAW_MIN_WEIGHTS)
    return Variant(streaming=streaming, raw_a=raw_a)


def schedules(shape: GemvShape, kernel: str, config: LaunchConfig, arch: str, pdl: bool = True) -> list[Variant]:
    """The tc kernel's two schedules at one (BS, TN): the default variant, and the same with
    streaming flipped (the tuner's first stage measures the grid under both: which one wins moves
    with N, K and the group, and a size rule misplaced it on 6 of 20 validation shapes)."""
    base = default_variant(shape, kernel, config)
    if kernel != "tc":
        return [base]
    out = [normalise_variant(shape, config, arch, v, pdl)
           for v in (base, replace(base, streaming=not base.streaming, raw_a=False))]
    return list(dict.fromkeys(out))


def variant_space(shape: GemvShape, kernel: str, config: LaunchConfig, arch: str,
                  exhaustive: bool = False, pdl: bool = True, base: Variant | None = None) -> list[Variant]:
    """The variants the tuner measures at one (BS, TN) around `base` (the default variant when
    None), base first. The default search flips one field at a time (streaming, one_wave, loads,
    prefetch, and with several tokens xahead and kcluster); exhaustive adds kcluster 2 and 4
    (sm_90) and raw_a combinations."""
    if kernel == "tc_batch":  # its one knob: weight loads in flight a lane
        return [SIMT_VARIANT, replace(SIMT_VARIANT, loads=8)]
    if kernel != "tc":
        return [SIMT_VARIANT]
    base = normalise_variant(shape, config, arch, base or default_variant(shape, kernel, config), pdl)
    out = [base]

    def add(v: Variant):
        v = normalise_variant(shape, config, arch, v, pdl)
        if v not in out:
            out.append(v)

    add(replace(base, streaming=not base.streaming, raw_a=False))
    add(replace(base, one_wave=True))
    add(replace(base, loads=8))
    add(replace(base, prefetch=0 if base.prefetch else 1))
    add(replace(base, xahead=not base.xahead))
    if shape.M > 1:  # several tokens: the cluster K split (stage 1 measures kcluster=2 twins)
        add(replace(base, kcluster=1 if base.kcluster > 1 else 2))
    if exhaustive:
        add(replace(base, prefetch=2))
        if arch_number(arch) >= 90:
            add(replace(base, kcluster=2))
            add(replace(base, kcluster=4))
        if base.streaming:
            add(replace(base, raw_a=not base.raw_a))
    return out


def arch_number(arch: str) -> int:
    return int(arch[3:].rstrip("af")) if arch.startswith("sm_") else 0


def normalise_variant(shape: GemvShape, config: LaunchConfig, arch: str, v: Variant, pdl: bool = True) -> Variant:
    """The variant as it will be built: fields that cannot apply are reset (raw_a needs
    streaming and one token; kcluster needs sm_90 and K of two steps or more;
    prefetch and early need PDL on sm_90; early streams; xahead needs several tokens)."""
    if v.raw_a and (not v.streaming or shape.M > 1):
        v = replace(v, raw_a=False)
    if v.kcluster > 1 and (arch_number(arch) < 90 or _ceil(shape.K, 128) < v.kcluster):
        v = replace(v, kcluster=1)
    if v.prefetch and (arch_number(arch) < 90 or not pdl):
        v = replace(v, prefetch=0)
    if v.early and (arch_number(arch) < 90 or not pdl):
        v = replace(v, early=False)
    if v.early and not v.streaming:
        v = replace(v, streaming=True)
    if v.xahead and shape.M == 1:
        v = replace(v, xahead=False)
    return v


# -- geometry -------------------------------------------------------------------------------
def _cpp(b: bool) -> str:
    return "true" if b else "false"


def _dtype_params(shape: GemvShape) -> tuple:
    """The activation and scale types, as every GEMV template takes them."""
    return ("BF16", _cpp(shape.dtype == "bfloat16")), ("SCALE_BF16", _cpp(shape.scale_dtype == "bfloat16"))


def _simt_spec(shape: GemvShape, arch: str, cfg: LaunchConfig, pdl: bool) -> KernelSpec:
    """gemv.hip: KT threads along K; each keeps at most 8 weight loads (TN rows x UNROLL
    steps) in flight."""
    vec = 16 if shape.K % 32 == 0 else 8
    chunks = shape.K // (2 * vec)
    kt = min(cfg.BS, _next_pow2(chunks))
    iters = _ceil(chunks, kt)
    unroll = max(1, min(iters, 8 // cfg.TN))
    rows_per_block = (cfg.BS // kt) * cfg.TN
    return KernelSpec(
        shape, arch, "simt", cfg, SIMT_VARIANT,
        (("KT", kt), ("VEC", vec), ("UNROLL", unroll), *_dtype_params(shape)),
        _ceil(shape.N, rows_per_block), cfg.BS, pdl,
        rows_per_block=rows_per_block, k_efficiency=chunks / (kt * iters),
        inflight_bytes=cfg.TN * unroll * vec, thread_bytes=cfg.TN * iters * vec,
        regs=40 + cfg.TN * unroll * (vec // 4 + 8) + 4 * unroll + 2 * cfg.TN)


# Static shared memory a block may declare.
STATIC_SMEM_LIMIT = 48 << 10


def _tc_spec(shape: GemvShape, arch: str, cfg: LaunchConfig, v: Variant, pdl: bool, sm_count: int) -> KernelSpec:
    """gemv_tc.hip: a lane streams TN rows (TN/2 tiles of 16 rows a warp); the BS/32 warps of a
    block split K in steps of 128 elements (no more warps than steps, nor than the shared memory
    their M x rows sums need). Groups under 128 walk K in contiguous ranges per warp, larger
    groups interleave the warps' steps."""
    v = normalise_variant(shape, cfg, arch, v, pdl)
    tw = cfg.TN // 2
    steps = _ceil(shape.K, 128)
    kc = v.kcluster
    rows_per_block = 16 * tw
    # Shared memory holds the warps' M x rows sums, and with a cluster block 0 holds each block's.
    sums_room = STATIC_SMEM_LIMIT // (4 * shape.M * rows_per_block) - (kc if kc > 1 else 0)
    ksplit = max(1, min(cfg.BS // 32, steps // kc, sums_room))
    per_warp = _ceil(steps, ksplit * kc)
    unroll = max(1, min(v.loads // (2 * tw), per_warp))
    # x (one token) in shared memory where it fits the static limit beside the K-split partial sums.
    xsmem = v.streaming and shape.M == 1 and 2 * shape.K + 4 * (ksplit + (kc if kc > 1 else 0)) * rows_per_block <= STATIC_SMEM_LIMIT
    grid = kc * _ceil(shape.N, rows_per_block)
    min_blocks = _ceil(grid, sm_count) if v.one_wave and _ceil(grid, sm_count) <= 32 else 0
    params = (("M", shape.M), *_dtype_params(shape),
              ("KSPLIT", ksplit), ("TW", tw), ("UNROLL", unroll), ("CONTIG", _cpp(shape.group < 128)),
              ("STREAMING", _cpp(v.streaming)), ("XSMEM", _cpp(xsmem)), ("RAW_A", _cpp(v.raw_a)),
              ("KCLUSTER", kc), ("PREFETCH", v.prefetch), ("EARLY", _cpp(v.early)), ("XAHEAD", _cpp(v.xahead)),
              ("KERNEL_ATTRS", (f"__cluster_dims__({kc}, 1, 1) " if kc > 1 else "")
               + (f"__launch_bounds__({cfg.BS}, {min_blocks})" if min_blocks else f"__launch_bounds__({cfg.BS})")))
    return KernelSpec(
        shape, arch, "tc", cfg, v, params, grid, 32 * ksplit, pdl,
        rows_per_block=rows_per_block, k_efficiency=(shape.K // 32) / (4 * ksplit * kc * per_warp),
        inflight_bytes=cfg.TN * unroll * 16, thread_bytes=cfg.TN * per_warp * 16,
        # Fitted to NVRTC's sm_90 builds of the grid (rms 13 registers, was 19); __launch_bounds__(BS)
        # caps a thread at 65536 / BS.
        regs=min(40 + 4 * cfg.TN * unroll + 7 * tw * (2 if shape.M > 1 else 1) + 16 * v.xahead, 65536 // cfg.BS))


def _tc_batch_spec(shape: GemvShape, arch: str, cfg: LaunchConfig, pdl: bool, loads: int = 4) -> KernelSpec:
    """gemv_tc_batch.hip (1..16 tokens, fp16 or bf16): TN/2 tiles of 16 rows a warp, the BS/32
    warps of a block split K by steps of 128 (no more warps than steps, nor than the shared memory
    their M x rows sums need)."""
    tw = cfg.TN // 2
    rows_per_block = 16 * tw
    steps = _ceil(shape.K, 128)
    ksplit = max(1, min(cfg.BS // 32, steps, STATIC_SMEM_LIMIT // (4 * shape.M * rows_per_block)))
    per_warp = _ceil(steps, ksplit)
    unroll = max(1, min(loads // (2 * tw), per_warp))
    if unroll == max(1, min(4 // (2 * tw), per_warp)):
        loads = 4  # the same build as the default: one key, measured once
    params = (("M", shape.M), *_dtype_params(shape), ("KSPLIT", ksplit), ("TW", tw),
              ("UNROLL", unroll))
    return KernelSpec(
        shape, arch, "tc_batch", cfg, replace(SIMT_VARIANT, loads=loads), params, _ceil(shape.N, rows_per_block), 32 * ksplit, pdl,
        rows_per_block=rows_per_block, k_efficiency=(shape.K // 32) / (4 * ksplit * per_warp),
        inflight_bytes=cfg.TN * unroll * 16, thread_bytes=cfg.TN * per_warp * 16,
        regs=64 + cfg.TN * unroll * 6 + 8 * tw * _ceil(shape.M, 8))


# (multiprocessors, threads a multiprocessor holds) of known targets, for specs and the heuristic's
# model made without a device (compile-only); unknown targets take DEFAULT_TARGET.
KNOWN_TARGETS = {"sm_90": (132, 2048), "sm_80": (108, 2048), "sm_89": (128, 1536), "sm_86": (84, 1536),
                 "sm_100": (148, 2048), "sm_120": (170, 1536),
                 "gfx90a": (110, 2048), "gfx942": (304, 2048), "gfx908": (120, 2560), "gfx1030": (40, 2048),
                 "gfx1100": (48, 2048), "gfx1151": (40, 2048)}
DEFAULT_TARGET = (64, 2048)


def make_spec(shape: GemvShape, arch: str, kernel: str, config: LaunchConfig, variant: Variant | None = None,
              pdl: bool = False, sm_count: int | None = None) -> KernelSpec:
    """The spec of one build and launch; variant None takes the default for (shape, config)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}: expected one of {KERNELS}")
    if variant is None:
        variant = default_variant(shape, kernel, config)
    if kernel == "tc_batch":
        if replace(variant, loads=4, prefetch=0) != SIMT_VARIANT:
            raise ValueError(f"the tc_batch kernel's one variant field is loads; got {variant.text()!r}")
        return _tc_batch_spec(shape, arch, config, pdl, variant.loads)
    if kernel != "tc":
        if variant not in (SIMT_VARIANT, Variant()):
            raise ValueError(f"the {kernel} kernel has no variant fields; got {variant.text()!r}")
        return _simt_spec(shape, arch, config, pdl)
    return _tc_spec(shape, arch, config, variant, pdl, sm_count or KNOWN_TARGETS.get(arch, DEFAULT_TARGET)[0])


DEQUANT_BLOCK = 256
DEQUANT_WORDS = 4   # 32-bit words of w a thread (16 bytes of loads in flight)
DEQUANT_OUT = ("float16", "bfloat16")


def make_dequant_spec(shape: GemvShape, arch: str, out_dtype: str = "float16") -> KernelSpec:
    """templates/dequant.hip: the dense [N, K] weight in fp16 or bf16 (prefill's one pass a call).
    DEQUANT_WORDS 32-bit words of w a thread; no tuning (it streams at copy speed)."""
    if out_dtype not in DEQUANT_OUT:
        raise ValueError(f"dequantised weights are one of {DEQUANT_OUT}; got {out_dtype!r}")
    words = shape.N * shape.K // 8
    return KernelSpec(
        shape, arch, "dequant", LaunchConfig(DEQUANT_BLOCK, 2), SIMT_VARIANT,
        (("OUT_BF16", "true" if out_dtype == "bfloat16" else "false"),
         ("SCALE_BF16", "true" if shape.scale_dtype == "bfloat16" else "false"), ("WPT", DEQUANT_WORDS)),
        _ceil(words, DEQUANT_BLOCK * DEQUANT_WORDS), DEQUANT_BLOCK, False, rows_per_block=0, k_efficiency=1.0,
        inflight_bytes=4 * DEQUANT_WORDS, thread_bytes=4 * DEQUANT_WORDS, regs=32)


# The prefill GEMM (templates/gemm_sm90.hip): Hopper's wgmma, so sm_90a code for sm_90 devices.
# Tiles of 192 rows (three warpgroups) where N allows and they fill a wave, else 128 (two), by
# 128 tokens (gemm_rows, per call); a 4-stage ring of x' (32 KB a stage). Measured on an H100
# against 64-token tiles and 3 or 6 stages, and 192 rows against 128 (docs/performance.md).
GEMM_ARCHS = {"sm_90": "sm_90a", "sm_90a": "sm_90a"}
GEMM_ROW_TILES = (192, 128)  # the tile heights, rows, tallest first
GEMM_TOKENS, GEMM_STAGES = 128, 4
# A block's slot of the partial sums: the fp32 D of the largest block (a warpgroup, 128 threads,
# for each 64 rows; GEMM_TOKENS / 2 sums a thread).
GEMM_PARTIAL_BYTES = 2 * max(GEMM_ROW_TILES) * GEMM_TOKENS // 2 * 4


def gemm_row_tiles(N: int) -> tuple:
    """The tile heights (GEMM_ROW_TILES) that divide N: the GEMM builds a call of N rows may take."""
    return tuple(rows for rows in GEMM_ROW_TILES if N % rows == 0)


def gemm_rows(N: int, tokens: int, sm_count: int) -> int:
    """Rows of the GEMM's tiles for a call of `tokens` tokens: the tallest height of
    GEMM_ROW_TILES that divides N and makes at least 3/4 of a wave of tiles, else the shortest
    that divides N; 0 where none does. So 192 (three warpgroups) where whole tiles then run
    (q+k+v, 6144 rows at 512 tokens, is one wave of 128 on 132 SMs, not 1.45 of 192), else 128
    (fewer tiles than that are cut between blocks, and cut 128-row tiles measured faster: q+k+v
    at 128 tokens 24.0 against 27.1 us, H100)."""
    fits = gemm_row_tiles(N)  # tallest first
    token_tiles = -(-tokens // GEMM_TOKENS)
    return next((rows for rows in fits[:-1] if 4 * (N // rows) * token_tiles >= 3 * sm_count), fits[-1] if fits else 0)


def gemm_workspace_bytes(tokens: int, K: int, sm_count: int) -> int:
    """Bytes of the GEMM's workspace for `tokens` tokens: x' (whole token tiles), the partial sums
    of a tile cut between blocks (one slot a block) and one flag a block."""
    return -(-tokens // GEMM_TOKENS) * GEMM_TOKENS * K * 2 + sm_count * (GEMM_PARTIAL_BYTES + 4)


def gemm_unsupported(shape: GemvShape, arch: str) -> str | None:
    """Why the prefill GEMM cannot serve `shape` on `arch`, or None."""
    if arch not in GEMM_ARCHS:
        return f"the int4 GEMM needs Hopper's wgmma (sm_90); {arch} dequantises and uses cuBLAS"
    if shape.K % 128 or shape.group % 32 or not gemm_row_tiles(shape.N):
        return (f"the int4 GEMM takes K % 128 == 0, group % 32 == 0 and N a multiple of 128 or 192; "
                f"got N={shape.N}, K={shape.K}, group={shape.group}")
    return None


def make_gemm_spec(shape: GemvShape, arch: str, sm_count: int, rows: int, pdl: bool = True) -> KernelSpec:
    """templates/gemm_sm90.hip: y [T, N] = x [T, K] @ dequant(w)^T for any T (a runtime argument;
    a persistent grid of one block an SM) from x' (make_xperm_spec), the int4 weights read by
    the product itself, in tiles of `rows` rows (gemm_rows picks them per call; ValueError where
    they do not divide N). pdl: launched with programmatic dependent launch, so it starts while the
    x layout kernel drains and loads its first weights before waiting for x' (the weights are
    fixed: GemvWeights). NotImplementedError where gemm_unsupported says why."""
    why = gemm_unsupported(shape, arch)
    if why:
        raise NotImplementedError(why)
    if rows not in gemm_row_tiles(shape.N):
        raise ValueError(f"tiles of {rows} rows for N={shape.N}: expected one of {gemm_row_tiles(shape.N)}")
    block = 2 * rows  # a warpgroup (128 threads) for each 64 rows
    params = (("TOK", GEMM_TOKENS), ("WGS", rows // 64), ("STAGES", GEMM_STAGES), *_dtype_params(shape),
              ("PARTIAL_BYTES", GEMM_PARTIAL_BYTES))
    smem = GEMM_STAGES * GEMM_TOKENS * 256 + 1024 + 16 * GEMM_STAGES  # ring, its alignment, the mbarriers
    # config is nominal (the tuner's grid has no 384): the geometry is WGS and `block`
    return KernelSpec(replace(shape, M=1), GEMM_ARCHS[arch], "gemm", LaunchConfig(256, 2), SIMT_VARIANT,
                      params, sm_count, block, pdl, rows_per_block=rows, k_efficiency=1.0,
                      inflight_bytes=64, thread_bytes=32, regs=168, smem=smem)


XPERM_BLOCK = 256
# Blocks an SM: all of them resident at once (36 registers a thread fit 6 an SM), so the GEMM's
# early launch (PDL, at this kernel's start) takes no room from a block still waiting for an SM.
XPERM_BLOCKS_PER_SM = 4


def make_xperm_spec(shape: GemvShape, arch: str, sm_count: int) -> KernelSpec:
    """templates/xperm.hip: x' [tiles of GEMM_TOKENS, K] for the GEMM (its shared-memory stages,
    one bulk copy each), T a runtime argument; a grid-stride loop over a fixed grid. Launched
    stream-ordered (its predecessor is any kernel); it lets the GEMM launch at its start."""
    why = gemm_unsupported(shape, arch)
    if why:
        raise NotImplementedError(why)
    key = GemvShape(1, shape.K, shape.group, shape.symmetric, dtype=shape.dtype)  # only K and the dtype matter
    return KernelSpec(key, GEMM_ARCHS[arch], "xperm", LaunchConfig(XPERM_BLOCK, 2), SIMT_VARIANT,
                      (("TOK", GEMM_TOKENS), ("GEMM_GRID", sm_count), ("PARTIAL_BYTES", GEMM_PARTIAL_BYTES)),
                      XPERM_BLOCKS_PER_SM * sm_count, XPERM_BLOCK, False, rows_per_block=0,
                      k_efficiency=1.0, inflight_bytes=64, thread_bytes=64, regs=32)
