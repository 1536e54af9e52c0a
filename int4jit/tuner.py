"""Pick the launch geometry (BS, TN) and the variant for a shape, in four tiers:
  1. INT4JIT_CONFIG / MIGRAPHX_INT4_GEMV_CONFIG override ("BS,TN[,field=value...]", or per shape)
  2. this machine's tuning DB        3. the shipped table.json
  4. autotune: the (BS, TN) grid at the default variant, heuristic pick first, then the variant
     space at the winner (INT4JIT_TUNE=0: the heuristic alone)
Fixed weights (GemvWeights, Int4Linear) may launch the selection's early twin: measured against
it where the selection was measured here (tiers 2 and 4), by a measured rule elsewhere.
ORT_MIGRAPHX_EXHAUSTIVE_TUNE=1 searches the 20-point grid and more variants even where tiers 2-3
have a row."""
from __future__ import annotations

import datetime
import functools
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ._version import __version__
from .backends import module_for_arch
from .cache import warn_write_failure
from .errors import Int4JitError
from .shapes import GemvShape, LaunchConfig, candidate_grid
from .spec import (DEFAULT_TARGET, KNOWN_TARGETS, KernelSpec, Variant, default_variant, make_spec,
                   normalise_variant, schedules, template_hash, variant_from, variant_space)
from .trace import trace
from .tuning_db import TuningDB, TuningRecord

TABLE_PATH = Path(__file__).parent / "table.json"


# -- tier 1: the override ---------------------------------------------------------------
@dataclass(frozen=True)
class Override:
    """A forced (BS, TN) and variant fields (the rest of the variant stays the shape's default)."""
    config: LaunchConfig
    fields: tuple = ()       # ((name, value), ...)

    def variant(self, base: Variant) -> Variant:
        return replace(base, **dict(self.fields)) if self.fields else base


_UINT = re.compile(r"^[0-9]+$")   # ASCII digits only: int() would take other scripts' digits
_ENTRY = re.compile(r"^\s*(\*|[0-9]+\s*:\s*[0-9]+)\s*=(.*)$")
_EXAMPLE = "'256,4', '128,4,streaming=1,kcluster=2' or '4096:4096=128,4;*=256,2'"


def _uint(text: str, what: str, var: str, token: str) -> int:
    text = text.strip()
    if not _UINT.match(text):
        raise ValueError(f"{var}: bad {what} {text[:40]!r} in {token[:60]!r}: expected a decimal integer; "
                         f"e.g. {_EXAMPLE}")
    return int(text)


def parse_config_text(text: str, var: str = "config", token: str | None = None) -> Override:
    """'BS,TN[,field=value,...]' -> Override; malformed text is a ValueError naming `var`."""
    token = text if token is None else token
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 2 or "=" in parts[0] or "=" in parts[1]:
        raise ValueError(f"{var}: bad entry {token[:60]!r}: expected 'BS,TN' optionally followed by "
                         f"variant fields; e.g. {_EXAMPLE}")
    bs, tn = _uint(parts[0], "BS", var, token), _uint(parts[1], "TN", var, token)
    try:
        cfg = LaunchConfig(bs, tn)
    except ValueError as e:
        raise ValueError(f"{var}: {e}") from None
    values = {}
    for p in parts[2:]:
        name, sep, value = p.partition("=")
        if not sep:
            raise ValueError(f"{var}: bad variant field {p[:40]!r} in {token[:60]!r}: expected name=value")
        values[name.strip()] = _uint(value, name.strip(), var, token)
    return Override(cfg, _fields(values, var))


def _fields(values: dict, where: str) -> tuple:
    """Validated variant fields, typed as the Variant types them, as a hashable tuple."""
    v = variant_from(values, where)
    return tuple(sorted((k, getattr(v, k)) for k in values))


