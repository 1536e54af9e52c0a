"""Compile the tensor-core prototype (gemv_mma.hip) and, on a GPU, check it against the
float64 reference and time it next to the production kernel's tuned config.

    python3 bench/proto/run_mma_proto.py            # CPU: compile for sm_80/sm_90, print PTX mma count
    python3 bench/proto/run_mma_proto.py --gpu      # H200: correctness sweep + timing table
"""
import argparse
import string
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from int4jit import reference  # noqa: E402
from int4jit.backends import cuda  # noqa: E402
from int4jit.shapes import GemvShape  # noqa: E402

CONFIGS = [(4, 1, 2), (4, 2, 2), (8, 2, 2), (4, 4, 1), (8, 4, 2), (8, 1, 4), (4, 1, 4)]  # (WARPS, KSPLIT, UNROLL)


def render(shape: GemvShape, warps: int, ksplit: int, unroll: int):
    name = f"mma_gemv_n{shape.N}_k{shape.K}_g{shape.group}{'s' if shape.symmetric else 'a'}_w{warps}_k{ksplit}_u{unroll}"
    params = {"N": shape.N, "K": shape.K, "GROUP": shape.group, "SYMMETRIC": "true" if shape.symmetric else "false",
              "WARPS": warps, "KSPLIT": ksplit, "UNROLL": unroll, "KERNEL_NAME": name, "WARP": 32, "HAS_DOT2": 0}
    prelude = string.Template((ROOT / "int4jit/templates/prelude_cuda.hip").read_text()).substitute(params)
    body = string.Template((Path(__file__).parent / "gemv_mma.hip").read_text()).substitute(params)
    return name, prelude + "\n" + body


def grid_for(shape, warps, ksplit):
    tiles = warps // ksplit
    return -(-shape.N // (16 * tiles)), 32 * warps


class ProtoKernel:
    def __init__(self, dev, shape, cfg):
        from int4jit.backends._args import PackedArgs
        self._packed = PackedArgs
        name, src = render(shape, *cfg)
        self.device = dev
        self.module, self.function = dev.load(cuda.compile_source(src, name + ".cu", dev.arch, ("-default-device",)), name)
        self.grid, self.block = grid_for(shape, cfg[0], cfg[1])

    def __call__(self, x, w, s, z, y, stream=0):
        self.device.launch(self.function, self.grid, self.block, self._packed((x, w, s, z, y)), stream)


def cpu_check():
    for arch in ("sm_80", "sm_90"):
        shape = GemvShape(4096, 4096, 128, False)
        for cfg in CONFIGS[:3]:
            name, src = render(shape, *cfg)
            cubin = cuda.compile_source(src, name + ".cu", arch, ("-default-device",))
            print(f"{arch} {cfg}: cubin {len(cubin)} bytes")


def gpu_run():
    import torch
    from int4jit import backends, tuner
    dev = backends.device()
    rng = np.random.default_rng()
    worst = 0.0
    for N, K, g, sym in [(1, 4096, 128, False), (7, 896, 64, True), (1000, 2080, 16, False), (4096, 4096, 32, False),
                         (4097, 14336, 128, True), (896, 160, 32, False)]:
        shape = GemvShape(N, K, g, sym)
        w = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
        s = (rng.random((N, K // g)) * 0.02 + 1e-3).astype(np.float16)
        z = None if sym else rng.integers(0, 16, (N, K // g), dtype=np.uint8)
        x = rng.standard_normal(K).astype(np.float16)
        ref = reference.reference_gemv(x, w, s, z)
        t = [None if a is None else torch.from_numpy(a).cuda() for a in (x, w, s, z)]
        for cfg in CONFIGS:
            out = torch.full((N,), float("nan"), dtype=torch.float16, device="cuda")
            k = ProtoKernel(dev, shape, cfg)
            k(t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), 0 if t[3] is None else t[3].data_ptr(), out.data_ptr())
            torch.cuda.synchronize()
            y = out.cpu().numpy().astype(np.float64)
            err = np.linalg.norm(y - ref) / np.linalg.norm(ref) if np.all(np.isfinite(y)) else float("inf")
            worst = max(worst, err)
    print(f"prototype correctness: worst relative error {worst:.2e} over 6 shapes x {len(CONFIGS)} configs")
    print(f"{'shape':>26s} {'production':>12s} {'best mma':>10s} {'cfg':>10s}")
    for N, K in [(4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096), (896, 896), (2048, 8192)]:
        shape = GemvShape(N, K, 128, False)
        bufs = tuner.BenchBuffers(dev, shape)
        stream = dev.create_stream()
        try:
            prod_cfg = tuner.select_config(shape, dev.arch, None).config
            from int4jit.launch import load_kernel
            prod = tuner.time_kernel(load_kernel(dev, shape, prod_cfg), bufs, stream)
            times = {cfg: tuner.time_kernel(ProtoKernel(dev, shape, cfg), bufs, stream) for cfg in CONFIGS}
        finally:
            dev.destroy_stream(stream)
            bufs.free()
        best = min(times, key=times.get)
        print(f"{shape.key():>26s} {prod:10.2f}us {times[best]:8.2f}us {str(best):>10s}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    (gpu_run if ap.parse_args().gpu else cpu_check)()
