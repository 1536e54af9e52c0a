"""Compile the tensor-core kernel (int4jit/templates/gemv_mma.hip) and, on a GPU, check it
against the float64 reference and time it next to the production kernel's tuned config.

    python3 bench/proto/run_mma_proto.py            # CPU: compile for sm_80/sm_90, registers/spills
    python3 bench/proto/run_mma_proto.py --gpu      # H200: correctness sweep + timing table
    python3 bench/proto/run_mma_proto.py --ncu N K WARPS KSPLIT TW UNROLL   # launches for ncu (WARPS 0: production)
"""
import argparse
import os
import re
import string
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from int4jit import reference  # noqa: E402
from int4jit.backends import cuda  # noqa: E402
from int4jit.shapes import GemvShape  # noqa: E402

TEMPLATES = ROOT / "int4jit" / "templates"
# (WARPS, KSPLIT, TW, UNROLL)
CONFIGS = [(4, 1, 1, 4), (4, 1, 2, 2), (8, 1, 1, 4), (8, 2, 1, 4), (4, 4, 1, 2), (8, 8, 1, 2),
           (8, 4, 2, 2), (16, 16, 1, 1), (4, 4, 1, 4), (2, 1, 2, 4)]


def render(shape: GemvShape, warps: int, ksplit: int, tw: int, unroll: int):
    name = (f"mma_gemv_n{shape.N}_k{shape.K}_g{shape.group}{'s' if shape.symmetric else 'a'}"
            f"_w{warps}_k{ksplit}_t{tw}_u{unroll}")
    params = {"N": shape.N, "K": shape.K, "GROUP": shape.group, "SYMMETRIC": "true" if shape.symmetric else "false",
              "WARPS": warps, "KSPLIT": ksplit, "TW": tw, "UNROLL": unroll, "KERNEL_NAME": name}
    prelude = string.Template((TEMPLATES / "prelude_cuda.hip").read_text()).substitute(params)
    body = string.Template((TEMPLATES / "gemv_mma.hip").read_text()).substitute(params)
    return name, prelude + "\n" + body


