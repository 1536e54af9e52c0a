"""Several tokens and bf16 in one launch (issue 19): µs per call of int4jit.gemv for M tokens in
fp16 and bf16 against one fp16 token, on the peer suite's shapes, graph replay over rotating
weights (as bench/suite.py), tuned as a user's first call tunes (what the tuner would measure is
compiled ahead, a shape at a time, in parallel).

Reported per shape and group: µs for each dtype and M; bf16 / fp16 at one token; M = 8 / M = 1
(fp16 M = 1 the base); the kernel that served each; the relative error of one call per cell
against a float64 dequantise-and-matmul on the GPU (fresh random data).

    python3 bench/tokens.py                                   # suite shapes, g128 and g32, M = 1, 8
    python3 bench/tokens.py --shapes 4096x4096 --tokens 1,2,4,8,16 --groups 128
    python3 bench/tokens.py --resume                          # go on with today's cut-short run

Writes bench/results/tokens-<date>.json after every shape and the "Several tokens and bf16"
section of bench/RESULTS.md once the default run (suite shapes, g128 and g32, M = 1, 8) is whole.
The first calls tune and the suite is long: where one process cannot finish (a time limit),
rerun it with --resume until the section is written; it skips the shapes today's JSON holds."""
import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import L2_DEFEAT, RESULTS_DIR, SUITE, compile_all, graph_time, gpu_or_exit, int4_bytes, write_section  # noqa: E402

import int4jit  # noqa: E402
from int4jit import plan  # noqa: E402
from int4jit.shapes import GemvShape  # noqa: E402

SECTION = "Several tokens and bf16"
BIG = 16 << 20  # the bar (M = 8 <= 1.2x M = 1) is for weights of 16 MB and more


def reference(torch, x, w, s, z, G):
    """float64 y [M, N] of canonical bytes, on the GPU: int4jit.reference_gemv is the same
    function on the CPU, too slow for 136 cells of up to 128256x4096 weights."""
    q = torch.stack((w & 15, w >> 4), dim=-1).reshape(w.shape[0], -1).double()
    q = q - z.double().repeat_interleave(G, dim=1)
    return x.double() @ (q * s.double().repeat_interleave(G, dim=1)).T


