"""Prefill per layer (issue 19, item 3): Int4Linear on a prompt of many tokens against the dense
layer in the same dtype (cuBLAS), per Llama-3-8B projection, fp16 and bf16.

Int4Linear serves 17..chunked_tokens tokens with the kernel once per 16 tokens, and more with one
dequantising launch (templates/dequant.hip) into a fresh workspace, then torch.matmul. Rows, per
shape, dtype and token count, GPU time per call (CUDA events over back-to-back calls that walk
enough copies of the layer to defeat L2, up to 160, queued behind a spin of the GPU of 60 us a
call so that the host's time per call never shows; median of 5; one second of dense products
first warms the GPU up):

  dense        F.linear with the dense weight in the activation dtype (what the model ran before
               quantising): the baseline
  int4jit      Int4Linear's forward
  path         the path Int4Linear's forward took (Int4Linear.path): chunks, gemm or dense
  dequant + mm the dequantising launch then F.linear (Int4Linear's path above chunked_tokens
               where the GEMM does not serve)
  int4 GEMM    GemvWeights.matmul: x laid out for the GEMM, then the GEMM reading the int4
               weights (Hopper; Int4Linear's path from GEMM_MIN_TOKENS to GEMM_MAX_TOKENS)
  x layout, GEMM kernel   the two kernels of a GEMM call apart: GPU time of each launch (the
               profiler's kernel records, median of 3 passes over the copies), no gap between
  chunks of c  GemvWeights.launch_chunks: the kernel once per c tokens into one y (Int4Linear's
               path for 17..chunked_tokens tokens, c = 16); up to 128 tokens
  dequant      the dequantising launch alone (GemvWeights.dense into a kept workspace); its
               bandwidth (int4 bytes read + dense bytes written) against the copy bandwidth
               measured in this run

Two ways of cutting the work in row pieces were measured and dropped (docs/performance.md).

Int4Linear's output is checked against the dense layer's (relative difference, reported; > 1e-2
fails the row).

    python3 bench/prefill.py                              # 8B projections, 512 tokens, fp16 and bf16
    python3 bench/prefill.py --tokens 128,512,2048 --dtypes float16
    python3 bench/prefill.py --shapes 2048x2048,512x2048 --tokens 64,128,256,512   # any N x K

Writes the "Prefill per layer" section of bench/RESULTS.md and bench/results/prefill-<date>.json."""
import argparse
import datetime
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, copy_bandwidth, ev_time, gpu_or_exit, write_section  # noqa: E402

