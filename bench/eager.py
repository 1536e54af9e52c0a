"""Eager per-call host time (a loop of 400 calls timed up to its last call's return, then a
synchronize outside the timing; the rows measured in turn, 15 rounds, median per row) of int4jit's
torch entry points against torch's own, at one shape (default 4096x4096, g=128):

  gemv, same x and out= tensor objects every call   (the per-call fast path)
  gemv, a new x and a new out every call             (as a model makes it; the allocation is
                                                      timed on its own and listed), a new x and no out
  Int4Linear forward, same x / a new x every call (fp16; bf16; 4 tokens)
  torch tinygemm (_weight_int4pack_mm, bf16), same x / a new x every call, and in an nn.Module
                                                     (as a model calls it; Int4Linear is one)
  F.linear fp16 (GPU-bound at this size: the weights are 4x the bytes)
  q, k, v of a Llama block on one new x (N x K, N/4 x K, N/4 x K): 3 Int4Linear calls, the
  same fused by quantize_model (one launch), 3 F.linear calls

    python3 bench/eager.py [--shape 4096x4096] [--group 128] [--calls 400] [--rounds 15] [--no-write]

Host time, not time per call with the GPU: at 4096x4096 a kernel runs 4-10 us on the GPU, as long
as the host's call, so a loop timed through its synchronize measures whichever is slower (the
driver's launch queue fills and the host waits). 400 launches stay well inside that queue.
A shared host drifts by up to 50% between runs (bench/RESULTS.md); measuring every row once per
round keeps the comparison between rows fair within a run.

Writes the "Eager per call" section of bench/RESULTS.md and bench/results/eager-<date>.json."""
import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, gpu_or_exit, tinygemm_mm, tinygemm_pack, write_section  # noqa: E402