def rel_error(y, ref) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def specs_to_compile(shapes, groups, tokens, dtypes):
    """What the first calls will compile: the tuner's search space where they tune, else the plan."""
    out = []
    for (N, K) in shapes:
        for G in groups:
            for dtype in dtypes:
                for M in tokens:
                    shape = GemvShape(N, K, G, False, M, dtype)
                    p = plan.plan(shape, "sm_90", None)
                    out += plan.search_space(shape, "sm_90") if p.tier == "heuristic" else [p.spec]
    return list(dict.fromkeys(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", help="comma-separated NxK (default: the peer suite's 17)")
    ap.add_argument("--tokens", default="1,8", help="comma-separated M (default 1,8)")
    ap.add_argument("--groups", default="128,32")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="compile processes")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows of today's JSON (same tokens and groups) and measure only the shapes it lacks")
    args = ap.parse_args()
    torch = gpu_or_exit("tokens.py")
    shapes = SUITE if not args.shapes else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    tokens = [int(m) for m in args.tokens.split(",")]
    groups = [int(g) for g in args.groups.split(",")]
    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    date = datetime.date.today().isoformat()
    json_path = RESULTS_DIR / f"tokens-{date}.json"
    doc = {"date": date, "device": torch.cuda.get_device_name(), "tokens": tokens, "groups": groups,
           "int4jit": int4jit.__version__,
           "command": " ".join(["python3 bench/tokens.py", *(a for a in sys.argv[1:] if a != "--resume")]), "rows": []}
    if args.resume and json_path.exists():
        done = json.loads(json_path.read_text())
        if (done["tokens"], done["groups"], done["device"]) != (tokens, groups, doc["device"]):
            sys.exit(f"--resume: {json_path} measured tokens {done['tokens']}, groups {done['groups']} on "
                     f"{done['device']}; this run asks for {tokens}, {groups} on {doc['device']}")
        cells = {(r["N"], r["K"], r["group"], r["dtype"]) for r in done["rows"]}
        measured = {(N, K) for (N, K, _, _) in cells
                    if all((N, K, G, d) in cells for G in groups for d in dtypes)}  # a shape cut short goes again
        doc["rows"] = [r for r in done["rows"] if (r["N"], r["K"]) in measured]
        print(f"--resume: {len(measured)} shapes measured already ({json_path})")
        shapes = [s for s in shapes if s not in measured]
    rows = doc["rows"]
    print("| N×K | g | dtype | " + " | ".join(f"M={m} µs" for m in tokens) + " | bf16/fp16 M=1 | M=8 / M=1 fp16 | kernels | worst rel err |")
    for (N, K) in shapes:
        # Compiled a shape at a time, so a run cut short by a time limit keeps whole shapes (the
        # whole suite's search space took longer than one 230 s slice on an H100 host).
        compile_all(specs_to_compile([(N, K)], groups, tokens, list(dtypes)), args.jobs)
        for G in groups:
            c = max(2, min(512, math.ceil(L2_DEFEAT / int4_bytes(N, K, G))))
            sets = [(torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8),
                     torch.rand(N, K // G, device="cuda", dtype=torch.float16) * 0.01 + 0.001,
                     torch.randint(0, 16, (N, K // G), device="cuda", dtype=torch.uint8)) for _ in range(c)]
            base = None
            for name, dtype in dtypes.items():
                row = {"N": N, "K": K, "group": G, "dtype": name, "us": {}, "kernel": {}, "rel_err": {}}
                for m in tokens:
                    x = torch.randn(m, K, device="cuda", dtype=dtype)
                    y = torch.full((m, N), float("nan"), device="cuda", dtype=dtype)
                    int4jit.gemv(x, *sets[0], out=y)  # the first call: tunes where the shape needs it
                    row["rel_err"][m] = rel_error(y, reference(torch, x, *sets[0], G))
                    row["kernel"][m] = plan.target(GemvShape(N, K, G, False, m, name), "sm_90")[1]
                    row["us"][m] = graph_time([lambda t=t: int4jit.gemv(x, *t, out=y) for t in sets])
                    if base is None:
                        base = row["us"][m]
                fp16 = next((r for r in rows if (r["N"], r["K"], r["group"], r["dtype"]) == (N, K, G, "float16")), None)
                row["bf16_over_fp16_m1"] = row["us"][tokens[0]] / fp16["us"][tokens[0]] if name == "bfloat16" and fp16 else None
                row["m8_over_m1_fp16"] = row["us"][8] / base if 8 in row["us"] else None
                rows.append(row)
                ratio = f"{row['bf16_over_fp16_m1']:.2f}" if row["bf16_over_fp16_m1"] else "—"
                m8 = f"{row['m8_over_m1_fp16']:.2f}" if row["m8_over_m1_fp16"] else "—"
                print(f"| {N}×{K} | {G} | {name} | " + " | ".join(f"{row['us'][m]:.2f}" for m in tokens)
                      + f" | {ratio} | {m8} | {', '.join(sorted(set(row['kernel'].values())))} | "
                      f"{max(row['rel_err'].values()):.1e} |", flush=True)
            del sets
            torch.cuda.empty_cache()
            json_path.write_text(json.dumps(doc, indent=1))  # after every shape: a cut-short run keeps them
    if args.shapes is None and args.tokens == "1,8" and args.groups == "128,32":
        write_section(SECTION, markdown(doc))  # whole: this run measured every shape the JSON lacked


def markdown(doc) -> str:
    rows = doc["rows"]
    bf = sorted(r["bf16_over_fp16_m1"] for r in rows if r["bf16_over_fp16_m1"])
    big = sorted(r["m8_over_m1_fp16"] for r in rows if r["N"] * r["K"] // 2 >= BIG and r["m8_over_m1_fp16"])
    ratio = lambda v: f"{v:.2f}" if v else "—"
    lines = [f"{doc['device']}, {doc['date']}; µs per call, graph replay over rotating weights, tuned "
             f"(`python3 bench/tokens.py`); relative error of one call per cell against a float64 "
             f"dequantise-and-matmul.", "",
             f"- bf16 / fp16 at one token: {bf[0]:.2f}–{bf[-1]:.2f} over {len(bf)} rows (median {bf[len(bf) // 2]:.2f}).",
             f"- M = 8 / M = 1 fp16 on weights of 16 MB and more: {big[0]:.2f}–{big[-1]:.2f} over {len(big)} rows.", "",
             "| N×K | g | dtype | " + " | ".join(f"M={m} µs" for m in doc["tokens"])
             + " | bf16/fp16 M=1 | M=8 / M=1 fp16 | kernels | worst rel err |",
             "|---|---|---|" + "---|" * (len(doc["tokens"]) + 4)]
    for r in rows:
        us = {int(k): v for k, v in r["us"].items()}
        cells = [f"{r['N']}×{r['K']}", str(r["group"]), r["dtype"], *(f"{us[m]:.2f}" for m in doc["tokens"]),
                 ratio(r["bf16_over_fp16_m1"]), ratio(r["m8_over_m1_fp16"]), ", ".join(sorted(set(r["kernel"].values()))),
                 f"{max(r['rel_err'].values()):.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
