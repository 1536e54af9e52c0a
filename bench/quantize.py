"""Quantizing time and memory (issue 19, item 4): int4jit.quantize of one large matrix on the
CPU (numpy: seconds, and the peak of numpy's allocations during the call, which tracemalloc
sees), and where torch has a GPU, the same matrix on the GPU (torch: ms, median of 5 after a
warm-up, checked bit for bit against numpy) and quantize_model of a Llama built from a config
(Llama-3-8B shapes, --layers layers, random fp16 weights) on the GPU.

Targets: 28672x4096 on the CPU machine in <= 2 s with <= 1 GB beyond W; quantize_model of an
8B-parameter model in <= 15 s on the H200 (`--layers 32`).

    python3 bench/quantize.py [--shape 28672x4096] [--group 128] [--layers 4] [--no-write]

Writes the "Quantizing" section of bench/RESULTS.md and bench/results/quantize-<date>.json."""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, write_section  # noqa: E402


def on_the_cpu(N: int, K: int, group: int, dtype) -> tuple:
    """(row: seconds and peak MB of numpy allocations for one quantize call of an [N, K] W of `dtype`, W, result)."""
    from int4jit.reference import quantize
    W = (np.random.default_rng(0).standard_normal((N, K), dtype=np.float32) * 0.02).astype(dtype)
    quantize(W[:group], group)  # first-call imports out of the timing
    tracemalloc.start()
    t0 = time.perf_counter()
    out = quantize(W, group)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return dict(dtype=str(np.dtype(dtype)), seconds=round(seconds, 3), peak_mb=round(peak / 2**20),
                w_mb=W.nbytes >> 20, out_mb=sum(a.nbytes for a in out if a is not None) >> 20), W, out


def on_the_gpu(torch, W: np.ndarray, group: int, want) -> dict:
    """ms of quantize on the GPU for numpy's W (median of 5) and whether it equals numpy's result."""
    from int4jit.reference import quantize
    Wd = torch.from_numpy(W).cuda()
    times = []
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        got = quantize(Wd, group)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    equal = all((a is None and b is None) or np.array_equal(a.cpu().numpy(), b) for a, b in zip(got, want))
    return dict(ms=round(statistics.median(times[1:]) * 1e3, 2), equal_to_numpy=equal)


def quantize_model_s(torch, layers: int, group: int) -> dict:
    """Seconds for int4jit.torch.quantize_model of a Llama with Llama-3-8B shapes on the GPU."""
    import int4jit.torch as i4t
    from e2e_decode import CONFIGS, build_base
    model = build_base(torch, dict(CONFIGS["8b"], num_hidden_layers=layers))
    params = sum(p.numel() for p in model.parameters())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    i4t.quantize_model(model, group_size=group)
    torch.cuda.synchronize()
    return dict(layers=layers, params_b=round(params / 1e9, 2), seconds=round(time.perf_counter() - t0, 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="28672x4096", help="NxK of the matrix (default 28672x4096)")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4, help="layers of the model quantize_model takes (GPU; 32: the 8B)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    N, K = map(int, args.shape.split("x"))
    import int4jit
    doc = dict(date=datetime.date.today().isoformat(), int4jit=int4jit.__version__, shape=args.shape, group=args.group,
               cpu=platform.processor() or platform.machine(), cpus=os.cpu_count(), cpu_rows=[])
    for dtype in (np.float16, np.float32):
        row, W, out = on_the_cpu(N, K, args.group, dtype)
        doc["cpu_rows"].append(row)
        print(f"CPU {row['dtype']}: {row['seconds']} s, peak {row['peak_mb']} MB (W {row['w_mb']} MB)", flush=True)
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if gpu:
        doc["device"] = torch.cuda.get_device_name()
        doc["gpu"] = on_the_gpu(torch, W, args.group, out)
        print(f"GPU {doc['device']}: {doc['gpu']}", flush=True)
        try:
            doc["quantize_model"] = quantize_model_s(torch, args.layers, args.group)
        except ImportError as e:
            doc["quantize_model"] = dict(error=f"needs transformers ({e})")
        print(f"quantize_model: {doc['quantize_model']}", flush=True)
    lines = [f"{doc['date']}, {args.shape} g={args.group} asymmetric (`python3 bench/quantize.py`); CPU ({doc['cpus']} cores): "
             + "; ".join(f"{r['dtype']} W ({r['w_mb']} MB) {r['seconds']} s, peak numpy allocations during the call "
                         f"{r['peak_mb']} MB" for r in doc["cpu_rows"])]
    if gpu:
        q = doc["quantize_model"]
        lines.append(f"\n{doc['device']}: the same matrix (float32) {doc['gpu']['ms']} ms, equal to numpy's: "
                     f"{doc['gpu']['equal_to_numpy']}; quantize_model of Llama-3-8B shapes, "
                     + (q["error"] if "error" in q else f"{q['layers']} layers ({q['params_b']} B parameters): "
                        f"{q['seconds']} s"))
    print("\n".join(lines))
    if not args.no_write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / f"quantize-{doc['date']}{'' if gpu else '-cpu'}.json").write_text(json.dumps(doc, indent=1))
        write_section("Quantizing", "\n".join(lines))


if __name__ == "__main__":
    main()
