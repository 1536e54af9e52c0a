"""`int4jit inspect`: what a kernel int4jit would run is, read from its code object with no GPU.

    inspect_kernel(N, K, group=128, symmetric=False, arch="gfx90a", config=None) -> KernelFacts
    inspect_many(requests, processes=None) -> list[KernelFacts]
    efficiency_problems(facts) -> list[str]      what would make it slow (docs/amd.md states the rules)
    format_facts(facts) -> str                   the CLI's text
    add_arguments(parser), run(args) -> int      the CLI subcommand

Compiling needs only the compiler (hiprtc for gfx*, NVRTC for sm_*); counting instructions
needs a disassembler (llvm-objdump for AMD, nvdisasm or cuobjdump for NVIDIA) and is skipped,
saying so, where none is installed. The reading itself lives in codeobj.py and takes bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from . import codeobj
from .codeobj import CodeFacts
from .shapes import GemvShape, LaunchConfig


# -- the one place this module asks int4jit's planner and compiler ------------------------
@dataclass(frozen=True)
class Planned:
    """What int4jit would build for (shape, arch): the config, where it came from, the
    kernel's template parameters, and the residency the tuner's model assumed for it."""
    shape: GemvShape
    arch: str
    config: LaunchConfig
    kernel: str                # simt (templates/gemv.hip) | tc (templates/gemv_tc.hip)
    tier: str                  # override | db | table | heuristic
    reason: str
    params: dict               # template parameters beyond the shape (KT, VEC, UNROLL, ...)
    block: int
    grid: int
    planned_blocks: int        # blocks a CU/SM the tuner's efficiency model counted on
    handle: object = None      # what _build compiles (the KernelSpec)


def _modelled_blocks(model, block: int, regs_estimate: int) -> int:
    # The tuner's residency term (tuner.modelled_time, tuner.occupancy_efficiency): threads,
    # blocks and a register file of model.regs_per_sm at the template's estimated registers a thread.
    return max(1, min(model.max_threads_per_sm // block, model.max_blocks_per_sm,
                      model.regs_per_sm // (max(regs_estimate, 32) * block)))


def _plan(shape: GemvShape, arch: str, config: LaunchConfig | None = None) -> Planned:
    """int4jit's own plan (INT4JIT_* variables included), no device: tiers 1-3 or the heuristic."""
    from . import tuner
    from .plan import plan
    p = plan(shape, arch, config=config)
    s = p.spec
    return Planned(shape, s.arch, s.config, s.kernel, p.tier, p.reason, dict(s.params), s.block, s.grid,
                   _modelled_blocks(tuner.device_model(s.arch), s.config.BS, s.regs), s)


def _build(planned: Planned) -> tuple[bytes, str]:
    """(raw code object or cubin bytes, kernel symbol) of a plan, through int4jit's code cache."""
    from . import compiler
    compiled = compiler.build(planned.handle)
    return compiled.binary, compiled.kernel


# -- facts --------------------------------------------------------------------------------
def _count(facts: "KernelFacts", name: str) -> int | None:
    return None if facts.code.counts is None else getattr(facts.code.counts, name)


