"""What every bench script measures the same way: event timing, graph replay, the copy
bandwidth, the bytes a GEMV moves, the peers' set-up, and a section of bench/RESULTS.md.

The method is ../shared/bench/peers.py's: a graph walks enough distinct weights to defeat L2,
events time its replays, the median of 5 is kept; the copy bandwidth is a device-to-device
copy of 2 GiB, counting read + write (2 * bytes / time)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
L2_DEFEAT = 400 << 20  # bytes of distinct weights one graph replay walks
# The peer suite's (N, K): Qwen2.5-0.5B, Llama-3.2-1B, Llama-3-8B (+ lm_head) and Phi-3-medium projections.
SUITE = [(1152, 896), (896, 896), (9728, 896), (896, 4864), (3072, 2048), (2048, 2048), (16384, 2048),
         (2048, 8192), (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096),
         (7680, 5120), (5120, 5120), (35840, 5120), (5120, 17920)]

if str(ROOT) not in sys.path:  # run from a checkout: the int4jit beside bench/
    sys.path.insert(0, str(ROOT))


def ev_time(fn, iters: int, queue_ahead_ms: float = 0.0) -> float:
    """µs per fn() over `iters` back-to-back calls, timed with CUDA events. queue_ahead_ms: the GPU
    first spins that long (before the start event), so the host queues the calls ahead of it and
    the events time the GPU's work alone, however long the host takes a call."""
    import torch
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    if queue_ahead_ms:
        torch.cuda._sleep(int(queue_ahead_ms * 2e6))  # cycles, at ~2 GHz
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters * 1e3


def capture(ops):
    """One CUDA graph of every op in `ops`, after a warm-up run of each (which is where
    int4jit tunes and compiles: it never tunes inside a capture)."""
    import torch
    for op in ops:
        op()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for op in ops:
            op()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for op in ops:
            op()
    return g


def replay_time(g, reps: int, runs: int = 5) -> float:
    """Median over `runs` of the µs per replay of graph `g` (after one warm-up batch)."""
    ev_time(g.replay, reps)
    return sorted(ev_time(g.replay, reps) for _ in range(runs))[runs // 2]


def graph_time(ops) -> float:
    """µs per op: all `ops` in one graph, replayed; median of 5."""
    g = capture(ops)
    return replay_time(g, max(3, int(2000 / len(ops)))) / len(ops)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, read + write counted (2 * bytes / time)."""
    import torch
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    t = sorted(ev_time(lambda: b.copy_(a), 10) for _ in range(5))[2]
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / (t * 1e-6)


def int4_bytes(N: int, K: int, group: int, symmetric: bool = False) -> int:
    """Bytes one GEMV must move: int4 weights, fp16 scales, uint8 zero points, fp16 x and y."""
    groups = N * (K // group)
    return N * K // 2 + 2 * groups + (0 if symmetric else groups) + 2 * K + 2 * N


# --- peers -------------------------------------------------------------------------------

def tinygemm_pack(w_u8, scales_zeros_bf16, inner_k_tiles: int = 8):
    """torch's tinygemm int4 weight from canonical bytes [N, K/2]; (packed, scales_and_zeros).
    torch >= 2.5 takes uint8 [N, K/2]; older ones an int32 [N, K] of values 0..15."""
    import torch
    try:
        return torch.ops.aten._convert_weight_to_int4pack(w_u8, inner_k_tiles), scales_zeros_bf16
    except RuntimeError:
        q = torch.stack((w_u8 & 0xF, w_u8 >> 4), dim=-1).reshape(w_u8.shape[0], -1).to(torch.int32)
        return torch.ops.aten._convert_weight_to_int4pack(q, inner_k_tiles), scales_zeros_bf16


def tinygemm_mm(x_bf16, packed, group: int, scales_zeros):
    import torch
    return torch.ops.aten._weight_int4pack_mm(x_bf16, packed, group, scales_zeros)


def import_gemlite():
    """gemlite's GemLiteLinear and DType, from an installed package or .peers/ (bench/fetch_peers.sh);
    raises ImportError with the reason."""
    peers = str(ROOT / ".peers")
    if peers not in sys.path:
        sys.path.insert(0, peers)
    from gemlite import DType, GemLiteLinear
    return GemLiteLinear, DType


def gpu_or_exit(script: str):
    """torch with a CUDA device, or a one-line reason and exit status 2."""
    try:
        import torch
    except ImportError as e:
        sys.exit(f"{script}: needs torch ({e})")
    if not torch.cuda.is_available():
        sys.exit(f"{script}: no CUDA GPU visible to torch {torch.__version__}; nothing measured")
    return torch


# --- bench/RESULTS.md --------------------------------------------------------------------

def write_section(title: str, body: str, path: Path = RESULTS_MD):
    """Replace the `## title` section of RESULTS.md (up to the next `## `) by `body`, or
    append it; the other scripts' sections stay as they are."""
    text = path.read_text() if path.exists() else "# int4jit benchmark results\n"
    section = f"## {title}\n\n{body.rstrip()}\n"
    pat = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pat.search(text):
        text = pat.sub(lambda m: section + "\n", text, count=1).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)


# -- compiling ahead of measuring ---------------------------------------------------------------
def compile_all(specs: list, jobs: int):
    """Compile what the code cache lacks in `jobs` processes (int4jit warm's compile_specs), so
    that measure() finds every build on disk (one that fails is measured as failed)."""
    import time

    from int4jit.cli import compile_specs
    t0 = time.perf_counter()
    compiled, failed = compile_specs(specs, jobs)
    print(f"compiled {len(compiled)} kernels in {time.perf_counter() - t0:.0f} s with {jobs} processes "
          f"({len(set(specs)) - len(compiled)} were in the code cache; {len(failed)} failed, measured as failed)",
          flush=True)
    for spec, error in list(failed.items())[:5]:
        print(f"  {spec.shape.key()} {spec.label()}: {error}")