def row_blocks(shape, cfg):
    warps, ksplit, tw, _ = cfg
    return -(-shape.N // ((warps // ksplit) * 16 * tw))


def compile_one(shape, cfg, arch="sm_90", verbose=False):
    name, src = render(shape, *cfg)
    opts = ("-default-device",) + (("--ptxas-options=-v",) if verbose else ())
    return name, cuda.compile_source(src, name + ".cu", arch, opts)


class ProtoKernel:
    def __init__(self, dev, shape, cfg, binary_name, persistent):
        from int4jit.backends._args import PackedArgs
        self._packed = PackedArgs
        name, binary = binary_name
        self.device = dev
        self.module, self.function = dev.load(binary, name)
        self.block = 32 * cfg[0]
        blocks = row_blocks(shape, cfg)
        if persistent:
            blocks = min(blocks, dev.blocks_per_sm(self.function, self.block) * dev.sm_count)
        self.grid = blocks

    def __call__(self, x, w, s, z, y, stream=0):
        self.device.launch(self.function, self.grid, self.block, self._packed((x, w, s, z, y)), stream)


def cpu_check():
    shape = GemvShape(28672, 4096, 128, False)
    for arch in ("sm_80", "sm_90"):
        for cfg in CONFIGS:
            name, src = render(shape, *cfg)
            from cuda.bindings import nvrtc
            prog = cuda.check(nvrtc.nvrtcCreateProgram(src.encode(), b"p.cu", 0, [], []), "create")
            opts = [f"--gpu-architecture={arch}", "-std=c++17", "-default-device", "--ptxas-options=-v"]
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
            size = cuda.check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.decode(errors="replace")
            regs = re.findall(r"Used (\d+) registers", log)
            spill = re.findall(r"(\d+) bytes spill stores", log)
            smem = re.findall(r"(\d+) bytes smem", log)
            print(f"{arch} {cfg}: err={int(err)} regs={regs} spill_stores={spill} smem={smem}")
            if int(err):
                print(log)


def rel_err(y, ref):
    return np.linalg.norm(y - ref) / np.linalg.norm(ref) if np.all(np.isfinite(y)) else float("inf")


def copy_bandwidth():
    import torch
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        e0.record(); b.copy_(a); e1.record(); e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del a, b
    return 2 * (1 << 30) / (np.median(times) * 1e-3)


def gpu_run():
    import torch
    from int4jit import backends, tuner
    from int4jit.launch import load_kernel
    dev = backends.device()
    rng = np.random.default_rng()
    worst, errs = 0.0, []
    cases = [(1, 4096, 128, False), (7, 896, 64, True), (1000, 2080, 16, False), (4096, 4096, 32, False),
             (4097, 14336, 128, True), (896, 160, 32, False), (33, 96, 32, False), (300, 4096, 256, False),
             (5000, 1024, 16, True), (2048, 2048, 64, False)]
    pool = ThreadPoolExecutor(16)
    for N, K, g, sym in cases:
        shape = GemvShape(N, K, g, sym)
        x, w, s, z = reference.random_problem(shape, rng)
        ref = reference.reference_gemv(x, w, s, z)
        t = [None if a is None else torch.from_numpy(a).cuda() for a in (x, w, s, z)]
        bins = list(pool.map(lambda c: compile_one(shape, c), CONFIGS))
        for cfg, nb in zip(CONFIGS, bins):
            for persistent in (False, True):
                out = torch.full((N,), float("nan"), dtype=torch.float16, device="cuda")
                k = ProtoKernel(dev, shape, cfg, nb, persistent)
                k(t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), 0 if t[3] is None else t[3].data_ptr(), out.data_ptr())
                torch.cuda.synchronize()
                e = rel_err(out.cpu().numpy().astype(np.float64), ref)
                errs.append(e)
                if e > 2e-3:
                    print(f"  BAD {shape.key()} {cfg} persistent={persistent}: {e:.2e}")
                worst = max(worst, e)
    print(f"tensor-core kernel correctness: worst rel err {worst:.2e}, median {np.median(errs):.2e} "
          f"over {len(cases)} shapes x {len(CONFIGS)} configs x 2 grids", flush=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s")
    print(f"{'shape':>26s} {'classic':>11s} {'%':>5s} {'mma@cfg':>9s} {'best mma':>9s} {'%':>5s} {'cfg':>16s}  {'2nd':>8s} {'cfg':>16s}")
    for N, K, g in [(4096, 4096, 128), (28672, 4096, 128), (28672, 4096, 32), (4096, 14336, 128),
                    (128256, 4096, 128), (5120, 17920, 128), (896, 896, 128), (2048, 2048, 128), (896, 4864, 32)]:
        shape = GemvShape(N, K, g, False)
        bufs = tuner.BenchBuffers(dev, shape)
        stream = dev.create_stream()
        bins = list(pool.map(lambda c: compile_one(shape, c), CONFIGS))
        try:
            prod_cfg = tuner.select_config(shape, dev.arch, None).config
            prod = tuner.time_kernel(classic_kernel(dev, shape, prod_cfg), bufs, stream)
            integrated = tuner.time_kernel(load_kernel(dev, shape, prod_cfg), bufs, stream)
            times = {}
            for cfg, nb in zip(CONFIGS, bins):
                for persistent in (False, True):
                    times[(cfg, persistent)] = tuner.time_kernel(ProtoKernel(dev, shape, cfg, nb, persistent), bufs, stream)
        finally:
            dev.destroy_stream(stream)
            bufs.free()
        ranked = sorted(times, key=times.get)
        pct = lambda us: 100 * shape.weight_bytes / (us * 1e-6) / bw
        fmt = lambda k: f"{k[0]}{'p' if k[1] else ''}".replace(" ", "")
        print(f"{shape.key():>26s} {prod:9.2f}us {pct(prod):5.1f} {integrated:7.2f}us {times[ranked[0]]:7.2f}us {pct(times[ranked[0]]):5.1f} "
              f"{fmt(ranked[0]):>16s}  {times[ranked[1]]:6.2f}us {fmt(ranked[1]):>16s}", flush=True)
        print("    all: " + " ".join(f"{fmt(k)}={times[k]:.2f}" for k in ranked), flush=True)


def classic_kernel(dev, shape, cfg):
    """The CUDA-core kernel (gemv.hip) for a shape the tensor-core path would take."""
    from int4jit import compiler, launch
    before = os.environ.get("INT4JIT_KERNEL")
    os.environ["INT4JIT_KERNEL"] = "simt"
    try:
        k = launch.load_kernel(dev, shape, cfg)
    finally:
        if before is None:
            del os.environ["INT4JIT_KERNEL"]
        else:
            os.environ["INT4JIT_KERNEL"] = before
        compiler._memo.clear()
        launch._loaded.clear()
    return k


def ncu_run(N, K, cfg):
    import torch
    from int4jit import backends
    dev = backends.device()
    shape = GemvShape(N, K, 128, False)
    x, w, s, z = reference.random_problem(shape, np.random.default_rng())
    t = [torch.from_numpy(a).cuda() for a in (x, w, s, z)]
    out = torch.empty(N, dtype=torch.float16, device="cuda")
    if cfg[0] == 0:  # the CUDA-core kernel, table config
        from int4jit import tuner
        k = classic_kernel(dev, shape, tuner.select_config(shape, dev.arch, None).config)
    else:
        k = ProtoKernel(dev, shape, cfg, compile_one(shape, cfg), False)
    for _ in range(5):
        k(*(a.data_ptr() for a in t), out.data_ptr())
    torch.cuda.synchronize()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--ncu", nargs=6, type=int, metavar=("N", "K", "WARPS", "KSPLIT", "TW", "UNROLL"))
    a = ap.parse_args()
    if a.ncu:
        ncu_run(a.ncu[0], a.ncu[1], tuple(a.ncu[2:]))
    elif a.gpu:
        gpu_run()
    else:
        cpu_check()