@dataclass(frozen=True)
class KernelFacts:
    """A planned kernel and what its code object says. Registers: AMD VGPRs/SGPRs, NVIDIA
    registers a thread (`code.vgprs`); occupancy: blocks a CU (AMD; a WGP on RDNA) or SM."""
    plan: Planned
    code: CodeFacts

    arch = property(lambda self: self.plan.arch)
    config = property(lambda self: self.plan.config)
    registers = property(lambda self: self.code.vgprs)
    sgprs = property(lambda self: self.code.sgprs)
    spills = property(lambda self: self.code.spills)
    scratch_bytes = property(lambda self: self.code.scratch_bytes)
    lds_bytes = property(lambda self: self.code.lds_bytes)
    occupancy = property(lambda self: self.code.occupancy)

    # instruction counts: None where the disassembler was not run or not found
    wide_loads = property(lambda self: _count(self, "wide_loads"))
    narrow_loads = property(lambda self: _count(self, "narrow_loads"))
    dot2 = property(lambda self: _count(self, "dot2"))
    mma = property(lambda self: _count(self, "mma"))

    def as_dict(self) -> dict:
        p, c = self.plan, self.code
        counts = None
        if c.counts is not None:
            counts = {"loads_by_bytes": c.counts.loads_by_bytes, "stream_loads_by_bytes": c.counts.stream_loads_by_bytes,
                      "dot2": c.counts.dot2, "mma": c.counts.mma, "fma_f32": c.counts.fma_f32,
                      "scratch_ops": c.counts.scratch}
        return {"shape": p.shape.key(), "arch": p.arch, "config": str(p.config), "kernel": p.kernel,
                "tier": p.tier, "reason": p.reason, "params": p.params, "block": p.block, "grid": p.grid,
                "registers": c.vgprs, "sgprs": c.sgprs, "agprs": c.agprs, "spills": c.spills,
                "scratch_bytes": c.scratch_bytes, "lds_bytes": c.lds_bytes,
                "occupancy": asdict(c.occupancy), "planned_blocks": p.planned_blocks,
                "counts": counts, "counts_note": c.counts_note, "problems": efficiency_problems(self)}


def inspect_kernel(N: int, K: int, group: int = 128, symmetric: bool = False, arch: str = "gfx90a",
                   config: LaunchConfig | tuple | None = None, disassemble: bool = True) -> KernelFacts:
    """Compile (or fetch from the code cache) the kernel int4jit would run for an N x K GEMV on
    `arch` -- the config tiers 1-3 or the heuristic pick, or `config` (BS, TN) -- and read its
    code object. Needs the target's compiler, no GPU. INT4JIT_KERNEL and INT4JIT_CONFIG apply
    as they do to gemv."""
    shape = GemvShape(N, K, group, symmetric)
    if config is not None and not isinstance(config, LaunchConfig):
        config = LaunchConfig(*config)
    plan = _plan(shape, arch, config)
    binary, name = _build(plan)
    return KernelFacts(plan, codeobj.code_facts(binary, name, plan.arch, plan.block, disassemble))


def _inspect_request(request: tuple) -> KernelFacts:
    N, K, group, symmetric, arch, config, disassemble = request
    return inspect_kernel(N, K, group, symmetric, arch, config, disassemble)


