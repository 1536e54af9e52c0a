"""A whole decode step's GEMVs in one CUDA graph (issue 18): µs per token against the copy floor.

Per model and group, every projection of every layer plus lm_head (Llama-3-8B: 32 x [QKV
6144x4096, O 4096x4096, gate_up 28672x4096, down 4096x14336] + lm_head 128256x4096 = 129
GEMVs, 3.9 GB at g=128) with distinct random weights per layer, made on the GPU, captured
in one graph through the public API (torch tensors: `int4jit.GemvWeights(w, s, z)(x, out=y)`,
as Int4Linear runs, and `int4jit.gemv(x, w, s, z, out=y)`).
Each GEMV's x is a prefix view of the previous GEMV's output (the attention and the
activation function are left out: it is the chain of launches and its data dependency that
matter); a fixed input buffer where the previous output is shorter than K.

Reported per model, group and system: µs per token (graph replay after a warm-up, median of
5 runs of several replays), the floor (int4 bytes / copy bandwidth, the copy bandwidth
measured in this run as bench/suite.py does: 2 * bytes / time of a 2 GiB device copy) and %
of copy bandwidth = floor / time. Systems, one after the other in this process: int4jit (each
GEMV an int4jit.GemvWeights, as Int4Linear runs it), int4jit-gemv (int4jit.gemv on the tensors),
torch tinygemm (_weight_int4pack_mm, bf16) and gemlite A16W4 (fp16) where they import; a
peer that fails is recorded with its error and skipped. And stream-read, not a GEMV: one kernel a
GEMV that only reads that GEMV's bytes, the bound for any chain of one kernel per GEMV.

Checks (int4jit): after the replays, every GEMV run once eagerly on the same inputs must
equal the graph's output (bit-exact reported, relative difference <= 1e-3 required), and
the first O projection must match int4jit.reference_gemv (float64, CPU) within 2e-3.

    python3 bench/decode_chain.py                       # every model; g128 asym, g128 sym, g32 asym
    python3 bench/decode_chain.py --models llama3-8b --groups 128
    python3 bench/decode_chain.py --quick               # 2 layers a model: a smoke test

Writes bench/results/decode_chain-<date>.json (after every measurement: a run cut short
keeps what it measured), the "Decode chain" section of bench/RESULTS.md and a PNG
(matplotlib, if importable). --quick writes decode_chain-quick-<date>.json and leaves
RESULTS.md alone unless --results-md is given."""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (L2_DEFEAT, RESULTS_DIR, RESULTS_MD, capture, copy_bandwidth, gpu_or_exit,  # noqa: E402
                    graph_time, import_gemlite, int4_bytes, replay_time, tinygemm_mm, tinygemm_pack, write_section)

# hidden, intermediate, layers, QKV rows (q + k + v heads x head dim), vocabulary
MODELS = {
    "llama3-8b": dict(name="Llama-3-8B", hidden=4096, inter=14336, layers=32, qkv=6144, vocab=128256),
    "llama3.2-1b": dict(name="Llama-3.2-1B", hidden=2048, inter=8192, layers=16, qkv=3072, vocab=128256),
    "mistral-7b": dict(name="Mistral-7B", hidden=4096, inter=14336, layers=32, qkv=6144, vocab=32000),
    "llama2-7b": dict(name="Llama-2-7B", hidden=4096, inter=11008, layers=32, qkv=12288, vocab=32000),
    "qwen2.5-7b": dict(name="Qwen2.5-7B", hidden=3584, inter=18944, layers=28, qkv=4608, vocab=152064),
}
SYSTEMS = ("int4jit", "int4jit-gemv", "tinygemm", "gemlite", "stream-read")
SECTION = "Decode chain"


