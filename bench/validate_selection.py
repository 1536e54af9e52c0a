"""Selection on shapes outside the table: the tuned and the no-GPU picks against the best (issue 18).

Issue 18's bars, on a validation set disjoint from table.json (other model families, odd K):
the default tuner's pick within 10% of the best variant found exhaustively, and the no-GPU
heuristic's pick within 15% of the tuned pick on at least 90% of the shapes.

Per shape, every (BS, TN) of the default 9-point grid x every variant of the exhaustive
variant space is measured with int4jit's own harness (benchmark.measure: graph replay over
rotating weight copies that defeat L2, median of 7). From those times, on the CPU:
  best       the fastest candidate (BS 32 and 512, TN 16 of the 20-point grid are not measured);
  tuned      what tuner.autotune(exhaustive=False) picks: the grid at the default variant
             (tuner.grid_specs), then the variants at its winner (tuner.variant_specs);
  heuristic  the no-GPU pick: tuner.heuristic without a device, at the default variant, as
             tuner.select's heuristic tier yields it.
% of copy bandwidth is the tuned pick's bytes / time against a 2 GiB device copy measured in
this run (bench/common.py).

Cost: 20 shapes, 1,242 candidates (63 or 72 a tc shape, 9 for the simt one). They are compiled
first, in --jobs processes (builds already in the code cache are skipped; ~0.3 s a build, so
~30 s on 16 cores), then measured shape by shape (~1-2 s a shape): about 2 minutes in all on
an H200. --time-budget stops after the shape that reaches it.

    python3 bench/validate_selection.py                  # the full set
    python3 bench/validate_selection.py --quick          # 3 shapes: a smoke test
    python3 bench/validate_selection.py --shapes 0,8192x3072/g32/asym
    python3 bench/validate_selection.py --shapes 35840x5120/g128/asym/m8 --field xahead   # any shape; a field's A/B
    python3 bench/validate_selection.py --from-json bench/results/validate_selection-<date>.json

Writes bench/results/validate_selection-<date>.json after every shape (every candidate's label
and µs: a run cut short keeps what it measured; --quick and --shapes write
validate_selection-subset-<date>.json) and, for the full set, the "Selection on shapes outside
the table" section of bench/RESULTS.md (not with --no-results-md). --from-json needs no GPU: it
recomputes the picks from a saved run with the int4jit of this checkout (e.g. after changing the
heuristic), prints the report and writes the section on the same terms.

--shapes also takes shapes outside the set (any key, several tokens too: .../m8), measured the
same way; a run with any is a subset. --field NAME prints, per shape, the best candidate with the
variant field NAME at its default against the best with it set otherwise (an A/B of a field over
the whole grid, from the same times)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, RESULTS_MD, compile_all, copy_bandwidth, gpu_or_exit, write_section  # noqa: E402

from int4jit import __version__, plan, tuner  # noqa: E402
from int4jit.env import env_lookup  # noqa: E402
from int4jit.shapes import GemvShape, candidate_grid  # noqa: E402
from int4jit.spec import KernelSpec, Variant, default_variant, make_spec  # noqa: E402

SECTION = "Selection on shapes outside the table"
TUNED_WITHIN = 1.10       # the tuned pick within 10% of the best candidate ...
HEURISTIC_WITHIN = 1.15   # ... and the no-GPU pick within 15% of the tuned one
HEURISTIC_SHARE = 0.90    # on at least 90% of the shapes


@dataclass(frozen=True)
class Case:
    """One validation shape and the projection it comes from."""
    model: str
    projection: str
    shape: GemvShape


def case(model: str, projection: str, N: int, K: int, group: int = 128, symmetric: bool = False) -> Case:
    return Case(model, projection, GemvShape(N, K, group, symmetric))


# Projections of models outside the table's suite (N x K: output rows x input length; "down"
# is K x N of "up"). Int4 weights from 5.8 MB (2048x5632) to 272 MB (152064x3584).
VALIDATION = [
    # Qwen2.5-7B: hidden 3584, intermediate 18944, q+k+v 4608, vocabulary 152064
    case("Qwen2.5-7B", "qkv", 4608, 3584),
    case("Qwen2.5-7B", "o", 3584, 3584),
    case("Qwen2.5-7B", "gate+up", 37888, 3584),
    case("Qwen2.5-7B", "down", 3584, 18944),
    case("Qwen2.5-7B", "down", 3584, 18944, group=32),
    case("Qwen2.5-7B", "lm_head", 152064, 3584),
    # Qwen2.5-3B: hidden 2048, intermediate 11008
    case("Qwen2.5-3B", "up", 11008, 2048),
    case("Qwen2.5-3B", "down", 2048, 11008, symmetric=True),
    # Qwen2.5-1.5B: hidden 1536, intermediate 8960 (N under 2048: the simt kernel)
    case("Qwen2.5-1.5B", "down", 1536, 8960),
    # Phi-3-mini: hidden 3072, intermediate 8192, q+k+v 9216
    case("Phi-3-mini", "qkv", 9216, 3072),
    case("Phi-3-mini", "gate+up", 16384, 3072),
    case("Phi-3-mini", "down", 3072, 8192),
    # Llama-3.2-3B: hidden 3072, intermediate 8192, q+k+v 5120
    case("Llama-3.2-3B", "qkv", 5120, 3072),
    case("Llama-3.2-3B", "up", 8192, 3072, group=32),
    # TinyLlama-1.1B: hidden 2048, intermediate 5632
    case("TinyLlama-1.1B", "up", 5632, 2048),
    case("TinyLlama-1.1B", "down", 2048, 5632),
    # Gemma-2-9B: hidden 3584, intermediate 14336
    case("Gemma-2-9B", "up", 14336, 3584),
    case("Gemma-2-9B", "down", 3584, 14336, group=32, symmetric=True),
    # Mistral-Nemo-12B: hidden 5120, intermediate 14336
    case("Mistral-Nemo-12B", "up", 14336, 5120, symmetric=True),
    case("Mistral-Nemo-12B", "down", 5120, 14336),
]
QUICK = ("4608x3584/g128/asym", "8192x3072/g32/asym", "1536x8960/g128/asym")


def check_disjoint(cases: list[Case]):
    """The set must be disjoint from table.json (every arch) and name each shape once."""
    table = {key for rows in tuner.shipped_table().values() for key in rows}
    keys = [c.shape.key() for c in cases]
    clash = sorted(k for k in set(keys) if k in table)
    twice = sorted(k for k in set(keys) if keys.count(k) > 1)
    if clash or twice:
        sys.exit(f"validate_selection.py: the validation set is wrong: in int4jit/table.json: {clash or 'none'}; "
                 f"listed twice: {twice or 'none'}")


def parse_key(key: str) -> GemvShape:
    """'4096x4096/g128/asym' -> GemvShape (the keys table.json and the tuning files hold)."""
    return GemvShape.from_key(key)


# -- what is measured, and what each selection picks from it ---------------------------------
def heuristic_spec(shape: GemvShape, arch: str, kernel: str, pdl: bool, exhaustive: bool = False) -> KernelSpec:
    """The no-GPU pick as tuner.select's heuristic tier yields it and plan.plan builds it: the
    modelled best (BS, TN) without a device, at its default variant."""
    config = tuner.heuristic(shape, arch, kernel, None, exhaustive)
    return make_spec(shape, arch, kernel, config, default_variant(shape, kernel, config), pdl)


def candidate_specs(shape: GemvShape, arch: str, kernel: str, pdl: bool, device=None) -> list[KernelSpec]:
    """Every spec measured for a shape: each (BS, TN) of the default grid x each variant of the
    exhaustive variant space, then what the default search and the heuristic measure (among
    those today; listed so that every pick stays measured should the spaces part)."""
    specs = [s for c in candidate_grid(False)
             for s in tuner.variant_specs(shape, arch, kernel, c, device, exhaustive=True, pdl=pdl)]
    specs += tuner.search_space(shape, arch, kernel, device, False, pdl)
    specs.append(heuristic_spec(shape, arch, kernel, pdl))
    return list(dict.fromkeys(specs))


def fastest(specs: list[KernelSpec], times: dict) -> KernelSpec | None:
    """The fastest spec that ran, the first of equals (as the tuner's min); None if none ran."""
    ran = [s for s in specs if times.get(s.label()) is not None]
    return min(ran, key=lambda s: times[s.label()], default=None)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None else None


def picks(shape: GemvShape, arch: str, kernel: str, pdl: bool, device, times: dict) -> dict:
    """The best, tuned and heuristic picks from measured times {label: µs or None}. `device`
    is the GPU (or a stand-in with its sm_count, max_threads_per_sm, regs_per_sm and warp_size)
    the tuner's search would see."""
    ran = {label: t for label, t in times.items() if t is not None}
    best = min(ran, key=ran.get, default=None)
    stage1 = tuner.grid_specs(shape, arch, kernel, device, False, pdl)
    winner = fastest(stage1, times)
    searched = list(stage1)
    if winner is not None:
        searched += [s for s in tuner.variant_specs(shape, arch, kernel, winner.config, device, False, pdl,
                                                    winner.variant) if s not in stage1]
    tuned_spec = fastest(searched, times)
    tuned = None if tuned_spec is None else tuned_spec.label()
    heuristic = heuristic_spec(shape, arch, kernel, pdl).label()
    row = {"best": best, "best_us": ran.get(best), "tuned": tuned, "tuned_us": ran.get(tuned),
           "searched": len(searched), "heuristic": heuristic, "heuristic_us": ran.get(heuristic),
           "missing": sorted(({s.label() for s in searched} | {heuristic}) - times.keys())}
    row["tuned_vs_best"] = ratio(row["tuned_us"], row["best_us"])
    row["heuristic_vs_tuned"] = ratio(row["heuristic_us"], row["tuned_us"])
    return row


def field_ab(times: dict, field: str) -> str:
    """The best candidate with variant field `field` at its default against the best with it set
    otherwise (a label names the fields that differ from the defaults: '128,4,streaming=1')."""
    ran = {label: t for label, t in times.items() if t is not None}
    is_set = lambda label: any(part.startswith(f"{field}=") for part in label.split(","))
    sides = [{k: v for k, v in ran.items() if is_set(k) == side} for side in (False, True)]
    if not all(sides):
        return f"{field}: no candidate {'sets' if not sides[1] else 'leaves'} it"
    (d, d_us), (o, o_us) = ((min(side, key=side.get), min(side.values())) for side in sides)
    return f"{field} at its default: {d} {d_us:.2f} µs; set: {o} {o_us:.2f} µs ({o_us / d_us:.3f}x)"


def within(r: float | None, bar: float) -> bool:
    return r is not None and r <= bar


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


# -- compiling and measuring (GPU) -------------------------------------------------------------
def device_facts(device) -> dict:
    """What the tuner's search reads of a device, for --from-json's stand-in."""
    return {k: getattr(device, k) for k in ("name", "arch", "sm_count", "max_threads_per_sm", "regs_per_sm",
                                            "warp_size", "l2_bytes")}


def write_json(doc: dict, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def run_on_gpu(args, cases: list[Case], subset: bool) -> tuple[dict, Path]:
    """Compile and measure every candidate of `cases`; -> (the run's record, where it is saved)."""
    gpu_or_exit("validate_selection.py")
    from int4jit import backends
    from int4jit.benchmark import measure
    t_start = time.perf_counter()
    device = backends.device()
    date = datetime.date.today().isoformat()
    json_path = Path(args.out) / f"validate_selection{'-subset' if subset else ''}-{date}.json"
    bw = copy_bandwidth()
    print(f"{device.name} ({device.arch}): copy bandwidth {bw / 1e12:.2f} TB/s; writing {json_path}", flush=True)
    doc = {"device": device_facts(device), "date": date, "int4jit": __version__,
           "compiler": backends.module_for_arch(device.arch).compiler_version(), "copy_Bps": bw, "subset": subset,
           "environment": dict(found for v in plan.PLAN_VARIABLES if (found := env_lookup(v)) is not None),
           "rows": [], "not_measured": []}
    targets = {c: plan.target(c.shape, device.arch, device) for c in cases}
    specs = {c: candidate_specs(c.shape, *targets[c], device) for c in cases}
    print(f"{sum(map(len, specs.values()))} candidates over {len(cases)} shapes", flush=True)
    compile_all([s for c in cases for s in specs[c]], args.jobs)
    for c in cases:
        if args.time_budget is not None and time.perf_counter() - t_start >= args.time_budget:
            doc["not_measured"].append(c.shape.key())
            continue
        arch, kernel, pdl = targets[c]
        t0 = time.perf_counter()
        times = {s.label(): t for s, t in measure(device, specs[c]).items()}
        row = {"model": c.model, "projection": c.projection, "shape": c.shape.key(), "kernel": kernel, "pdl": pdl,
               "measure_s": round(time.perf_counter() - t0, 2), "candidates": times}
        row.update(picks(c.shape, arch, kernel, pdl, device, times))
        doc["rows"].append(row)
        write_json(doc, json_path)
        print(f"{c.shape.key():24s} {len(times):3d} candidates in {row['measure_s']:5.1f} s: best {row['best']} "
              f"{fmt(row['best_us'], '.2f')} µs; tuned/best {fmt(row['tuned_vs_best'], '.3f')}, "
              f"heuristic/tuned {fmt(row['heuristic_vs_tuned'], '.3f')}", flush=True)
        if args.field:
            print(f"{'':24s} {field_ab(times, args.field)}", flush=True)
    if doc["not_measured"]:
        print(f"--time-budget {args.time_budget} s reached: not measured: {', '.join(doc['not_measured'])}")
        write_json(doc, json_path)
    return doc, json_path


def recompute(path: Path) -> dict:
    """A saved run with its picks recomputed by this checkout's tuner (no GPU)."""
    doc = json.loads(path.read_text())
    stand_in = SimpleNamespace(**doc["device"])
    for row in doc["rows"]:
        row.update(picks(parse_key(row["shape"]), stand_in.arch, row["kernel"], row["pdl"], stand_in,
                         row["candidates"]))
    return doc


# -- the report --------------------------------------------------------------------------------
def markdown(doc: dict, json_name: str) -> str:
    rows, bw = doc["rows"], doc["copy_Bps"]
    n = len(rows)
    tuned_ok = sum(within(r["tuned_vs_best"], TUNED_WITHIN) for r in rows)
    heuristic_ok = sum(within(r["heuristic_vs_tuned"], HEURISTIC_WITHIN) for r in rows)
    met = "met" if n and heuristic_ok >= HEURISTIC_SHARE * n else "not met"
    lines = [f"The default tuner and the no-GPU heuristic on {n} shapes outside int4jit/table.json (issue 18), "
             f"{doc['device']['name']}, {doc['date']}, int4jit {doc['int4jit']}, {doc['compiler']} (copy "
             f"{bw / 1e12:.2f} TB/s; `python3 bench/validate_selection.py`; every candidate in "
             f"results/{json_name}).", "",
             "Every (BS, TN) of the 9-point grid with every variant of the exhaustive variant space was measured; "
             "*best* is the fastest of them, *tuned* what the default tuner picks from the same times (the grid at "
             "the default variant, then the variants at its winner), *heuristic* the pick made without a GPU (the "
             "modelled best of the grid, at the default variant).", "",
             f"**Tuned within {100 * (TUNED_WITHIN - 1):.0f}% of best on {tuned_ok}/{n}; heuristic within "
             f"{100 * (HEURISTIC_WITHIN - 1):.0f}% of tuned on {heuristic_ok}/{n} (target >= "
             f"{100 * HEURISTIC_SHARE:.0f}%: {met}).**", "",
             "| model | projection | N×K/group | kernel | candidates | best | µs | tuned | µs | tuned/best | "
             "% copy BW | heuristic | µs | heuristic/tuned |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pct = 100 * parse_key(r["shape"]).bytes_moved / (r["tuned_us"] * 1e-6) / bw if r["tuned_us"] else None
        flag = lambda v, bar: fmt(v, ".3f") + ("" if within(v, bar) else " ✗")
        lines.append(f"| {r['model']} | {r['projection']} | {r['shape']} | {r['kernel']} | {len(r['candidates'])} | "
                     f"{r['best']} | {fmt(r['best_us'], '.2f')} | {r['tuned']} | {fmt(r['tuned_us'], '.2f')} | "
                     f"{flag(r['tuned_vs_best'], TUNED_WITHIN)} | {fmt(pct, '.0f')}% | {r['heuristic']} | "
                     f"{fmt(r['heuristic_us'], '.2f')} | {flag(r['heuristic_vs_tuned'], HEURISTIC_WITHIN)} |")
    if doc["environment"]:
        lines += ["", "Set in the run's environment: " + ", ".join(f"{k}={v}" for k, v in doc["environment"].items()) + "."]
    missing = [f"{r['shape']} ({', '.join(r['missing'])})" for r in rows if r["missing"]]
    if missing:
        lines += ["", "Picks this int4jit makes that the run did not measure (counted as failed): "
                  + "; ".join(missing) + "."]
    if doc["not_measured"]:
        lines += ["", f"Not measured (the run reached its time budget first): {', '.join(doc['not_measured'])}."]
    return "\n".join(lines)


def report(doc: dict, json_path: Path, results_md: Path | None):
    body = markdown(doc, json_path.name)
    print(body)
    if results_md is not None:
        write_section(SECTION, body, results_md)
        print(f"wrote the '{SECTION}' section of {results_md}")


def select_cases(text: str | None, quick: bool) -> list[Case]:
    """--shapes (indices into VALIDATION or shape keys, comma-separated; a key outside the set is
    a case of its own) or --quick; else all."""
    by_key = {c.shape.key(): c for c in VALIDATION}
    if quick:
        return [by_key[k] for k in QUICK]
    if not text:
        return list(VALIDATION)
    cases = []
    for token in (t.strip() for t in text.split(",") if t.strip()):
        if token.isdigit() and int(token) < len(VALIDATION):
            cases.append(VALIDATION[int(token)])
        elif token in by_key:
            cases.append(by_key[token])
        else:
            try:
                cases.append(Case("given", "--shapes", parse_key(token)))
            except ValueError as e:
                raise ValueError(f"--shapes: {token!r} is neither an index 0..{len(VALIDATION) - 1} nor a shape key "
                                 f"such as 4608x3584/g128/asym or 35840x5120/g128/asym/m8 ({e})") from None
    return list(dict.fromkeys(cases))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", help="comma-separated: indices into the set (0-based, in the order of the "
                                     "report) or shape keys such as 4608x3584/g128/asym (any shape)")
    ap.add_argument("--quick", action="store_true", help=f"3 shapes ({', '.join(QUICK)}): a smoke test")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="compile processes (default: one a CPU)")
    ap.add_argument("--time-budget", type=float, metavar="SECONDS",
                    help="measure no further shape once this many seconds have passed (the rest are listed as "
                         "not measured)")
    ap.add_argument("--out", default=str(RESULTS_DIR), help="folder for the JSON (default bench/results)")
    ap.add_argument("--no-results-md", action="store_true", help=f"leave the '{SECTION}' section of "
                                                                 "bench/RESULTS.md alone")
    ap.add_argument("--from-json", metavar="PATH", help="no GPU: recompute the picks and the report from a saved run")
    ap.add_argument("--field", metavar="NAME", choices=[f.name for f in fields(Variant)],
                    help="per shape, the best candidate with this variant field at its default against the best "
                         "with it set otherwise")
    args = ap.parse_args()
    check_disjoint(VALIDATION)
    if args.from_json:
        path = Path(args.from_json)
        doc = recompute(path)
        if args.field:
            for row in doc["rows"]:
                print(f"{row['shape']:24s} {field_ab(row['candidates'], args.field)}")
    else:
        try:
            cases = select_cases(args.shapes, args.quick)
        except ValueError as e:
            ap.error(str(e))
        doc, path = run_on_gpu(args, cases, subset=bool(args.shapes or args.quick))
    report(doc, path, None if args.no_results_md or doc["subset"] else RESULTS_MD)


if __name__ == "__main__":
    main()