def parse_override(value: str, var: str = "INT4JIT_CONFIG"):
    """'BS,TN[,f=v]' -> Override; 'N:K=BS,TN[,f=v];...;*=BS,TN' -> {(N, K) or '*': Override}."""
    tokens = [t.strip() for t in value.split(";") if t.strip()]
    if not tokens:
        raise ValueError(f"{var} is empty; expected e.g. {_EXAMPLE}")
    if len(tokens) == 1 and not _ENTRY.match(tokens[0]):
        return parse_config_text(tokens[0], var)
    table = {}
    for token in tokens:
        m = _ENTRY.match(token)
        if not m:
            raise ValueError(f"{var}: bad entry {token[:60]!r}: expected 'N:K=BS,TN' or '*=BS,TN'")
        lhs = m.group(1).replace(" ", "")
        key = "*" if lhs == "*" else tuple(int(v) for v in lhs.split(":"))
        table[key] = parse_config_text(m.group(2), var, token)
    return table


def override_for(shape: GemvShape, found: tuple[str, str] | None):
    """(Override, reason) from the override variable (var, value), or None when it does not decide."""
    if found is None or not found[1].strip():
        return None
    var, value = found
    parsed = parse_override(value, var)
    if isinstance(parsed, Override):
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


def table_entry(shape: GemvShape, arch: str) -> tuple[Override, str] | None:
    """(row, its key) of the shipped table (measured under the default kernel choice) for
    (arch, shape). A row of the activation type serves either scale type (the scales' type
    changes one conversion a group). Without a bf16 row, one bf16 token takes the fp16 row of
    its (N, K, group): one token's kernel choice does not depend on the dtype, so that row was
    measured on the same kernel, with the same loads and steps and fp16 in place of bf16
    arithmetic (bf16 rows exist where that build measured slower, e.g. 35840x5120)."""
    rows = shipped_table().get(arch, {})
    keys = [shape.key(), replace(shape, scale_dtype="float16").key()]
    if shape.M == 1:
        keys.append(replace(shape, dtype="float16", scale_dtype="float16").key())
    key = next((k for k in keys if k in rows), None)
    if key is None:
        return None
    row = rows[key]
    return Override(LaunchConfig(*row["config"]), _fields(row.get("variant") or {}, "table.json")), key


# -- the heuristic ----------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceModel:
    """What the heuristic knows of a GPU."""
    sm_count: int
    max_threads_per_sm: int
    regs_per_sm: int
    warp: int
    max_blocks_per_sm: int = 32
    # A batch of loads takes the longer of a loaded round trip and its bytes at the memory
    # bandwidth (Little's law: ~6.4 MB in flight keep the H200 busy); each wave of blocks adds a
    # fixed cost (x staged, partial sums reduced, y stored). Fitted to the measured sm_90 suite
    # (bench/results/tuning-sm_90.json; H200 reads at ~4.1 TB/s).
    round_trip_ns: float = 1600.0
    bytes_per_ns_per_sm: float = 30.3
    wave_ns: float = 500.0
    # Picks within this of the modelled best are taken as equal and the fewest rows a warp wins:
    # the model misses what larger TN costs a warp (its tiles' serial mma chain, more registers).
    near: float = 0.10
    # The AMD targets keep the occupancy model (occupancy_efficiency) until an AMD GPU measures
    # the time model: weight bytes a multiprocessor wants in flight (~320 KB) and a row's fixed
    # cost in weight-byte equivalents, fitted to the sm_90 suite before the time model was.
    inflight_bytes: int = 320 << 10
    row_cost_bytes: int = 256


def device_model(arch: str, device=None) -> DeviceModel:
    if device is not None:
        return DeviceModel(device.sm_count, device.max_threads_per_sm, device.regs_per_sm, device.warp_size)
    sms, threads = KNOWN_TARGETS.get(arch, DEFAULT_TARGET)
    warp = 32 if arch.startswith("sm_") or not arch.startswith("gfx9") else 64
    return DeviceModel(sms, threads, 65536, warp)


