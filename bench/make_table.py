"""Regenerate int4jit/table.json: tune the suite exhaustively (20-point grid) on this GPU
with int4jit's own tuner, and write every candidate's time to bench/results/ so the
heuristic can be scored against the winners (bench/score_heuristic.py).

    python3 bench/make_table.py [--out-dir DIR]      # needs a GPU; merges into table.json

TODO(api): this script still reaches into int4jit internals (plan.target, tuner.autotune(shape,
kernel, dev, exhaustive=True) -> (record with .candidates/.us/.config, winning spec),
tuner.TABLE_PATH, backends.device(), GemvShape.key()/.bytes_moved). It needs a public tuning API that returns, per shape, the winning
spec (config + variant record) and every candidate's time, and a public way to write a
table.json row -- e.g. `int4jit tune N K --exhaustive --json` and `int4jit table merge FILE`.
Switch to those once the planner refactor (issue 17) lands; until then keep it working as is.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
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
    args = ap.parse_args()
    dev = backends.device()
    table = json.loads(Path(args.table).read_text())
    rows = table.setdefault(dev.arch, {})
    detail = {"device": dev.name, "arch": dev.arch, "date": time.strftime("%Y-%m-%d"), "records": {}}
    t_all = time.perf_counter()
    for model, shapes in SUITE.items():
        for N, K in shapes:
            for g in GROUPS:
                for sym in {"both": (False, True), "asym": (False,), "sym": (True,)}[args.symmetry]:
                    shape = GemvShape(N, K, g, sym)
                    t0 = time.perf_counter()
                    _, kernel, pdl = plan.target(shape, dev.arch, dev)
                    rec, best = tuner.autotune(shape, kernel, dev, exhaustive=True, pdl=pdl)
                    variant = {k: v for k, v in rec.config.items() if k not in ("BS", "TN")}
                    rows[shape.key()] = {"config": [best.config.BS, best.config.TN], "us": round(rec.us, 3),
                                         "model": model, **({"variant": variant} if variant else {})}
                    detail["records"][shape.key()] = rec.candidates
                    print(f"{model:13s} {shape.key():24s} -> {best.label()} {rec.us:8.2f} us "
                          f"({shape.bytes_moved / rec.us / 1e3:5.0f} GB/s) tuned in {time.perf_counter() - t0:.1f} s",
                          flush=True)
                    write(args, table, detail, dev.arch)  # after every shape: a cut-off run keeps its rows
    out = write(args, table, detail, dev.arch)
    print(f"{len(detail['records'])} shapes in {time.perf_counter() - t_all:.0f} s; wrote {args.table} and {out}")


if __name__ == "__main__":
    main()
