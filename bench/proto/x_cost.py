"""What staging x costs a call: each shape's tuned gemv_tc.hip build timed as it is and with its
x staging fed from constants instead of loads (wrong results: timing only). Every block reads
all of x from L2 at its start, so the same few x lines are asked for by every block at once;
the difference bounds what fewer x requests (multicast within a cluster) could gain.

    python3 bench/proto/x_cost.py [N K G ...]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from int4jit import backends, compiler, launch, tuner  # noqa: E402
from int4jit.shapes import GemvShape  # noqa: E402

# (x load in gemv_tc.hip, the constant that replaces it): block-wide staging (XPERM), per-warp
# staging (XWARP), cp.async staging (XSMEM without XPERM), per-step loads (no staging: g < 128).
NO_X = [("load_cached16(x + 32 * min(c, CHUNKS - 1) + 8 * j)", "u32x4{(u32)c, (u32)j, 0u, 0u}"),
        ("tc_pair_x(load_cached16(x + 8 * i))", "tc_pair_x(u32x4{(u32)i, 0u, 0u, 0u})"),
        ("load_first16(x + 8 * max(xw[r], 0))", "u32x4{(u32)xw[r], 0u, 0u, 0u}"),
        ("copy_async16(smem_address(xs + i), x + 8 * i)", "xs[i] = u32x4{(u32)i, 0u, 0u, 0u}")]


def patched_template(name: str, plain=compiler._read_template) -> str:
    text = plain(name)
    if name == compiler.TEMPLATE_TC:
        for old, new in NO_X:
            if text.count(old) != 1:
                raise SystemExit(f"x_cost: {old!r} occurs {text.count(old)} times in {name}; update NO_X")
            text = text.replace(old, new)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="*", type=int, help="N K G, repeated (each at its selected config)")
    a = ap.parse_args()
    shapes = [tuple(a.shape[i:i + 3]) for i in range(0, len(a.shape), 3)] or [
        (28672, 4096, 128), (35840, 5120, 128), (7680, 5120, 128), (4096, 14336, 128), (5120, 17920, 128),
        (128256, 4096, 128), (28672, 4096, 32), (5120, 17920, 32)]
    dev = backends.device()
    plain = compiler._read_template
    print(f"{'shape':>22s} {'config':>8s} {'us':>7s} {'no x':>7s} {'saved':>6s}", flush=True)
    for N, K, g in shapes:
        shape = GemvShape(N, K, g, False)
        cfg = tuner.select_config(shape, dev.arch, dev).config
        bufs = tuner.BenchBuffers(dev, shape)
        stream = dev.create_stream()
        try:
            times = []
            for read in (plain, patched_template):
                compiler._read_template = read
                compiler._memo.clear()
                launch._loaded.clear()
                times.append(tuner.time_kernel(launch.load_kernel(dev, shape, cfg), bufs, stream))
        finally:
            compiler._read_template = plain
            dev.destroy_stream(stream)
            bufs.free()
        print(f"{shape.key():>22s} {str(cfg):>8s} {times[0]:7.2f} {times[1]:7.2f} {times[0] - times[1]:6.2f}", flush=True)


if __name__ == "__main__":
    main()
