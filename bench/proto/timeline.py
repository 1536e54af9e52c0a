"""Where a call's time goes, warp by warp: the shape's tuned kernel with %globaltimer stamps
written by lane 0 of every warp, replayed in a graph like the tuner times it (rotating weight
copies, PDL on), two stamp buffers alternating so the last two calls are both on record.

Stamps (ns): E0 warp start, E1 after griddepcontrol.wait, E2 x staged / first batch issued,
E3 first batch consumed (start of the second batch), E4 loads done (launch_dependents),
E5 stored. Printed per call relative to the earlier call's first start: quantiles over warps
of each stamp, the gap between calls, and what each phase costs the call.

    python3 bench/proto/timeline.py [N K G ...]   (default: the suite's large shapes)
"""
import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from int4jit import backends, compiler, launch, tuner  # noqa: E402
from int4jit.shapes import GemvShape  # noqa: E402
from int4jit.tuner import BenchBuffers  # noqa: E402

import variant  # noqa: E402

STAMPS = 8  # per warp: E0..E5, smid, spare
STAMP_MACRO = r"""
#define I4TL(k) do { if ((threadIdx.x & 31) == 0) { unsigned long long t_; \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); \
    ((unsigned long long*)BUFADDR)[((unsigned long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 8 + (k)] = t_; } } while (0)
#define I4TL_SM() do { if ((threadIdx.x & 31) == 0) { unsigned s_; asm volatile("mov.u32 %0, %%smid;" : "=r"(s_)); \
    ((unsigned long long*)BUFADDR)[((unsigned long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 8 + 6] = s_; } } while (0)
"""

# (text in gemv_tc.hip, text it becomes): each must occur exactly once.
PATCHES = [
    ("    const int ks = threadIdx.x / 32, lane = threadIdx.x % 32;\n",
     "    const int ks = threadIdx.x / 32, lane = threadIdx.x % 32;\n    I4TL(0); I4TL_SM();\n"),
    ("    I4_GRID_WAIT();\n", "    I4_GRID_WAIT();\n    I4TL(1);\n"),
    ("    for (int s0 = s_begin; s0 < s_end; s0 += BATCH) {\n",
     "    I4TL(2);\n    for (int s0 = s_begin; s0 < s_end; s0 += BATCH) {\n        if (s0 == s_begin + BATCH) I4TL(3);\n"),
    ("    I4_GRID_LAUNCH_DEPENDENTS();", "    I4TL(4);\n    I4_GRID_LAUNCH_DEPENDENTS();"),
    ("    tc_store(acc, y, row0, ks, rank, g, t, partial, cluster_part);\n}",
     "    tc_store(acc, y, row0, ks, rank, g, t, partial, cluster_part);\n    I4TL(5);\n}"),
]


def registers(dev, fn) -> int:
    attr = dev._drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
    return backends.cuda.check(dev._drv.cuFuncGetAttribute(attr, fn), "cuFuncGetAttribute")


def stamped_kernel(dev, shape, cfg, buf, min_blocks: int | None = None):
    """The tuned build with stamps; min_blocks asks ptxas to keep that many blocks a SM (the
    stamps need registers, and a build that holds fewer blocks a SM than the plain one is not
    the kernel being profiled; __launch_bounds__ overrides --maxrregcount, so this is the way)."""
    with variant.adding(**({"min_blocks": min_blocks} if min_blocks else {})):
        name, src = compiler.render_gemv_source(shape, cfg, dev.arch)
    for old, new in PATCHES:
        if src.count(old) != 1:
            raise SystemExit(f"timeline: the template no longer has {old.strip()!r} exactly once")
        src = src.replace(old, new)
    src = src.replace("constexpr long long N =", STAMP_MACRO.replace("BUFADDR", f"{buf:#x}ULL") + "constexpr long long N =", 1)
    binary = backends.cuda.compile_source(src, name, dev.arch, compiler.COMPILE_OPTIONS["cuda"])
    module, fn = dev.load(binary, compiler.kernel_name(shape, cfg))
    geo = compiler.kernel_geometry(shape, cfg, dev.arch)
    return launch.Kernel(dev, shape, cfg, module, fn, geo.grid, geo.block, dev.supports_overlap), geo


def q(a):
    a = a[a > 0]
    return "  ".join(f"{v:7.2f}" for v in np.percentile(a, [0, 10, 50, 90, 100])) if a.size else "   (none)"


