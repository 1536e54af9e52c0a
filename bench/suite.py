"""int4jit against its peers on the tuner suite, in one process, on one GPU (issue 4).

Per shape and group: int4jit (the public call, torch tensors, out=; its first call tunes and
its INT4JIT_TRACE lines go into the JSON row), fp16 cuBLAS (F.linear), torch tinygemm
(_weight_int4pack_mm, bf16), bitsandbytes gemv_4bit (nf4, blocksize 64) and gemlite A16W4.
Every figure is graph replay over enough rotating weight copies to defeat L2, events, median
of 5 (the method of ../shared/bench/peers.py); bandwidth = int4 bytes (weights + scales +
zeros + x + y) / time, against the device-to-device copy bandwidth measured in this run.
Writes bench/results/<date>-h200.json, the "Peer suite" section of bench/RESULTS.md and a PNG plot.

Peers are benchmark-only: bitsandbytes travels as its wheel, gemlite's package folder is put
under .peers/ (bench/fetch_peers.sh prepares both)."""
import argparse
import datetime
import json
import logging
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (L2_DEFEAT, RESULTS_DIR, SUITE, graph_time, copy_bandwidth, int4_bytes,  # noqa: E402
                    import_gemlite, gpu_or_exit, write_section)

import int4jit  # noqa: E402

SECTION = "Peer suite"


