"""Regenerate int4jit/table.json: tune the suite exhaustively (20-point grid) on this GPU
with int4jit's own tuner, and write every candidate's time to bench/results/ so the
heuristic can be scored against the winners (bench/score_heuristic.py).

    python3 bench/make_table.py [--out-dir DIR]      # needs a GPU; merges into table.json
    python3 bench/make_table.py --groups 32          # re-tune a part: rows and records of the rest stay
    python3 bench/make_table.py --dtype bfloat16 --groups 128 --search default   # bf16 rows (fp16 scales)

A bf16 row serves bf16 activations with either scale type; without one, a bf16 token takes the
fp16 row (int4jit.tuner.table_entry). `--search default` tunes as a user's first call does (a
row records it as "search": "default"); the shipped fp16 rows are exhaustive.

Every candidate is compiled first in parallel processes (bench/common.compile_all), then measured.

TODO(api): this script still reaches into int4jit internals (plan.target, tuner.search_space,
tuner.autotune(shape, kernel, dev, exhaustive=True) -> (record with .candidates/.us/.config,
winning spec), tuner.TABLE_PATH). A public tuning API that returns, per shape, the winning spec
and every candidate's time (e.g. `int4jit tune NxK --exhaustive --json`) and a public way to
write a table.json row would let it stop; the compiling already goes through int4jit warm's
compile_specs.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compile_all  # noqa: E402
from int4jit import backends, plan, tuner  # noqa: E402
from int4jit.shapes import GemvShape  # noqa: E402

SUITE = {
    "Qwen2.5-0.5B": [(1152, 896), (896, 896), (9728, 896), (896, 4864)],
    "Llama-3.2-1B": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)],
    "Llama-3-8B": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)],
    "Phi-4": [(7680, 5120), (5120, 5120), (35840, 5120), (5120, 17920)],
}
GROUPS = (32, 128)


def write(args, table, detail, arch):
    Path(args.table).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    out = Path(args.out_dir) / f"tuning-{arch}.json"
    out.write_text(json.dumps(detail, indent=1, sort_keys=True))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--table", default=str(Path(tuner.TABLE_PATH)))
    ap.add_argument("--symmetry", choices=("both", "asym", "sym"), default="both",
                    help="which zero-point kinds to tune (default both)")
    ap.add_argument("--groups", default=",".join(map(str, GROUPS)), help="comma-separated group sizes (default 32,128)")
    ap.add_argument("--models", default=",".join(SUITE), help=f"comma-separated, of {', '.join(SUITE)}")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="compile processes (default: one a CPU)")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16", help="activations (scales fp16)")
    ap.add_argument("--search", choices=("exhaustive", "default"), default="exhaustive",
                    help="the tuner's search (default: exhaustive, the 20-point grid and every variant field)")
    args = ap.parse_args()
    exhaustive = args.search == "exhaustive"
    groups = [int(g) for g in args.groups.split(",")]
    models = [m for m in args.models.split(",") if m]
    if any(m not in SUITE for m in models):
        ap.error(f"unknown model in {models}; models are {', '.join(SUITE)}")
    dev = backends.device()
    table = json.loads(Path(args.table).read_text())
    rows = table.setdefault(dev.arch, {})
    detail_path = Path(args.out_dir) / f"tuning-{dev.arch}.json"
    old = json.loads(detail_path.read_text())["records"] if detail_path.exists() else {}
    detail = {"device": dev.name, "arch": dev.arch, "date": time.strftime("%Y-%m-%d"), "records": old}
    todo = [(model, GemvShape(N, K, g, sym, 1, args.dtype)) for model in models for N, K in SUITE[model] for g in groups
            for sym in {"both": (False, True), "asym": (False,), "sym": (True,)}[args.symmetry]]
    targets = {shape: plan.target(shape, dev.arch, dev) for _, shape in todo}
    compile_all([spec for shape, (_, kernel, pdl) in targets.items()
                 for spec in tuner.search_space(shape, dev.arch, kernel, dev, exhaustive=exhaustive, pdl=pdl)], args.jobs)
    t_all = time.perf_counter()
    for model, shape in todo:
        t0 = time.perf_counter()
        _, kernel, pdl = targets[shape]
        rec, best = tuner.autotune(shape, kernel, dev, exhaustive=exhaustive, pdl=pdl)
        variant = {k: v for k, v in rec.config.items() if k not in ("BS", "TN")}
        rows[shape.key()] = {"config": [best.config.BS, best.config.TN], "us": round(rec.us, 3),
                             "model": model, **({"variant": variant} if variant else {}),
                             **({} if exhaustive else {"search": "default"})}
        detail["records"][shape.key()] = rec.candidates
        print(f"{model:13s} {shape.key():24s} -> {best.label()} {rec.us:8.2f} us "
              f"({shape.bytes_moved / rec.us / 1e3:5.0f} GB/s) tuned in {time.perf_counter() - t0:.1f} s",
              flush=True)
        write(args, table, detail, dev.arch)  # after every shape: a cut-off run keeps its rows
    out = write(args, table, detail, dev.arch)
    print(f"{len(detail['records'])} shapes in {time.perf_counter() - t_all:.0f} s; wrote {args.table} and {out}")


if __name__ == "__main__":
    main()