def modelled_time(spec: KernelSpec, model: DeviceModel) -> tuple[float, float]:
    """(modelled ns, ns of its bytes at full bandwidth) of one launch. Blocks run in waves of
    what fits (threads, blocks and registers a SM); a warp's K steps go in batches of its loads
    in flight, each batch one round trip, or longer where the wave's bytes in flight exceed
    what the bandwidth moves in one. The lanes idle along K are idle in the last steps, so full
    batches carry every lane's loads and the last one only what is left (7 steps at 2 a batch:
    3.5 batches' bytes, not 4)."""
    block = spec.block
    per_sm = max(1, min(model.max_threads_per_sm // block, model.max_blocks_per_sm,
                        model.regs_per_sm // (max(spec.regs, 32) * block)))
    batches = math.ceil(spec.thread_bytes / spec.inflight_bytes)
    last = max(0.0, spec.thread_bytes * spec.k_efficiency / spec.inflight_bytes - (batches - 1))
    batch_bytes = block * spec.inflight_bytes   # one block's full batch; `last`: the last one's share
    bandwidth = model.bytes_per_ns_per_sm * model.sm_count
    left, ns = spec.grid, 0.0
    while left > 0:
        wave = min(left, per_sm * model.sm_count)
        left -= wave
        batch_ns = lambda share: max(model.round_trip_ns, wave * share * batch_bytes / bandwidth)
        ns += (batches - 1) * batch_ns(1.0) + batch_ns(last) + model.wave_ns
    return ns, spec.grid * block * spec.thread_bytes * spec.k_efficiency / bandwidth


def estimate_efficiency(spec: KernelSpec, model: DeviceModel) -> float:
    """Modelled fraction of peak bandwidth a spec reaches (modelled_time's bytes-at-bandwidth
    over its time): round trips not covered by bytes in flight, partial waves, idle K lanes."""
    ns, ideal = modelled_time(spec, model)
    return ideal / ns


def occupancy_efficiency(spec: KernelSpec, model: DeviceModel) -> float:
    """The AMD targets' model: fraction of peak bandwidth from idle K lanes, padded rows, the last
    partial wave, bytes in flight per SM, and per-thread fixed cost (docs/amd.md checks its picks)."""
    shape, bs = spec.shape, spec.config.BS
    row_eff = shape.N / (spec.grid * spec.rows_per_block) * max(1, spec.variant.kcluster)
    per_sm = max(1, min(model.max_threads_per_sm // bs, model.max_blocks_per_sm,
                        model.regs_per_sm // (max(spec.regs, 32) * bs)))
    resident = min(per_sm, math.ceil(spec.grid / model.sm_count))
    waves = spec.grid / (per_sm * model.sm_count)
    wave_eff = waves / math.ceil(waves)
    inflight = resident * bs * spec.k_efficiency * spec.inflight_bytes
    mem_eff = min(1.0, inflight / model.inflight_bytes)
    fixed = model.row_cost_bytes * spec.config.TN
    return spec.k_efficiency * row_eff * wave_eff * mem_eff * spec.thread_bytes / (spec.thread_bytes + fixed)


def heuristic(shape: GemvShape, arch: str, kernel: str, device=None, exhaustive: bool = False) -> LaunchConfig:
    """The modelled best (BS, TN) of the grid that will be searched, at the default variant. NVIDIA:
    of the configs within model.near of the fastest modelled time, the smallest TN, then the fastest
    modelled. AMD: the best occupancy_efficiency, then smallest TN, then largest BS."""
    model = device_model(arch, device)
    grid = candidate_grid(exhaustive)
    spec = lambda c: make_spec(shape, arch, kernel, c, sm_count=model.sm_count)
    if not arch.startswith("sm_"):
        return max(grid, key=lambda c: (round(occupancy_efficiency(spec(c), model), 3), -c.TN, c.BS))
    ns = {c: modelled_time(spec(c), model)[0] for c in grid}
    fastest = min(ns.values())
    return min((c for c in grid if ns[c] <= fastest * (1 + model.near)), key=lambda c: (c.TN, ns[c]))


# -- selection --------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    config: LaunchConfig
    variant: Variant
    tier: str      # override | db | table | tuned | heuristic
    reason: str


def db_key(shape: GemvShape, kernel: str) -> str:
    """What a tuning record answers: one problem on one kernel (the DB file is per arch)."""
    return f"{shape.key()}/{kernel}"


def db_context(kernel: str, arch: str, device=None) -> dict[str, str]:
    """Everything that changes the answer besides the key; a record that differs is stale."""
    ctx = {"template": template_hash(kernel), "compiler": module_for_arch(arch).compiler_version(),
           "int4jit": __version__}
    if device is not None:
        ctx["device"] = device.name
    return ctx


def select(shape: GemvShape, arch: str, kernel: str, *, device=None, override=None, exhaustive=False,
           tune=True, table=True, pdl=False, fixed_weights=False) -> Selection:
    """Walk the four tiers. Without a device (compile-only, or a stream being captured) tier 4
    is the heuristic. `override` is (var, value) of the override variable, or an Override.
    fixed_weights: no kernel writes the weights while they are in use, so the early twin may
    launch instead (an override decides for itself)."""
    sel = _select(shape, arch, kernel, device, override, exhaustive, tune, table, pdl)
    if fixed_weights and sel.tier != "override":
        sel = _fixed_weights(sel, shape, arch, kernel, device, tune, pdl)
    trace("%s on %s (%s kernel): %s%s from tier %s (%s)", shape.key(), arch, kernel, sel.config,
          "," + sel.variant.text() if kernel == "tc" and sel.variant.text() else "", sel.tier, sel.reason)
    return sel


def _chosen(shape, kernel, ov: Override, tier, reason) -> Selection:
    return Selection(ov.config, ov.variant(default_variant(shape, kernel, ov.config)), tier, reason)


def _select(shape, arch, kernel, device, override, exhaustive, tune, table, pdl) -> Selection:
    if isinstance(override, Override):
        return _chosen(shape, kernel, override, "override", "config= argument")
    hit = override_for(shape, override)
    if hit is not None:
        return _chosen(shape, kernel, hit[0], "override", hit[1])
    db = TuningDB(arch)
    key, context = db_key(shape, kernel), db_context(kernel, arch, device)
    rec = db.get(key, context)
    if rec is not None and (not exhaustive or rec.exhaustive):
        cfg = {k: v for k, v in rec.config.items() if k not in ("BS", "TN")}
        return Selection(LaunchConfig(rec.config["BS"], rec.config["TN"]), variant_from(cfg, str(db.path)),
                         "db", f"tuned here {rec.date}, {rec.us:.2f} us")
    if not exhaustive and table:
        hit = table_entry(shape, arch)
        if hit is not None:
            row, row_key = hit
            return _chosen(shape, kernel, row, "table", f"shipped table.json row {row_key} for {arch}")
    if device is None or not tune:
        why = "INT4JIT_TUNE=0" if device is not None else "no device to benchmark on"
        cfg = heuristic(shape, arch, kernel, device, exhaustive)
        return Selection(cfg, default_variant(shape, kernel, cfg), "heuristic", why)
    rec, winner = autotune(shape, kernel, device, exhaustive=exhaustive, pdl=pdl)
    rec.context.update(context)
    try:
        db.put(key, rec)
    except (OSError, TimeoutError) as e:  # filelock's Timeout is a TimeoutError
        warn_write_failure(db.path, e)
    return Selection(winner.config, winner.variant, "tuned",
                     f"benchmarked {len(rec.candidates)} candidates, {rec.us:.2f} us")


# -- fixed weights: the early twin --------------------------------------------------------
# Where no measurement of the twin exists (table, heuristic), fixed weights launch early at groups
# of 128 and more on builds that keep at most 4 loads and TN <= 4 rows a lane in flight. Measured
# on the H200 (decode_chain per-shape graphs, GemvWeights against gemv): 4096x4096 (512,2)
# 5.0 -> 4.4 us, 6144x4096 (256,2) 6.1 -> 5.7, 12288x4096 (256,4) 9.3 -> 8.6; builds with 8 loads
# or TN = 8, whose first batch waits longer on more registers beside the previous grid, lose:
# 37888x3584 (128,8) 20.6 -> 27.5, 152064x3584 (128,8,loads=8) 82.0 -> 97.7.
EARLY_MIN_GROUP = 128
EARLY_MAX_TN = 4
FIXED_WEIGHTS_KEY = "fixed-weights"   # suffix of the DB key whose record says early or not


def early_twin(shape: GemvShape, arch: str, kernel: str, config: LaunchConfig, variant: Variant,
               pdl: bool) -> Variant | None:
    """The variant a fixed-weights call may launch instead of `variant` (early, which streams), or
    None where early cannot apply (not the tc kernel, no PDL, before sm_90)."""
    if kernel != "tc":
        return None
    twin = normalise_variant(shape, config, arch, replace(variant, early=True), pdl)
    return twin if twin.early and twin != variant else None


def early_by_rule(shape: GemvShape, config: LaunchConfig, variant: Variant) -> bool:
    """The measured rule, for selections made without measuring (see EARLY_MIN_GROUP)."""
    return shape.group >= EARLY_MIN_GROUP and config.TN <= EARLY_MAX_TN and variant.loads == 4


def _fixed_weights(sel: Selection, shape, arch, kernel, device, tune, pdl) -> Selection:
    """The selection a fixed-weights call launches: `sel` or its early twin."""
    twin = early_twin(shape, arch, kernel, sel.config, sel.variant, pdl)
    if twin is None:
        return sel
    if sel.tier not in ("db", "tuned") or device is None or not tune:
        if not early_by_rule(shape, sel.config, sel.variant):
            return sel
        return replace(sel, variant=twin, reason=sel.reason + ", early (fixed weights, by rule)")
    rec = _early_record(sel, twin, shape, arch, kernel, device, pdl)
    if rec is None or not rec.config.get("early"):
        return replace(sel, reason=sel.reason + ", early twin measured slower" if rec else sel.reason)
    return replace(sel, variant=twin, reason=sel.reason + f", early (fixed weights): measured {rec.us:.2f} us")


def _early_record(sel: Selection, twin: Variant, shape, arch, kernel, device, pdl) -> TuningRecord | None:
    """The DB record of `sel` against its early twin, measured now where it is absent or was
    measured against another pick (None where both failed to run)."""
    db = TuningDB(arch)
    key, context = f"{db_key(shape, kernel)}/{FIXED_WEIGHTS_KEY}", db_context(kernel, arch, device)
    specs = [make_spec(shape, arch, kernel, sel.config, v, pdl, device.sm_count) for v in (sel.variant, twin)]
    rec = db.get(key, context)
    if rec is not None and specs[0].label() in rec.candidates:
        return rec
    from .benchmark import measure

    times = measure(device, specs)
    ok = {s: t for s, t in times.items() if t is not None}
    if not ok:
        return None
    best = min(ok, key=ok.get)
    rec = TuningRecord(config={"BS": best.config.BS, "TN": best.config.TN, **best.variant.as_dict()}, us=ok[best],
                       candidates={s.label(): t for s, t in times.items()}, context=context, date=_now())
    trace("fixed weights %s: %s", shape.key(), ", ".join(f"{s.label()} {t} us" for s, t in times.items()))
    try:
        db.put(key, rec)
    except (OSError, TimeoutError) as e:  # filelock's Timeout is a TimeoutError
        warn_write_failure(db.path, e)
    return rec


# -- tier 4: the search -----------------------------------------------------------------
def grid_specs(shape: GemvShape, arch: str, kernel: str, device=None, exhaustive=False, pdl=False) -> list[KernelSpec]:
    """Stage 1 of the search: every (BS, TN) of the grid under each schedule (the tc kernel's
    default variant and its streaming twin), the heuristic's pick first. Several tokens add each
    schedule's one_wave twin where it caps registers: their builds need a few more registers than
    one token's, which can push a grid just past one wave (H200, M = 8, 28672x4096: (128,4)
    streaming 35.6 us, with one_wave 20.1; stage 2 flips one_wave only at stage 1's winner), and on
    sm_90 each schedule's kcluster=2 twin (with its one_wave twin): K split over two blocks of a
    cluster doubles the warps a row block has, which several tokens need most on K-long shapes
    (H200, M = 8 over M = 1: 4096x14336 1.41 -> 1.10 at (256,4,kcluster=2,one_wave,xahead),
    5120x17920 1.38 -> 1.15, 4096x4096 1.22 -> 1.10, each best with one_wave; the winners lie
    at another (BS, TN) than stage 1's winner without clusters)."""
    sms = device.sm_count if device is not None else None
    first = heuristic(shape, arch, kernel, device, exhaustive)
    configs = [first] + [c for c in candidate_grid(exhaustive) if c != first]
    specs = []
    several = kernel == "tc" and shape.M > 1
    for c in configs:
        for sched in schedules(shape, kernel, c, arch, pdl):
            for v in (sched, replace(sched, kcluster=2)) if several else (sched,):
                spec = make_spec(shape, arch, kernel, c, v, pdl=pdl, sm_count=sms)
                specs.append(spec)
                if several and not v.one_wave:
                    capped = make_spec(shape, arch, kernel, c, replace(v, one_wave=True), pdl=pdl, sm_count=sms)
                    if capped.param("KERNEL_ATTRS") != spec.param("KERNEL_ATTRS"):
                        specs.append(capped)
    return list(dict.fromkeys(specs))


def variant_specs(shape: GemvShape, arch: str, kernel: str, config: LaunchConfig, device=None,
                  exhaustive=False, pdl=False, base: Variant | None = None) -> list[KernelSpec]:
    """Stage 2: the variant space at one (BS, TN) around `base` (stage 1's winner), base first."""
    sms = device.sm_count if device is not None else None
    specs = [make_spec(shape, arch, kernel, config, v, pdl=pdl, sm_count=sms)
             for v in variant_space(shape, kernel, config, arch, exhaustive, pdl, base)]
    return list(dict.fromkeys(specs))


def search_space(shape: GemvShape, arch: str, kernel: str, device=None, exhaustive=False, pdl=False) -> list[KernelSpec]:
    """Every spec the search may measure, whichever spec wins stage 1: what pre-warming compiles."""
    out = {}
    for s in grid_specs(shape, arch, kernel, device, exhaustive, pdl):
        out.update(dict.fromkeys(variant_specs(shape, arch, kernel, s.config, device, exhaustive, pdl, s.variant)))
    return list(out)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def autotune(shape: GemvShape, kernel: str, device, exhaustive: bool = False, pdl: bool = False):
    """Benchmark stage 1, then stage 2 at its winner; -> (TuningRecord, winning spec)."""
    from .benchmark import measure  # the harness compiles and launches: only tier 4 needs it

    stage1 = grid_specs(shape, device.arch, kernel, device, exhaustive, pdl)
    times = measure(device, stage1)
    ok = {s: t for s, t in times.items() if t is not None}
    if not ok:
        raise Int4JitError(f"autotune for {shape.key()} on {device.arch}: every candidate failed "
                           f"(set INT4JIT_TRACE=1 to see why)")
    best = min(ok, key=ok.get)
    stage2 = [s for s in variant_specs(shape, device.arch, kernel, best.config, device, exhaustive, pdl, best.variant)
              if s not in times]
    if stage2:
        times.update(measure(device, stage2))
        ok = {s: t for s, t in times.items() if t is not None}
        best = min(ok, key=ok.get)
    trace("tuned %s: %d candidates measured (%d geometries, %d variants), best %s %.2f us", shape.key(),
          len(times), len(stage1), len(stage2), best.label(), ok[best])
    rec = TuningRecord(config={"BS": best.config.BS, "TN": best.config.TN, **best.variant.as_dict()},
                       us=ok[best], candidates={s.label(): t for s, t in times.items()}, context={},
                       date=_now(), exhaustive=exhaustive)
    return rec, best