def chain_shapes(m: dict, layers: int) -> list[tuple[str, int, int]]:
    """(projection, N, K) of one decode step, in launch order."""
    h, i = m["hidden"], m["inter"]
    one = [("qkv", m["qkv"], h), ("o", h, h), ("gate_up", 2 * i, h), ("down", h, i)]
    return [p for _ in range(layers) for p in one] + [("lm_head", m["vocab"], h)]


def parse_group(text: str) -> tuple[int, bool]:
    """'128' -> (128, asym); '128sym' -> (128, sym)."""
    sym = text.endswith("sym")
    return int(text[:-3] if sym else text), sym


def group_label(g: int, sym: bool) -> str:
    return f"g{g} {'sym' if sym else 'asym'}"


def unit_scale(K: int, sym: bool) -> float:
    """A scale that keeps ||y|| ~ ||x|| for random nibbles (E (q - z)^2 = 42.5 asym, 21.5 sym),
    so 129 chained GEMVs neither overflow fp16 nor vanish."""
    return 1.0 / math.sqrt((21.5 if sym else 42.5) * K)


def chain_scales(torch, rows: int, cols: int, K: int, sym: bool, dtype=None):
    """[rows, cols] scales around unit_scale with random signs. The signs matter for symmetric
    weights: random nibbles average q - 8 = -0.5, so with positive scales every row of y shares a
    term -0.5 s sum(x), which the next layer multiplies by ~0.5 sqrt(K / 21.5) (7x at K = 4096)
    until fp16 overflows; random signs cancel it across rows."""
    sign = torch.randint(0, 2, (rows, cols), device="cuda").float() * 2 - 1
    s = (torch.rand(rows, cols, device="cuda") + 0.5) * unit_scale(K, sym) * sign
    return s.to(dtype or torch.float16)


# --- the chains --------------------------------------------------------------------------

