"""What act-order costs a GEMV (issue 21): int4jit.gemv with and without perm= (the K gather of x
before the launch), graph replay over rotating weights, µs per call. H200 figures go in the note."""
import argparse
import math

from common import L2_DEFEAT, graph_time, gpu_or_exit, int4_bytes

import int4jit


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x14336,4096x4096,28672x4096", help="comma-separated NxK")
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args()
    gpu_or_exit("act_order.py")
    import torch
    for text in args.shapes.split(","):
        N, K = map(int, text.split("x"))
        G = args.group
        c = max(2, min(512, math.ceil(L2_DEFEAT / int4_bytes(N, K, G))))
        x = torch.randn(K, device="cuda", dtype=torch.float16)
        y = torch.empty(N, device="cuda", dtype=torch.float16)
        perm = torch.randperm(K, device="cuda").to(torch.int32)
        sets = [(torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8),
                 torch.rand(N, K // G, device="cuda", dtype=torch.float16) * 0.01 + 0.001,
                 torch.randint(0, 16, (N, K // G), device="cuda", dtype=torch.uint8)) for _ in range(c)]
        int4jit.gemv(x, *sets[0], out=y)
        int4jit.gemv(x, *sets[0], perm=perm, out=y)
        plain = graph_time([lambda t=t: int4jit.gemv(x, *t, out=y) for t in sets])
        act = graph_time([lambda t=t: int4jit.gemv(x, *t, perm=perm, out=y) for t in sets])
        print(f"{N}x{K} g{G}: plain {plain:.2f} us, act-order {act:.2f} us (+{act - plain:.2f} us, "
              f"{100 * (act / plain - 1):.1f}%)", flush=True)


if __name__ == "__main__":
    main()
