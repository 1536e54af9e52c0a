"""Time every grid point for a few shapes with the tuner's own benchmark (graph replay,
rotating weight copies); prints us and % of copy bandwidth. Development aid."""
import sys, time
import torch
from int4jit import backends
from int4jit.shapes import GemvShape, candidate_grid
from int4jit import tuner

def copy_bw():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
    for _ in range(3): b.copy_(a)
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(7):
        s.record(); b.copy_(a); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return 2 * n / (ts[3] * 1e-3)

dev = backends.device()
bw = copy_bw()
print(f"{dev}  copy {bw/1e12:.2f} TB/s")
shapes = [(4096, 4096), (28672, 4096), (4096, 14336), (896, 896), (2048, 2048), (128256, 4096)]
if len(sys.argv) > 1:
    shapes = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]]
for N, K in shapes:
    for g in (128, 32):
        shape = GemvShape(N, K, g, False)
        t0 = time.perf_counter()
        times = tuner.benchmark(shape, dev, candidate_grid(True))
        wall = time.perf_counter() - t0
        ok = {c: t for c, t in times.items() if t}
        best = min(ok, key=ok.get)
        h = tuner.heuristic(shape, dev.arch, dev, True)
        floor = shape.weight_bytes / bw * 1e6
        row = " ".join(f"{c}:{t:.1f}" for c, t in sorted(ok.items()))
        print(f"{N}x{K} g{g}: best {best} {ok[best]:.2f}us = {100*floor/ok[best]:.0f}% bw | heur {h} {ok.get(h, float('nan')):.2f} | {wall:.1f}s\n   {row}", flush=True)