def int4jit_chain(torch, shapes, G, sym, layers=True):
    """(ops, records): one call per shape, x a prefix view of the previous output. layers: each
    GEMV an int4jit.GemvWeights (what Int4Linear runs: fixed weights, so with PDL a call loads its
    first weights before waiting for the previous one); else int4jit.gemv on the tensors."""
    import int4jit
    x0 = torch.randn(max(K for _, _, K in shapes), device="cuda", dtype=torch.float16)
    prev, ops, recs = x0, [], []
    for proj, N, K in shapes:
        w = torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8)
        s = chain_scales(torch, N, K // G, K, sym)
        z = None if sym else torch.randint(0, 16, (N, K // G), device="cuda", dtype=torch.uint8)
        y = torch.empty(N, device="cuda", dtype=torch.float16)
        x = prev[:K] if prev.numel() >= K else x0[:K]
        if layers:
            call = lambda x, out, layer=int4jit.GemvWeights(w, s, z): layer(x, out=out)
        else:
            call = lambda x, out, w=w, s=s, z=z: int4jit.gemv(x, w, s, z, out=out)
        ops.append(lambda x=x, y=y, call=call: call(x, y))
        recs.append(dict(proj=proj, x=x, w=w, s=s, z=z, y=y, call=call))
        prev = y
    return ops, recs


def tinygemm_chain(torch, shapes, G, sym):
    """torch tinygemm: bf16 activations, scales-and-zeros [K/G, N, 2] bf16, 8 inner K tiles."""
    x0 = torch.randn(1, max(K for _, _, K in shapes), device="cuda", dtype=torch.bfloat16)
    packs = []
    for _, N, K in shapes:
        sz = torch.zeros(K // G, N, 2, device="cuda", dtype=torch.bfloat16)
        sz[..., 0] = chain_scales(torch, K // G, N, K, True, torch.bfloat16)
        packs.append((K,) + tinygemm_pack(torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8), sz))
    state = {}

    def run():
        prev = x0
        for K, wp, sz in packs:
            x = prev[:, :K] if prev.shape[1] >= K else x0[:, :K]
            prev = tinygemm_mm(x, wp, G, sz)
        state["y"] = prev
    return [run], packs


def gemlite_chain(torch, shapes, G, sym):
    """gemlite A16W4, fp16 in and out, zero points 8 for the symmetric case."""
    GemLiteLinear, DType = import_gemlite()
    x0 = torch.randn(1, max(K for _, _, K in shapes), device="cuda", dtype=torch.float16)
    layers = []
    for _, N, K in shapes:
        L = GemLiteLinear(4, group_size=G, in_features=K, out_features=N,
                          input_dtype=DType.FP16, output_dtype=DType.FP16)
        q = torch.randint(0, 16, (N, K), device="cuda", dtype=torch.uint8)
        L.pack(q, chain_scales(torch, N, K // G, K, True),
               torch.full((N, K // G), 8.0, device="cuda", dtype=torch.float16), None)
        del q
        layers.append((K, L))

    def run():
        prev = x0
        for K, L in layers:
            x = prev[:, :K] if prev.shape[1] >= K else x0[:, :K]
            prev = L(x)
    return [run], layers


# A kernel that only reads: every 16-byte word of its buffer once (4 loads in flight a thread,
# streaming past L1), xor-folded; one store if the fold hits a constant (never, in practice).
READ_SOURCE = r"""
extern "C" __global__ void read_bytes(const uint4* __restrict__ p, long long n, unsigned* out) {
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 v0 = __ldcs(p + i), v1 = __ldcs(p + i + stride), v2 = __ldcs(p + i + 2 * stride),
                    v3 = __ldcs(p + i + 3 * stride);
        a.x ^= v0.x ^ v1.x ^ v2.x ^ v3.x; a.y ^= v0.y ^ v1.y ^ v2.y ^ v3.y;
        a.z ^= v0.z ^ v1.z ^ v2.z ^ v3.z; a.w ^= v0.w ^ v1.w ^ v2.w ^ v3.w;
    }
    for (; i < n; i += stride) {
        const uint4 v = __ldcs(p + i);
        a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u) out[0] = 1u;
}
"""


def stream_read_chain(torch, shapes, G, sym):
    """Not a GEMV: one launch a GEMV that reads exactly that GEMV's bytes (weights, scales, zero
    points) and computes nothing (cupy, 256 threads, up to 8 blocks a multiprocessor, each thread
    one 16-byte word per 4*grid). What any chain of one memory-bound kernel per GEMV reaches on
    this GPU: the ramp, tail and launch gap of each call without any arithmetic."""
    import cupy
    kern = cupy.RawKernel(READ_SOURCE, "read_bytes")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(1, device="cuda", dtype=torch.int32)
    bufs = [torch.randint(0, 256, (-(-int4_bytes(N, K, G, sym) // 16) * 16,), device="cuda", dtype=torch.uint8)
            for _, N, K in shapes]

    def run():
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            for b in bufs:
                n = b.numel() // 16
                grid = min(8 * sms, -(-n // (256 * 4)))
                kern((grid,), (256,), (cupy.uint64(b.data_ptr()), cupy.int64(n), cupy.uint64(out.data_ptr())))
    return [run], bufs


BUILDERS = {"int4jit": int4jit_chain, "int4jit-gemv": lambda *a: int4jit_chain(*a, layers=False),
            "tinygemm": tinygemm_chain, "gemlite": gemlite_chain, "stream-read": stream_read_chain}


def check_int4jit(torch, recs) -> dict:
    """The graph's outputs against each GEMV called once eagerly (the same call, one at a time) on
    the same inputs, and the first O projection against the float64 reference on the CPU."""
    import numpy as np
    import int4jit
    torch.cuda.synchronize()
    exact, worst, finite = 0, 0.0, True
    for r in recs:
        y = r["call"](r["x"], torch.empty_like(r["y"]))
        torch.cuda.synchronize()
        g = r["y"].float()
        finite &= bool(torch.isfinite(g).all())
        exact += bool(torch.equal(y, r["y"]))
        worst = max(worst, float((y.float() - g).norm() / g.norm().clamp_min(1e-30)))
    o = next(r for r in recs if r["proj"] == "o")
    cpu = lambda t: None if t is None else t.cpu().numpy()
    ref = int4jit.reference_gemv(cpu(o["x"]), cpu(o["w"]), cpu(o["s"]), cpu(o["z"]))
    got = cpu(o["y"]).astype(np.float64)
    ref_err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    ok = finite and worst <= 1e-3 and ref_err <= 2e-3
    return dict(bit_exact=exact, gemvs=len(recs), worst_rel_diff_vs_eager=worst, outputs_finite=finite,
                o_proj_rel_err_vs_reference=ref_err, ok=ok)


def measure(torch, system, shapes, G, sym, reps) -> dict:
    t0 = time.perf_counter()
    ops, keep = BUILDERS[system](torch, shapes, G, sym)
    built = time.perf_counter() - t0
    g = capture(ops)  # the warm-up inside tunes and compiles (int4jit never tunes in a capture)
    warm = time.perf_counter() - t0 - built
    us = replay_time(g, reps)
    res = dict(us_per_token=us, build_s=round(built, 2), warmup_capture_s=round(warm, 2))
    if system.startswith("int4jit"):
        res["check"] = check_int4jit(torch, keep)
    del g, ops, keep
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return res


def per_shape(torch, shapes, G, sym, bw) -> dict:
    """int4jit alone on each distinct shape of the chain: µs per GEMV and % of copy bandwidth,
    graph replay over enough fresh weight copies to defeat L2 (bench/suite.py's method) -- where
    in the chain the time goes. The same for GemvWeights (fixed weights: `us_layers`), with the
    build each runs (`gemv`, `layers`)."""
    import int4jit
    from int4jit import backends, plan
    from int4jit.shapes import GemvShape
    res = {}
    for proj, N, K in dict(((N, K), (p, N, K)) for p, N, K in shapes).values():
        nbytes = int4_bytes(N, K, G, sym)
        c = max(2, min(512, math.ceil(L2_DEFEAT / nbytes)))
        x = torch.randn(K, device="cuda", dtype=torch.float16)
        y = torch.empty(N, device="cuda", dtype=torch.float16)
        sets = [(torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8),
                 chain_scales(torch, N, K // G, K, sym),
                 None if sym else torch.randint(0, 16, (N, K // G), device="cuda", dtype=torch.uint8))
                for _ in range(c)]
        us = graph_time([lambda t=t: int4jit.gemv(x, *t, out=y) for t in sets])
        layers = [int4jit.GemvWeights(*t) for t in sets]  # fixed weights: the early build where it applies
        us_layers = graph_time([lambda l=l: l(x, out=y) for l in layers])
        shape = GemvShape(N, K, G, sym)
        dev = backends.device(torch.cuda.current_device())
        res[f"{proj} {N}x{K}"] = dict(us=us, pct_copy_bw=100 * nbytes / (us * 1e-6) / bw, us_layers=us_layers,
                                      gemv=plan.plan(shape, dev.arch, dev).spec.label(),
                                      layers=plan.plan(shape, dev.arch, dev, fixed_weights=True).spec.label())
        del sets, layers
        torch.cuda.empty_cache()
    return res


# --- outputs -----------------------------------------------------------------------------

def write_json(doc, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def markdown(doc) -> str:
    bw = doc["copy_Bps"]
    lines = [f"{doc['device']}, {doc['date']}, copy {bw / 1e12:.2f} TB/s; one decode step's GEMVs in one "
             f"CUDA graph, µs per token (median of 5), % = floor / time "
             f"(`python3 bench/decode_chain.py{' --quick' if doc['quick'] else ''}`)", "",
             "| model | group | GEMVs | int4 GB | floor µs | " + " | ".join(f"{s} µs | %" for s in SYSTEMS)
             + " | chain = per-call |",
             "|---|---|---|---|---|" + "---|---|" * len(SYSTEMS) + "---|"]
    for r in doc["rows"]:
        cells = []
        for s in SYSTEMS:
            v = r.get(s, {})
            cells += ([f"{v['us_per_token']:.0f}", f"{100 * r['floor_us'] / v['us_per_token']:.0f}%"]
                      if "us_per_token" in v else ["n/a", ""])
        chk = r.get("int4jit", {}).get("check")
        ok = "n/a" if not chk else (f"{'yes' if chk['ok'] else 'NO'} ({chk['bit_exact']}/{chk['gemvs']} bit-exact, "
                                    f"ref {chk['o_proj_rel_err_vs_reference']:.1e})")
        lines.append(f"| {r['model']} | {r['group_label']} | {r['gemvs']} | {r['bytes'] / 1e9:.2f} | "
                     f"{r['floor_us']:.0f} | " + " | ".join(cells) + f" | {ok} |")
    skipped = sorted({f"{s}: {r[s]['error'].splitlines()[0][:120]}" for r in doc["rows"] for s in SYSTEMS
                      if "error" in r.get(s, {})})
    if skipped:
        lines += ["", "Not measured: " + "; ".join(skipped)]
    per = [(r, k, v) for r in doc["rows"] for k, v in r.get("int4jit_per_shape", {}).items() if isinstance(v, dict)]
    if per:
        lines += ["", "int4jit on each shape of the chain alone (graph replay, rotating copies): "
                  + "; ".join(f"{r['model']} {r['group_label']} {k} {v['pct_copy_bw']:.0f}%" for r, k, v in per)]
    lines += ["", "stream-read is not a GEMV: one launch a GEMV that only reads that GEMV's bytes (no arithmetic): "
              "what any chain of one memory-bound kernel per GEMV reaches on this GPU."]
    if doc.get("note"):
        lines += ["", doc["note"]]
    if doc.get("png"):
        lines += ["", f"![µs per token](results/{doc['png']})"]
    return "\n".join(lines)


def plot(doc, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no PNG", flush=True)
        return False
    groups = list(dict.fromkeys(r["group_label"] for r in doc["rows"]))
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, gl in zip(axes[0], groups):
        rows = [r for r in doc["rows"] if r["group_label"] == gl]
        width = 0.8 / len(SYSTEMS)
        for j, s in enumerate(SYSTEMS):
            xs = [i + (j - (len(SYSTEMS) - 1) / 2) * width for i, r in enumerate(rows) if "us_per_token" in r.get(s, {})]
            ys = [r[s]["us_per_token"] for r in rows if "us_per_token" in r.get(s, {})]
            if ys:
                ax.bar(xs, ys, width, label=s)
        for i, r in enumerate(rows):
            ax.plot([i - 0.45, i + 0.45], [r["floor_us"]] * 2, color="black", lw=1.5,
                    label="floor (bytes / copy BW)" if i == 0 else None)
        ax.set_xticks(range(len(rows)), [r["model"] for r in rows], rotation=20)
        ax.set_ylabel("µs per token (GEMVs only)")
        ax.set_title(gl)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--groups", default="128,128sym,32", help="comma-separated: 128 (asymmetric), 128sym, 32, ...")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--quick", action="store_true", help="2 layers a model and fewer replays: a smoke test")
    ap.add_argument("--layers", type=int, help="layers a model (default: the model's; 2 with --quick)")
    ap.add_argument("--reps", type=int, help="replays per timed run (default 20; 5 with --quick)")
    ap.add_argument("--no-per-shape", action="store_true",
                    help="skip timing int4jit on each distinct shape of the chain on its own")
    ap.add_argument("--out", default=str(RESULTS_DIR), help="folder for the JSON and the PNG (default bench/results)")
    ap.add_argument("--results-md", help="markdown file whose 'Decode chain' section is replaced "
                    "(default bench/RESULTS.md; none with --quick unless given; '' for none)")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown or any(s not in SYSTEMS for s in systems):
        ap.error(f"unknown model or system: {unknown or systems}; models are {', '.join(MODELS)}")
    groups = [parse_group(g.strip()) for g in args.groups.split(",") if g.strip()]
    reps = args.reps or (5 if args.quick else 20)
    md = Path(args.results_md) if args.results_md else (None if args.quick or args.results_md == "" else RESULTS_MD)

    torch = gpu_or_exit("decode_chain.py")
    import int4jit
    date = datetime.date.today().isoformat()
    out = Path(args.out)
    json_path = out / f"decode_chain{'-quick' if args.quick else ''}-{date}.json"
    bw = copy_bandwidth()
    device = torch.cuda.get_device_name()
    print(f"{device}: copy bandwidth {bw / 1e12:.2f} TB/s; writing {json_path}", flush=True)
    doc = dict(device=device, date=date, copy_Bps=bw, quick=args.quick, reps=reps, torch=torch.__version__,
               int4jit=int4jit.__version__, rows=[])
    for key in models:
        m = MODELS[key]
        layers = args.layers or (min(2, m["layers"]) if args.quick else m["layers"])
        shapes = chain_shapes(m, layers)
        for G, sym in groups:
            nbytes = sum(int4_bytes(N, K, G, sym) for _, N, K in shapes)
            row = dict(model=m["name"], key=key, layers=layers, group=G, symmetric=sym,
                       group_label=group_label(G, sym), gemvs=len(shapes), bytes=nbytes,
                       floor_us=nbytes / bw * 1e6, shapes=sorted({f"{N}x{K}" for _, N, K in shapes}))
            doc["rows"].append(row)
            for s in systems:
                print(f"{m['name']} {group_label(G, sym)} ({len(shapes)} GEMVs, {nbytes / 1e9:.2f} GB, "
                      f"floor {row['floor_us']:.0f} µs): {s} ...", flush=True)
                try:
                    row[s] = measure(torch, s, shapes, G, sym, reps)
                    r = row[s]
                    print(f"  {s}: {r['us_per_token']:.1f} µs/token, {100 * row['floor_us'] / r['us_per_token']:.0f}% "
                          f"of copy BW" + (f"; check {r['check']}" if "check" in r else ""), flush=True)
                except Exception as e:  # a system that fails is recorded, the others still run  # noqa: BLE001
                    row[s] = dict(error=f"{type(e).__name__}: {e}"[:500])
                    print(f"  {s} failed: {row[s]['error']}", flush=True)
                    traceback.print_exc(limit=3)
                    torch.cuda.empty_cache()
                write_json(doc, json_path)
            if "int4jit" in systems and not args.no_per_shape:
                try:
                    row["int4jit_per_shape"] = per_shape(torch, shapes, G, sym, bw)
                    print("  per shape: " + ", ".join(
                        f"{k} {v['us']:.1f} µs {v['pct_copy_bw']:.0f}% [{v['gemv']}] layers {v['us_layers']:.1f} µs "
                        f"[{v['layers']}]" for k, v in row["int4jit_per_shape"].items()), flush=True)
                except Exception as e:  # noqa: BLE001
                    row["int4jit_per_shape"] = dict(error=f"{type(e).__name__}: {e}"[:500])
                    torch.cuda.empty_cache()
                write_json(doc, json_path)
    png = json_path.with_suffix(".png")
    if plot(doc, png):
        doc["png"] = png.name
        write_json(doc, json_path)
    if md is not None:
        write_section(SECTION, markdown(doc), md)
        print(f"wrote the '{SECTION}' section of {md}")
    print(markdown(doc))
    failed = [r["model"] for r in doc["rows"] for s in ("int4jit", "int4jit-gemv")
              if not r.get(s, {}).get("check", {}).get("ok", True)]
    if failed:
        sys.exit(f"chain != per-call results or reference on: {failed}")


if __name__ == "__main__":
    main()