def per_call(fn, n, torch):
    """µs of host time per fn() call: n calls on an idle GPU, timed to the last call's return (the
    synchronize after them is not timed)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x4096", help="NxK (default 4096x4096)")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--calls", type=int, default=400, help="calls a round (within the launch queue)")
    ap.add_argument("--rounds", type=int, default=15, help="each row measured once per round; median")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    torch = gpu_or_exit("eager.py")
    import int4jit
    import int4jit.torch as i4t

    N, K = map(int, args.shape.split("x"))
    G = args.group
    n = args.calls
    x = torch.randn(K, dtype=torch.float16, device="cuda")
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
    s = torch.rand(N, K // G, dtype=torch.float16, device="cuda") * 0.01
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, device="cuda")
    out = torch.empty(N, dtype=torch.float16, device="cuda")
    rows = {}

    fns = {}

    def measure(name, fn):  # registered here, run in rounds below; a failing path is reported once
        try:
            fn()
            torch.cuda.synchronize()
            fns[name] = fn
        except Exception as e:  # one failing path is reported, the others still run  # noqa: BLE001
            rows[name + " (error)"] = repr(e)[:200]
            print(f"{name:48s} failed: {e!r}"[:300], flush=True)

    measure("allocate x and out (torch.empty_like x2)", lambda: (torch.empty_like(x), torch.empty_like(out)))
    measure("int4jit.gemv, same x and out=", lambda: int4jit.gemv(x, w, s, z, out=out))
    measure("int4jit.gemv, new x and new out", lambda: int4jit.gemv(torch.empty_like(x), w, s, z,
                                                                  out=torch.empty_like(out)))
    measure("int4jit.gemv, new x, no out", lambda: int4jit.gemv(torch.empty_like(x), w, s, z))
    lin = i4t.Int4Linear(w, s, z)
    x2 = x.reshape(1, K)
    measure("Int4Linear forward, same x", lambda: lin(x2))
    measure("Int4Linear forward, new x", lambda: lin(torch.empty_like(x2)))
    x2b, x4 = x2.to(torch.bfloat16), torch.randn(4, K, dtype=torch.float16, device="cuda")
    measure("Int4Linear forward, new x, bf16", lambda: lin(torch.empty_like(x2b)))
    measure("Int4Linear forward, new x, 4 tokens", lambda: lin(torch.empty_like(x4)))
    try:
        sz = torch.randn(K // G, N, 2, device="cuda", dtype=torch.bfloat16) * 0.01
        wp, sz = tinygemm_pack(w, sz)
        xb = x.to(torch.bfloat16).reshape(1, -1)
        measure("torch tinygemm (bf16), same x", lambda: tinygemm_mm(xb, wp, G, sz))
        measure("torch tinygemm (bf16), new x", lambda: tinygemm_mm(torch.empty_like(xb), wp, G, sz))

        class TinyGemmLinear(torch.nn.Module):  # tinygemm as a model holds it (Int4Linear is a module too)
            def forward(self, x):
                return tinygemm_mm(x, wp, G, sz)
        tiny = TinyGemmLinear()
        measure("torch tinygemm in an nn.Module (bf16), new x", lambda: tiny(torch.empty_like(xb)))
    except Exception as e:  # noqa: BLE001
        rows["torch tinygemm (error)"] = repr(e)[:200]
        print("tinygemm unavailable:", e)
    W16 = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
    measure("F.linear fp16, same x", lambda: torch.nn.functional.linear(x2, W16))

    # q, k and v as a Llama block calls them (N x K, then N/4 x K twice) on one new x: three
    # Int4Linear calls alone, fused by quantize_model (fuse_shared_inputs: one launch), F.linear
    def attention(fuse):
        block = torch.nn.Module()
        for name, rows_ in (("q", N), ("k", N // 4), ("v", N // 4)):
            setattr(block, name, i4t.Int4Linear(w[:rows_].clone(), s[:rows_].clone(), z[:rows_].clone()))
        if fuse:
            i4t.fuse_shared_inputs(block)
            for _ in range(2):  # its first calls show that q, k and v share x
                block.q(x2), block.k(x2), block.v(x2)
        return block

    def three(b):
        xn = torch.empty_like(x2)
        return b.q(xn), b.k(xn), b.v(xn)
    alone, fused = attention(False), attention(True)
    measure("q, k, v: 3 Int4Linear calls on a new x", lambda: three(alone))
    measure("q, k, v: fused (quantize_model), new x", lambda: three(fused))
    dense_qkv = [W16, W16[:N // 4], W16[N // 4:N // 2]]
    measure("q, k, v: 3 F.linear fp16, new x",
            lambda: [torch.nn.functional.linear(xn, W) for xn in [torch.empty_like(x2)] for W in dense_qkv])
    times = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            times[name].append(per_call(fn, n, torch))
    for name, ts in times.items():
        rows[name] = statistics.median(ts)
        print(f"{name:48s} {rows[name]:8.2f} µs/call  (rounds {min(ts):.2f}..{max(ts):.2f})", flush=True)
    # issue 19's check: Int4Linear's call with a new x against tinygemm's, as a model calls it and bare
    ours = rows.get("Int4Linear forward, new x")
    ratios = {f"Int4Linear new x / {peer}": ours / rows[peer] for peer in
              ("torch tinygemm in an nn.Module (bf16), new x", "torch tinygemm (bf16), new x")
              if ours is not None and peer in rows}
    for name, r in ratios.items():
        print(f"{name}: {r:.2f}")

    if args.no_write:
        return
    date = datetime.date.today().isoformat()
    device = torch.cuda.get_device_name()
    doc = {"device": device, "date": date, "N": N, "K": K, "group": G, "calls": n, "us_per_call": rows,
           "ratios": ratios, "torch": torch.__version__, "int4jit": int4jit.__version__}
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"eager-{date}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"{device}, {date}, {N}×{K} g{G}: host time per call ({n} calls timed to the last one's return), "
             f"rows in turn, median of {args.rounds} rounds (`python3 bench/eager.py`)", "", "| call | µs |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in rows.items()]
    lines += [""] + [f"{name}: {r:.2f}" for name, r in ratios.items()]
    write_section("Eager per call", "\n".join(lines))


if __name__ == "__main__":
    main()
