"""gemv_tc.hip variants (keywords of compiler._tc_geometry) A/B'd in one process on the GPU.

1. correctness: random problems against the float64 reference over groups, symmetric and
   not, N not a multiple of the block's rows, K not a multiple of 128, several configs;
2. timing: best of the 20-point grid per variant on the suite's large and mid shapes, graph
   replay over rotating weight copies.

    python3 bench/proto/tc_ab.py [--quick | --mini] [--variants NAME ...] [--shapes NxKxG ...]
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from int4jit import compiler, launch, reference, tuner  # noqa: E402
from int4jit.shapes import GemvShape, LaunchConfig, candidate_grid  # noqa: E402

import variant  # noqa: E402


def use(kernel: str, pdl: bool = True, **keywords):
    os.environ["INT4JIT_KERNEL"] = kernel
    os.environ["INT4JIT_PDL"] = "1" if pdl else "0"
    variant.use(**keywords)
    launch._loaded.clear()


# What was tried, on the H200 (bench/NOTES.md): session 4 x in shared memory, ROLL, two
# accumulators, an L2 hint, a register cap (tc-variants-2026-12-02.txt: the streaming schedule
# won) and OFFSET (tc-offset-); session 5 LEAN (adopted: one fence per slot, unclamped refills),
# PERSIST with and without OFFSET (slower everywhere; removed), EARLY (the first batch asked of L2
# before griddepcontrol.wait) and AHEAD (each refill also prefetching 1-2 batches on) — both
# slower (tc-ab-session5-*); session 6 RAW_A + XPERM (adopted where streamed with two or more
# tiles a warp; slower on one tile and on g < 128: tc-ab-session6-raw-). Add a variant as a
# _tc_geometry keyword and an entry here.
KNOWN = {"tc": dict(kernel="tc"), "tc, no raw": dict(kernel="tc", raw_a=False, xperm=False),
         # session 7: x pre-paired wherever x is staged (one-tile streamed builds: without RAW_A)
         "xperm": dict(kernel="tc", xperm=True),
         # session 7: g < 128 and small shapes streamed too, x pre-paired, no RAW_A
         "stream+xperm": dict(kernel="tc", stream=True, raw_a=False, xperm=True),
         # session 7: each warp stages its own x ahead of its first weights, no block barrier
         "xwarp": dict(kernel="tc", xwarp=True),
         "xwarp+xperm": dict(kernel="tc", xwarp=True, xperm=True),
         "no xwarp": dict(kernel="tc", xwarp=False),
         # session 8: on the diagonal (g < 128) a lane's two chunks' scales in one load (the default)
         "narrow scales": dict(kernel="tc", wide_scales=False), "wide scales": dict(kernel="tc", wide_scales=True),
         # session 8: g < 128 streamed (ROLL, x staged per warp), with and without the L2 256-byte hint
         "roll": dict(kernel="tc", stream=True, raw_a=False, l2hint=False),
         "roll+l2": dict(kernel="tc", stream=True, raw_a=False),
         # session 8 (not yet run on a GPU): two blocks of a cluster split each row block's K,
         # their sums added in block 0's shared memory — finer balance where row blocks per SM
         # are not whole (5120x17920: 320 row blocks on 132 SMs)
         "kcluster": dict(kernel="tc", kcluster=2),
         # session 8 (not yet run on a GPU): registers capped so that the grid is one wave on the
         # H200's 132 SMs (28672x4096 g32 (128,4): 78 registers hold 6 blocks a SM, 896 need 7)
         "one wave": dict(kernel="tc", one_wave_sms=132),
         # session 8: g32 is latency-bound on its batch fence (ncu); twice the loads a lane
         # keeps in flight (UNROLL doubled) — slower on g128 in session 6, not tried on g32 since
         "8 loads": dict(kernel="tc", loads_in_flight=8)}
# (session 7 also tried the weights' L2 lines marked evict-first through createpolicy: no gain,
# 28672x4096 17.61 -> 18.58 us; removed.)
VARIANTS = {k: KNOWN[k] for k in ("tc", "tc, no raw")}


def correctness(dev, mini: bool = False):
    import torch
    rng = np.random.default_rng(7)
    worst = 0.0
    cases = [(4097, 4096, 128, False), (4096, 4096, 128, True), (1000, 2080, 16, True), (1001, 2080, 16, False),
             (7, 896, 32, False), (333, 4864, 64, False), (520, 1024, 256, False), (8192, 17920, 128, False),
             (1, 128, 128, True), (4096, 14336, 32, False), (33, 96, 32, True), (129, 4112, 16, False)]
    configs = (LaunchConfig(32, 2), LaunchConfig(128, 4), LaunchConfig(512, 16), LaunchConfig(64, 8), LaunchConfig(256, 2))
    if mini:
        cases, configs = cases[:6] + [(8192, 17920, 128, False), (129, 4112, 16, False)], configs[1:3]
    for N, K, g, sym in cases:
        shape = GemvShape(N, K, g, sym)
        x, w, s, z = reference.random_problem(shape, rng)
        ref = reference.reference_gemv(x, w, s, z)
        t = [None if a is None else torch.from_numpy(a).cuda() for a in (x, w, s, z)]
        for name, opts in VARIANTS.items():
            use(**opts)
            for cfg in configs:
                out = torch.full((N,), float("nan"), dtype=torch.float16, device="cuda")
                launch.load_kernel(dev, shape, cfg)(*(0 if a is None else a.data_ptr() for a in t), out.data_ptr())
                torch.cuda.synchronize()
                y = out.cpu().numpy().astype(np.float64)
                err = np.linalg.norm(y - ref) / np.linalg.norm(ref) if np.isfinite(y).all() else float("inf")
                worst = max(worst, err)
                if err > 2e-3:
                    print(f"  FAIL {shape.key()} {name} {cfg}: {err:.2e} "
                          f"({compiler.kernel_geometry(shape, cfg, dev.arch).template})", flush=True)
    print(f"correctness: worst relative error {worst:.2e} over {len(cases)} shapes x {len(VARIANTS)} variants x {len(configs)} configs", flush=True)


def timing(dev, quick: bool, mini: bool = False, only=None):
    shapes = [(28672, 4096, 128), (4096, 14336, 128), (128256, 4096, 128), (5120, 17920, 128),
              (4096, 4096, 128), (28672, 4096, 32), (4096, 14336, 32), (2048, 2048, 128), (896, 4864, 128),
              (896, 896, 128), (9728, 896, 128), (16384, 2048, 128), (6144, 4096, 128), (3072, 2048, 128)]
    if quick:
        shapes = shapes[:3]
    if mini:
        shapes = [(28672, 4096, 128), (4096, 14336, 128), (28672, 4096, 32)]
    if only:
        shapes = only
    print(f"{'shape':>22s} {'GB':>6s} " + " ".join(f"{k:>15s}" for k in VARIANTS)
          + "   (best of 20 configs: us, config)", flush=True)
    for N, K, g in shapes:
        shape = GemvShape(N, K, g, False)
        bufs = tuner.BenchBuffers(dev, shape)
        stream = dev.create_stream()
        cells = []
        try:
            for opts in VARIANTS.values():
                use(**opts)
                compiled = tuner._compile_all(shape, candidate_grid(not mini), dev.arch)
                times = {c: tuner.time_kernel(launch.load_kernel(dev, shape, c), bufs, stream)
                         for c, ok in compiled.items() if ok is not None}
                best = min(times, key=times.get)
                cells.append(f"{times[best]:6.2f} {str(best):>7s}")
        finally:
            dev.destroy_stream(stream)
            bufs.free()
        print(f"{shape.key():>22s} {shape.weight_bytes / 1e9:6.3f} " + " ".join(f"{c:>15s}" for c in cells), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mini", action="store_true", help="8 correctness cases x 2 configs; 3 shapes on the 9-point grid")
    ap.add_argument("--variants", nargs="+", choices=list(KNOWN), help=f"default: {' '.join(VARIANTS)}")
    ap.add_argument("--shapes", nargs="+", metavar="NxKxG", help="time these shapes instead")
    a = ap.parse_args()
    if a.variants:
        VARIANTS.clear()
        VARIANTS.update((k, KNOWN[k]) for k in a.variants)
    from int4jit import backends
    dev = backends.device()
    t0 = time.time()
    correctness(dev, a.mini)
    print(f"({time.time() - t0:.0f} s)", flush=True)
    timing(dev, a.quick, a.mini, a.shapes and [tuple(map(int, v.split("x"))) for v in a.shapes])
    print(f"({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