def run(dev, shape, cfg):
    geo = compiler.kernel_geometry(shape, cfg, dev.arch)
    warps = geo.grid * geo.block // 32
    nbytes = warps * STAMPS * 8
    bufs = BenchBuffers(dev, shape)
    copies = bufs.copies - bufs.copies % 2
    stamp_bufs = [dev.alloc(nbytes) for _ in range(2)]
    plain = launch.load_kernel(dev, shape, cfg)
    plain_regs, plain_blocks = registers(dev, plain.function), dev.blocks_per_sm(plain.function, geo.block)
    kernels = [stamped_kernel(dev, shape, cfg, b)[0] for b in stamp_bufs]
    if dev.blocks_per_sm(kernels[0].function, geo.block) < plain_blocks:
        kernels = [stamped_kernel(dev, shape, cfg, b, plain_blocks)[0] for b in stamp_bufs]
    stamped_regs, stamped_blocks = registers(dev, kernels[0].function), dev.blocks_per_sm(kernels[0].function, geo.block)
    stream = dev.create_stream()

    def run_all():
        for i, (wp, sp, zp) in enumerate(bufs.sets[:copies]):
            kernels[i % 2](bufs.x, wp, sp, zp, bufs.y, stream)

    run_all()
    dev.synchronize(stream)
    graph = dev.capture_graph(run_all, stream)
    us = 1e3 * dev.time_ms(lambda: dev.replay(graph, stream), 7, stream) / copies
    dev.replay(graph, stream)
    dev.synchronize(stream)
    recs = []
    for b in stamp_bufs:
        h = np.zeros(warps * STAMPS, dtype=np.uint64)
        dev.copy_dtoh(h, b)
        recs.append(h.reshape(warps, STAMPS).astype(np.int64))
    dev.destroy_graph(graph)
    dev.destroy_stream(stream)
    bufs.free()
    for b in stamp_bufs:
        dev.free(b)
    a, b = recs  # a: the second-to-last call, b: the last
    t0 = a[:, 0].min()
    rel = lambda r, k: np.where(r[:, k] > 0, (r[:, k] - t0) / 1e3, 0.0)
    print(f"\n{shape.key()} {cfg}: grid {geo.grid} x {geo.block} threads ({warps} warps), "
          f"{us:.2f} us per call in the graph (stamps cost what they cost)")
    print(f"  registers {stamped_regs}, {stamped_blocks} blocks a SM (the plain build: {plain_regs}, {plain_blocks})")
    stamps_ns = np.unique(np.diff(np.unique(a[:, 0])))
    print(f"  globaltimer steps seen between warp starts: min {stamps_ns.min() if stamps_ns.size else 0} ns")
    print(f"  {'us from call A start':24s}   min      p10      p50      p90      max")
    names = ["E0 start", "E1 after wait", "E2 x staged", "E3 1st batch done", "E4 loads done", "E5 stored"]
    for tag, r in (("A", a), ("B", b)):
        for k, nm in enumerate(names):
            print(f"  {tag} {nm:22s} {q(rel(r, k))}")
    per_call = (b[:, 0].min() - a[:, 0].min()) / 1e3
    print(f"  call period (B start - A start): {per_call:.2f} us; A end (max E5) -> B first start "
          f"{(b[:, 0].min() - a[:, 5].max()) / 1e3:+.2f} us; A max E4 -> B min E1 {(b[:, 1].min() - a[:, 4].max()) / 1e3:+.2f} us")
    e = lambda k: (b[:, k] - b[:, 0].min()) / 1e3
    print(f"  call B phases (us from its first start): all waits over {e(1).max():.2f}; first batch done "
          f"p50 {np.median(e(3)[b[:, 3] > 0]) if (b[:, 3] > 0).any() else float('nan'):.2f}; loads done p50 "
          f"{np.median(e(4)):.2f} max {e(4).max():.2f}; stored max {e(5).max():.2f}")
    sm = b[:, 6]
    ends = np.array([e(4)[sm == s].max() for s in np.unique(sm)])
    print(f"  per-SM last load done: min {ends.min():.2f} p50 {np.median(ends):.2f} max {ends.max():.2f} us "
          f"over {len(ends)} SMs; warps per SM {np.bincount(sm).max()}")


DEFAULT = [(28672, 4096, 128), (4096, 14336, 128), (5120, 17920, 128), (128256, 4096, 128), (2048, 2048, 128),
           (28672, 4096, 32), (4096, 14336, 32)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="*", type=int, help="N K G, repeated (each at its selected config)")
    ap.add_argument("--variant", nargs="*", default=[], metavar="KEY=VALUE",
                    help="keywords of compiler._tc_geometry, e.g. xwarp=1 kcluster=2")
    a = ap.parse_args()
    if a.variant:
        kw = variant.parse(a.variant)
        variant.use(**kw)
        print(f"variant: {kw}")
    dev = backends.device()
    shapes = DEFAULT if not a.shape else [tuple(a.shape[i:i + 3]) for i in range(0, len(a.shape), 3)]
    for N, K, G in shapes:
        shape = GemvShape(N, K, G, False)
        cfg = tuner.select_config(shape, dev.arch, None).config
        run(dev, shape, cfg)


if __name__ == "__main__":
    main()