# Llama-3-8B's projections as a transformers model calls them (q, k and v apart; gate and up apart),
# and the two layers quantize_model fuses them into (fuse_shared_inputs): the dense row of those is
# one F.linear of the fused shape, which is faster than the model's separate ones.
SHAPES = {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate/up": (14336, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096), "q+k+v": (6144, 4096), "gate+up": (28672, 4096)}
ROTATE_BYTES = 200 << 20  # int4 bytes of distinct layer copies a timed pass walks
CHUNKS_UP_TO = 128  # token counts the chunked rows are measured at
QUEUE_AHEAD_MS = 0.06  # a call's host time is 20-40 us: the GPU spins this long a call of a pass
MAX_COPIES = 160  # small layers: past this the launch queue (~1000 launches) would hold the host back


def median_time(fn, calls: int) -> float:
    """µs of GPU time per call: the median of 5 event-timed passes of `calls` calls (ev_time warms
    up each, and queues each pass behind a spin of the GPU, so a layer whose host call takes about
    as long as its GPU work, as k/v's, is not timed by the host)."""
    return sorted(ev_time(fn, 1, queue_ahead_ms=QUEUE_AHEAD_MS * calls) for _ in range(5))[2] / calls


def warm_up(torch, seconds: float = 1.0) -> None:
    """Dense products for `seconds` before the first row, so the GPU's clocks and cuBLAS are up
    (the first row measured cold ran 2.7x slow once)."""
    a = torch.randn(512, 4096, dtype=torch.float16, device="cuda")
    b = torch.randn(4096, 4096, dtype=torch.float16, device="cuda")
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for _ in range(50):
            torch.nn.functional.linear(a, b)
        torch.cuda.synchronize()


def kernel_times(torch, fn, passes: int = 3) -> dict:
    """µs a launch of each int4jit kernel that fn() launches, by kind (xperm, gemm, ...): the
    profiler's CUDA kernel records (each kernel's own GPU time), the median over `passes` calls."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            fn()
        torch.cuda.synchronize()
    times: dict = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.name.startswith("int4jit_"):
            times.setdefault(e.name.split("_")[1], []).append(e.time_range.elapsed_us())
    return {kind: sorted(v)[len(v) // 2] for kind, v in times.items()}


def measure_shape(torch, name, N, K, T, dtype, copy_Bps, group):
    import int4jit
    from int4jit.torch import Int4Linear

    per_copy = N * K // 2
    copies = min(MAX_COPIES, max(2, -(-ROTATE_BYTES // per_copy)))
    dense_copies = max(2, min(copies, -(-(ROTATE_BYTES * 4) // (N * K * 2))))
    dev = "cuda"
    layers = []
    for _ in range(copies):
        w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
        s = (torch.rand(N, K // group, device=dev) * 0.02 + 0.001).to(torch.float16)
        z = torch.randint(0, 16, (N, K // group), dtype=torch.uint8, device=dev)
        layers.append(Int4Linear(w, s, z))
    gw = [int4jit.GemvWeights(m.w, m.scales, m.zeros) for m in layers]
    x = torch.randn(T, K, dtype=dtype, device=dev)
    ref_W = gw[0].dense(torch.empty(N, K, dtype=dtype, device=dev))
    dense_W = [ref_W] + [torch.randn(N, K, dtype=dtype, device=dev) * 0.02 for _ in range(dense_copies - 1)]
    y_ref = torch.nn.functional.linear(x, ref_W).float()

    def rel(y):
        return float((y.float() - y_ref).norm() / y_ref.norm())

    row = {"shape": f"{N}x{K}", "projection": name, "tokens": T, "dtype": str(dtype).replace("torch.", ""),
           "copies": copies}
    t_dense = median_time(lambda: [torch.nn.functional.linear(x, W) for W in dense_W], len(dense_W))
    row["dense_us"] = t_dense
    row["int4jit_rel_diff"] = rel(layers[0](x))
    row["int4jit_us"] = median_time(lambda: [m(x) for m in layers], copies)
    m = layers[0]
    row["path"] = m.path(x)
    ws = torch.empty(N, K, dtype=dtype, device=dev)
    t_deq = median_time(lambda: [g.dense(ws) for g in gw], copies)
    row["dequant_mm_us"] = median_time(lambda: [torch.nn.functional.linear(x, g.dense(ws)) for g in gw], copies)
    if T <= CHUNKS_UP_TO:  # the kernel once per chunk of tokens, into slices of one y
        y = torch.empty(T, N, dtype=dtype, device=dev)
        for c in (8, 16):
            row[f"chunks{c}_us"] = median_time(lambda: [g.launch_chunks(x, y, chunk=c) for g in gw], copies)
    if gw[0].gemm_unsupported(dtype) is None:
        y = torch.empty(T, N, dtype=dtype, device=dev)
        row["gemm_rel_diff"] = rel(gw[0].matmul(x, y))
        row["gemm_us"] = median_time(lambda: [g.matmul(x, y) for g in gw], copies)
        parts = kernel_times(torch, lambda: [g.matmul(x, y) for g in gw])
        row["gemm_xperm_us"], row["gemm_kernel_us"] = parts.get("xperm"), parts.get("gemm")
    row["dequant_us"] = t_deq
    row["dequant_pct_copy"] = 100 * (per_copy + N * K * 2) / (t_deq * 1e-6) / copy_Bps
    row["ok"] = row["int4jit_rel_diff"] <= 1e-2 and row.get("gemm_rel_diff", 0) <= 1e-2
    chunks = "".join(f"  chunks of {c} {row[f'chunks{c}_us']:7.1f}" for c in (8, 16) if f"chunks{c}_us" in row)
    gemm = (f"  gemm {row['gemm_us']:7.1f} (x layout {row['gemm_xperm_us'] or 0:.1f} + kernel "
            f"{row['gemm_kernel_us'] or 0:.1f})" if "gemm_us" in row else "")
    print(f"{name:9s} {N}x{K} T={T} {row['dtype']:8s} dense {t_dense:8.1f} us  int4jit {row['int4jit_us']:8.1f} "
          f"({row['int4jit_us'] / t_dense:.2f}x, {row['path']})  dequant {t_deq:7.1f} us "
          f"({row['dequant_pct_copy']:.0f}% copy)  dequant+mm {row['dequant_mm_us']:7.1f}{gemm}{chunks}"
          + ("" if row["ok"] else f"  WRONG: rel diff {row['int4jit_rel_diff']:.1e} "
             f"(gemm {row.get('gemm_rel_diff', 0):.1e})"), flush=True)
    del layers, dense_W, ws, gw
    torch.cuda.empty_cache()
    return row


def table(doc) -> str:
    lines = ["| projection | N×K | tokens | dtype | dense µs | Int4Linear µs | × dense | path | dequant + mm µs "
             "| int4 GEMM µs | x layout µs | chunks of 8 µs | chunks of 16 µs | dequant µs | dequant % copy | rel diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    opt = lambda r, k: f"{r[k]:.1f}" if r.get(k) is not None else "n/a"
    for r in doc["rows"]:
        lines.append(f"| {r['projection']} | {r['shape']} | {r['tokens']} | {r['dtype']} | {r['dense_us']:.1f} | "
                     f"{r['int4jit_us']:.1f} | {r['int4jit_us'] / r['dense_us']:.2f} | {r.get('path', 'n/a')} | "
                     f"{opt(r, 'dequant_mm_us')} | {opt(r, 'gemm_us')} | {opt(r, 'gemm_xperm_us')} | "
                     f"{opt(r, 'chunks8_us')} | {opt(r, 'chunks16_us')} | {r['dequant_us']:.1f} | "
                     f"{r['dequant_pct_copy']:.0f}% | {r['int4jit_rel_diff']:.1e} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated: {', '.join(SHAPES)}, or NxK")
    ap.add_argument("--tokens", default="512", help="comma-separated prompt lengths (default 512)")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--out", default=str(RESULTS_DIR), help="folder for the JSON (default bench/results)")
    args = ap.parse_args()
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    shapes = dict(SHAPES)
    for n in names:
        if n not in shapes:  # NxK: a shape of its own
            try:
                shapes[n] = tuple(int(v) for v in n.lower().split("x"))
            except ValueError:
                ap.error(f"unknown shape {n!r}: name one of {', '.join(SHAPES)} or give NxK")
            if len(shapes[n]) != 2:
                ap.error(f"shape {n!r}: give NxK")
    torch = gpu_or_exit("prefill.py")
    import int4jit

    dtypes = [getattr(torch, d.strip()) for d in args.dtypes.split(",") if d.strip()]
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    copy_Bps = copy_bandwidth()
    warm_up(torch)
    doc = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "copy_Bps": copy_Bps, "torch": torch.__version__, "int4jit": int4jit.__version__,
           "group": args.group, "rows": []}
    print(f"{doc['device']}: copy {copy_Bps / 1e12:.2f} TB/s", flush=True)
    out = Path(args.out) / f"prefill-{doc['date']}.json"
    for T in tokens:
        for dtype in dtypes:
            for name in names:
                N, K = shapes[name]
                doc["rows"].append(measure_shape(torch, name, N, K, T, dtype, copy_Bps, args.group))
                if not args.no_write:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(doc, indent=1))
    body = (f"{doc['device']}, {doc['date']}, torch {doc['torch']}, copy {copy_Bps / 1e12:.2f} TB/s, g={args.group} "
            f"asymmetric; GPU time per call, CUDA events over calls that walk distinct layer copies, queued ahead of "
            f"the GPU, median of 5 "
            f"(`python3 bench/prefill.py --tokens {args.tokens}`)\n\n{table(doc)}\n")
    print(body)
    if not args.no_write:
        write_section("Prefill per layer", body)
    return 0 if all(r["ok"] for r in doc["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
