"""Eager per-call wall time of int4jit.gemv from Python (torch tensors, out= given),
next to torch's tinygemm eager call. Median of 5 runs of 2000 calls."""
import statistics
import time

import torch

import int4jit

N = K = 4096
x = torch.randn(K, dtype=torch.float16, device="cuda")
w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
s = torch.rand(N, K // 128, dtype=torch.float16, device="cuda") * 0.01
z = torch.randint(0, 16, (N, K // 128), dtype=torch.uint8, device="cuda")
out = torch.empty(N, dtype=torch.float16, device="cuda")


def per_call(fn, n=2000):
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


print(f"int4jit.gemv eager {N}x{K} g128: {per_call(lambda: int4jit.gemv(x, w, s, z, out=out)):.2f} us/call")
try:
    wp = torch._convert_weight_to_int4pack(w, 8)
    sz = torch.randn(K // 128, N, 2, device="cuda", dtype=torch.bfloat16) * 0.01
    xb = x.to(torch.bfloat16).reshape(1, -1)
    print(f"tinygemm eager: {per_call(lambda: torch._weight_int4pack_mm(xb, wp, 128, sz)):.2f} us/call")
except (RuntimeError, AttributeError) as e:
    print("tinygemm unavailable:", e)