def random_problem(rng, N, K, G):
    w = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
    s = (rng.random((N, K // G)) * 0.02 + 0.001).astype(np.float16)
    z = rng.integers(0, 16, size=(N, K // G), dtype=np.uint8)
    x = rng.standard_normal(K).astype(np.float16)
    return x, w, s, z


class _Decisions(logging.Handler):
    """Collects INT4JIT_TRACE's lines (which tier, which config) for the row's record."""
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def int4jit_row(N, K, G):
    """µs per call of int4jit.gemv (public API, torch tensors, out=) in graph replay over
    rotating weight copies, and the trace of its first (tuning) call."""
    import torch
    c = max(2, min(512, math.ceil(L2_DEFEAT / int4_bytes(N, K, G))))
    x = torch.randn(K, device="cuda", dtype=torch.float16)
    y = torch.empty(N, device="cuda", dtype=torch.float16)
    sets = [(torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8),
             torch.rand(N, K // G, device="cuda", dtype=torch.float16) * 0.01 + 0.001,
             torch.randint(0, 16, (N, K // G), device="cuda", dtype=torch.uint8)) for _ in range(c)]
    log = logging.getLogger("int4jit")
    rec, old = _Decisions(), os.environ.get("INT4JIT_TRACE")
    log.addHandler(rec)
    os.environ["INT4JIT_TRACE"] = "1"
    try:
        int4jit.gemv(x, *sets[0], out=y)
        torch.cuda.synchronize()
    finally:
        log.removeHandler(rec)
        os.environ.pop("INT4JIT_TRACE") if old is None else os.environ.__setitem__("INT4JIT_TRACE", old)
    us = graph_time([lambda t=t: int4jit.gemv(x, *t, out=y) for t in sets])
    del sets
    return us, rec.lines


def accuracy(N, K, G):
    import torch
    x, w, s, z = random_problem(np.random.default_rng(N * K + G), N, K, G)
    y = int4jit.gemv(*(torch.from_numpy(a).cuda() for a in (x, w, s, z))).cpu().numpy().astype(np.float64)
    ref = np.concatenate([int4jit.reference_gemv(x, w[i:i + 4096], s[i:i + 4096], z[i:i + 4096])
                          for i in range(0, N, 4096)])
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def peers(N, K, G, nbytes):
    import torch
    out = {}
    x16 = torch.randn(1, K, device="cuda", dtype=torch.float16)
    c = max(2, min(64, math.ceil(L2_DEFEAT / (N * K * 2))))
    Ws = [torch.randn(N, K, device="cuda", dtype=torch.float16) * 0.02 for _ in range(c)]
    out["fp16_cublas"] = graph_time([lambda W=W: torch.nn.functional.linear(x16, W) for W in Ws])
    del Ws
    c = max(2, min(512, math.ceil(L2_DEFEAT / nbytes)))
    try:
        xb = x16.to(torch.bfloat16)
        packs = [(torch._convert_weight_to_int4pack(torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8), 8),
                  torch.randn(K // G, N, 2, device="cuda", dtype=torch.bfloat16) * 0.01) for _ in range(c)]
        out["tinygemm"] = graph_time([lambda p=p: torch._weight_int4pack_mm(xb, p[0], G, p[1]) for p in packs])
        del packs
    except (RuntimeError, AttributeError) as e:
        out["tinygemm_err"] = repr(e)[:200]
    try:
        import bitsandbytes as bnb
        qs = [bnb.functional.quantize_4bit(torch.randn(N, K, device="cuda", dtype=torch.float16) * 0.02,
                                           blocksize=64, quant_type="nf4") for _ in range(max(2, min(256, math.ceil(L2_DEFEAT / (N * K // 2)))))]
        out["bnb_nf4"] = graph_time([lambda p=p: bnb.matmul_4bit(x16, p[0].t(), quant_state=p[1]) for p in qs])
        del qs
    except Exception as e:  # a peer that fails is reported, not fatal  # noqa: BLE001
        out["bnb_err"] = repr(e)[:200]
    try:
        GemLiteLinear, DType = import_gemlite()
        layers = []
        for _ in range(min(c, 32)):
            L = GemLiteLinear(4, group_size=G, in_features=K, out_features=N, input_dtype=DType.FP16, output_dtype=DType.FP16)
            L.pack(torch.randint(0, 16, (N, K), device="cuda", dtype=torch.uint8),
                   torch.rand(N, K // G, device="cuda", dtype=torch.float16) * 0.01,
                   torch.full((N, K // G), 8.0, device="cuda", dtype=torch.float16), None)
            layers.append(L)
        out["gemlite"] = graph_time([lambda L=L: L(x16) for L in layers])
        del layers
    except Exception as e:  # noqa: BLE001
        out["gemlite_err"] = repr(e)[:200]
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", help="comma-separated NxK subset of the suite (a trial run: nothing is written)")
    ap.add_argument("--groups", default="128,32", help="group sizes (default 128,32)")
    ap.add_argument("--from-log", metavar="FILE", nargs="+",
                    help="write RESULTS.md, the JSON and the plot from the rows runs printed (a run cut short, "
                         "or one run per group in separate calls); the first log's copy bandwidth is used")
    args = ap.parse_args()
    if args.from_log:
        return write_from_log([Path(f) for f in args.from_log])
    torch = gpu_or_exit("suite.py")
    suite = SUITE if not args.shapes else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    device = torch.cuda.get_device_name()
    bw = copy_bandwidth()
    print(f"{device}: copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for G in map(int, args.groups.split(",")):
        for N, K in suite:
            nbytes = int4_bytes(N, K, G)
            us, decisions = int4jit_row(N, K, G)
            row = {"N": N, "K": K, "group": G, "bytes": nbytes, "int4jit": us, "trace": decisions,
                   "rel_err": accuracy(N, K, G), **peers(N, K, G, nbytes)}
            best = min(row[k] for k in ("fp16_cublas", "tinygemm", "bnb_nf4", "gemlite") if k in row)
            row["pct_copy_bw"] = 100 * nbytes / (us * 1e-6) / bw
            row["speedup_vs_best_peer"] = best / us
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.shapes:
        return
    write_outputs(device, bw, rows, datetime.date.today().isoformat())


def write_from_log(paths):
    """Rebuild the outputs from runs' logs: a log's first line names the device, each JSON line
    is a row (a later log's row replaces an earlier one of the same shape); the exact copy
    bandwidth is recovered from the first row's bytes, time and % of it. Rows no log reached
    are listed as missing."""
    device, by_shape = None, {}
    for path in paths:
        text = path.read_text().splitlines()
        device = device or text[0].split(":")[0]
        for line in text:
            if line.startswith("{"):
                r = json.loads(line)
                by_shape[(r["N"], r["K"], r["group"])] = r
    order = {(N, K, G): i for i, (G, (N, K)) in enumerate((G, nk) for G in (128, 32) for nk in SUITE)}
    rows = sorted(by_shape.values(), key=lambda r: order.get((r["N"], r["K"], r["group"]), len(order)))
    r = rows[0]
    bw = r["bytes"] / (r["int4jit"] * 1e-6) / (r["pct_copy_bw"] / 100)
    missing = [f"{N}×{K} g{G}" for (N, K, G) in order if (N, K, G) not in by_shape]
    date = datetime.date.fromtimestamp(max(p.stat().st_mtime for p in paths)).isoformat()
    write_outputs(device, bw, rows, date, missing)


def write_outputs(device: str, bw: float, rows, date: str, missing=()):
    res_dir = RESULTS_DIR
    doc = {"device": device, "copy_Bps": bw, "date": date, "rows": rows, "missing": list(missing)}
    (res_dir / f"{date}-h200.json").write_text(json.dumps(doc, indent=1))
    lines = [f"int4jit vs peers, {device}, {date} (copy {bw / 1e12:.2f} TB/s; µs per call, graph replay; "
             "`python3 bench/suite.py`)", "",
             "| N×K | g | int4jit µs | GB/s | % copy BW | fp16 cuBLAS | tinygemm | bnb nf4 | gemlite | speed-up vs best peer | rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda r, k: f"{r[k]:.2f}" if k in r else "n/a"
    for r in rows:
        lines.append(f"| {r['N']}×{r['K']} | {r['group']} | {r['int4jit']:.2f} | {r['bytes'] / r['int4jit'] / 1e3:.0f} | "
                     f"{r['pct_copy_bw']:.0f}% | {f(r, 'fp16_cublas')} | {f(r, 'tinygemm')} | {f(r, 'bnb_nf4')} | "
                     f"{f(r, 'gemlite')} | {r['speedup_vs_best_peer']:.2f}× | {r['rel_err']:.1e} |")
    if missing:
        lines += ["", f"Not measured in this run (it reached its time limit first): {', '.join(missing)}."]
    lines += ["", f"![% of copy bandwidth](results/{date}-h200.png)"]
    write_section(SECTION, "\n".join(lines))
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not importable: no PNG")
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, label in [("int4jit", "int4jit"), ("fp16_cublas", "fp16 cuBLAS (4x bytes)"), ("tinygemm", "torch tinygemm"),
                       ("bnb_nf4", "bitsandbytes nf4"), ("gemlite", "gemlite A16W4")]:
        pts = sorted((r["bytes"], 100 * r["bytes"] / (r[key] * 1e-6) / bw) for r in rows if key in r and r["group"] == 128)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("int4 bytes moved per call (g=128)")
    ax.set_ylabel("% of copy bandwidth (int4 bytes)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.savefig(res_dir / f"{date}-h200.png", dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