def inspect_many(requests, processes: int | None = None, disassemble: bool = True) -> list[KernelFacts]:
    """inspect_kernel for each (N, K, group, symmetric, arch, config) request, in order. With
    processes > 1, worker processes compile and read them (processes, not threads: hiprtc is not
    thread-safe; concurrent compiles in one process crash it); the code cache is shared."""
    requests = [(*r[:5], None if r[5] is None else tuple(r[5]), disassemble) for r in requests]
    if not processes or processes < 2 or len(requests) < 2:
        return [_inspect_request(r) for r in requests]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_inspect_request, requests, chunksize=max(1, len(requests) // (4 * processes))))


# -- what makes the kernel fast, checked --------------------------------------------------
def simt_steps(facts: KernelFacts) -> int | None:
    """Load steps (one 16-byte weight load per row, VEC/4 x loads) the static code holds:
    non-temporal 16-byte loads / TN. None when not whole."""
    c = facts.code.counts
    tn = facts.plan.config.TN
    return c.stream_wide // tn if c is not None and c.stream_wide % tn == 0 else None


def efficiency_problems(facts: KernelFacts) -> list[str]:
    """The properties docs/amd.md states, each broken one as a sentence (empty: all hold).
    Register, scratch and occupancy checks need no disassembler; load and dot2 checks do."""
    p, c = facts.plan, facts.code
    out = []
    if c.scratch_bytes or c.spills:
        out.append(f"scratch {c.scratch_bytes} B a thread, {c.spills} spilled registers (expected none)")
    if c.occupancy.blocks_per_cu < p.planned_blocks:
        out.append(f"occupancy {c.occupancy} is below the {p.planned_blocks} blocks a CU the tuner "
                   f"modelled for ({p.config}); limits {c.occupancy.limits}")
    counts = c.counts
    if counts is None:
        return out
    if counts.scratch:
        out.append(f"{counts.scratch} scratch/local-memory instructions (expected none)")
    if c.vendor != "amd" or p.kernel != "simt":
        return out
    vec, kt, unroll = p.params["VEC"], p.params["KT"], p.params["UNROLL"]
    iters = -(-(p.shape.K // (2 * vec)) // kt)
    if vec != 16:
        out.append(f"K={p.shape.K} is not a multiple of 32: weights arrive by {vec}-byte loads")
        return out
    steps = simt_steps(facts)
    if counts.stream_narrow or not counts.stream_wide:
        out.append(f"weight (non-temporal) loads: {counts.stream_loads_by_bytes}; expected 16-byte loads only")
    elif steps is None or steps % unroll or steps > iters:
        out.append(f"{counts.stream_wide} non-temporal 16-byte loads is not TN={p.config.TN} x a multiple of "
                   f"UNROLL={unroll} steps up to ITERS={iters}")
    elif counts.wide_loads != steps * (p.config.TN + vec // 4):
        out.append(f"{counts.wide_loads} 16-byte loads; expected {steps} steps x (TN={p.config.TN} weight + "
                   f"{vec // 4} x loads) = {steps * (p.config.TN + vec // 4)}")
    allowed = {16, 2} if p.shape.symmetric else {16, 2, 1}   # weights and x; scales; zero points
    odd = {b: n for b, n in counts.loads_by_bytes.items() if b not in allowed}
    if odd:
        out.append(f"loads of {sorted(odd)} bytes ({odd}); only 16-byte weight/x loads, 2-byte scales"
                   + ("" if p.shape.symmetric else " and 1-byte zero points") + " belong here")
    has_dot2 = bool(_kernel_traits(p.arch).get("HAS_DOT2"))
    if has_dot2 and counts.dot2 != 16 * counts.stream_wide:
        out.append(f"{counts.dot2} v_dot2_f32_f16; expected 16 per 16-byte weight load = {16 * counts.stream_wide}")
    if not has_dot2 and counts.dot2:
        out.append(f"{counts.dot2} v_dot2 on {p.arch}, which has no dot2")
    if not has_dot2 and counts.fma_f32 < 32 * counts.stream_wide:
        out.append(f"{counts.fma_f32} fp32 FMAs; the no-dot2 path needs 32 per 16-byte weight load "
                   f"= {32 * counts.stream_wide}")
    return out


def _kernel_traits(arch: str) -> dict:
    from . import backends
    return backends.module_for_arch(arch).kernel_traits(arch)


# -- text ---------------------------------------------------------------------------------
def format_facts(facts: KernelFacts) -> str:
    p, c = facts.plan, facts.code
    unit = "CU" if c.vendor == "amd" else "SM"
    regs = (f"{c.vgprs} VGPRs, {c.sgprs} SGPRs" + (f", {c.agprs} AGPRs" if c.agprs else "")
            if c.vendor == "amd" else f"{c.vgprs} registers a thread")
    lines = [
        f"{p.shape.key()} on {p.arch}: {p.kernel} kernel, (BS, TN) = ({p.config}) from tier {p.tier} ({p.reason})",
        f"  template   {', '.join(f'{k}={v}' for k, v in p.params.items())}; grid {p.grid} x block {p.block}"
        f" (wave {c.wave})",
        f"  registers  {regs}",
        f"  spills     {'unknown (no disassembler; local frame ' + str(c.scratch_bytes) + ' B)' if c.spills is None else c.spills}"
        f"{'' if c.vendor == 'amd' else ' local stores'}"
        f"; scratch {c.scratch_bytes} B a thread",
        f"  {'LDS       ' if c.vendor == 'amd' else 'shared    '} {c.lds_bytes} B a block",
        f"  occupancy  {c.occupancy.blocks_per_cu} blocks/{unit}, "
        f"{c.occupancy.waves_per_simd:g} {'waves/SIMD' if c.vendor == 'amd' else 'warps/scheduler'}"
        f" (limited by {c.occupancy.limiter}); the tuner modelled {p.planned_blocks} blocks/{unit}",
    ]
    if c.counts is None:
        lines.append(f"  counts     skipped: {c.counts_note}")
    else:
        k = c.counts
        loads = ", ".join(f"{n} x {b} B" for b, n in sorted(k.loads_by_bytes.items(), reverse=True)) or "none"
        lines.append(f"  loads      {loads} (static code); weight stream (non-temporal): "
                     f"{k.stream_wide} wide, {k.stream_narrow} narrower")
        lines.append(f"  math       {k.dot2} v_dot2_f32_f16, {k.mma} {'mfma/wmma' if c.vendor == 'amd' else 'HMMA'}, "
                     f"{k.fma_f32} fp32 FMA")
    problems = efficiency_problems(facts)
    rules = "docs/amd.md" if c.vendor == "amd" else "docs/amd.md rules 3-4: scratch, occupancy"
    lines.append("  checks     " + (f"all hold ({rules})" if not problems else "BROKEN:"))
    lines += [f"    - {x}" for x in problems]
    return "\n".join(lines)


# -- the CLI ------------------------------------------------------------------------------
DEFAULT_AMD_TARGETS = ("gfx90a", "gfx908", "gfx1030", "gfx900")


def _shape_list(text: str) -> list[tuple[int, int]]:
    out = []
    for tok in text.replace(";", ",").split(","):
        n, sep, k = tok.strip().lower().partition("x")
        if not sep or not n.isdigit() or not k.isdigit():
            raise argparse.ArgumentTypeError(f"bad shape {tok.strip()!r}: expected NxK, e.g. 4096x4096")
        out.append((int(n), int(k)))
    return out


def _config(text: str) -> LaunchConfig:
    try:
        bs, tn = (int(v) for v in text.split(","))
        return LaunchConfig(bs, tn)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"bad config {text!r}: expected BS,TN in the 20-point grid ({e})") from None


def add_arguments(parser: argparse.ArgumentParser):
    """Options of `int4jit inspect`."""
    parser.add_argument("--shapes", type=_shape_list, required=True, help="NxK list, e.g. 4096x4096,896x896")
    parser.add_argument("--group", type=int, default=128, choices=(16, 32, 64, 128, 256))
    parser.add_argument("--symmetric", action="store_true", help="no zero points (zero point 8)")
    parser.add_argument("--arch", action="append",
                        help=f"target (repeatable): gfx90a, gfx1151, sm_90, ...; default the GPU here, "
                             f"else {', '.join(DEFAULT_AMD_TARGETS)}")
    parser.add_argument("--config", type=_config, help="BS,TN to inspect instead of the tiers' pick")
    parser.add_argument("--json", action="store_true", help="one JSON object a kernel, one a line")


def _default_archs() -> list[str]:
    from . import backends
    try:
        if backends.gpu_available():
            return [backends.device().arch]
    except Exception:  # no usable device: compile-only targets
        pass
    return list(DEFAULT_AMD_TARGETS)


def run(args) -> int:
    """Inspect every (shape, arch); 0 when every check holds, 1 when one is broken, 2 when a
    kernel could not be built."""
    from .errors import Int4JitError
    status = 0
    for N, K in args.shapes:
        for arch in args.arch or _default_archs():
            try:
                facts = inspect_kernel(N, K, args.group, args.symmetric, arch, args.config)
            except (Int4JitError, ValueError) as e:
                print(f"int4jit inspect: {N}x{K} on {arch}: {str(e).splitlines()[0]}", file=sys.stderr)
                status = 2
                continue
            print(json.dumps(facts.as_dict(), default=str) if args.json else format_facts(facts))
            if efficiency_problems(facts):
                status = max(status, 1)
    return status
