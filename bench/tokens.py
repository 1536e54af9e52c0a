"""Several tokens and bf16 in one launch (issue 19): µs per call of int4jit.gemv for M = 1..16 in
fp16 and bf16 against M = 1 fp16, graph replay over rotating weights, on the H200."""
import argparse
import math

from common import L2_DEFEAT, graph_time, gpu_or_exit, int4_bytes

import int4jit


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x4096,28672x4096,4096x14336,6144x4096", help="comma-separated NxK")
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args()
    torch = gpu_or_exit("tokens.py")
    G = args.group
    print("| N×K | g | dtype | " + " | ".join(f"M={m} µs" for m in args.tokens.split(",")) + " | M=8 / M=1 fp16 |")
    for text in args.shapes.split(","):
        N, K = map(int, text.split("x"))
        c = max(2, min(512, math.ceil(L2_DEFEAT / int4_bytes(N, K, G))))
        sets = [(torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8),
                 torch.rand(N, K // G, device="cuda", dtype=torch.float16) * 0.01 + 0.001,
                 torch.randint(0, 16, (N, K // G), device="cuda", dtype=torch.uint8)) for _ in range(c)]
        base = None
        for dtype in (torch.float16, torch.bfloat16):
            row = []
            for m in map(int, args.tokens.split(",")):
                x = torch.randn(m, K, device="cuda", dtype=dtype)
                y = torch.empty(m, N, device="cuda", dtype=dtype)
                int4jit.gemv(x, *sets[0], out=y)
                us = graph_time([lambda t=t: int4jit.gemv(x, *t, out=y) for t in sets])
                if base is None:
                    base = us
                row.append(us)
                if m == 8:
                    m8 = us
            print(f"| {N}×{K} | {G} | {str(dtype)[6:]} | " + " | ".join(f"{u:.2f}" for u in row)
                  + f" | {m8 / base:.2f} |", flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
