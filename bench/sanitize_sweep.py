"""A small sweep for compute-sanitizer (memcheck, racecheck): N = 1, N not a multiple of the
rows per block, K = one group, the smallest and largest grid points, every group, both kernels
(INT4JIT_KERNEL=simt and =tc), asymmetric and symmetric. Rerun after any template change:
    compute-sanitizer --tool memcheck --error-exitcode 1 python3 bench/sanitize_sweep.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 bench/sanitize_sweep.py
Public API only (int4jit.gemv with config=, the INT4JIT_KERNEL variable)."""
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import int4jit  # noqa: E402

rng = np.random.default_rng(0)
cases = [(1, 4096, 128, (32, 2)), (7, 896, 64, (512, 16)), (1001, 16, 16, (32, 2)), (1001, 256, 256, (512, 16)),
         (4097, 4096, 32, (256, 8)), (333, 4112, 16, (128, 4)), (896, 4864, 128, (64, 16)), (5, 48, 16, (512, 2)),
         # the tc kernel (sm_80+, K % 32 == 0): g = 16 segments, a partial last step, x near the shared-memory limit
         (1000, 2080, 16, (256, 4)), (33, 96, 32, (128, 2)), (2048, 17920, 32, (512, 2)), (129, 8192, 64, (512, 16))]
worst = 0.0
launches = 0
for kernel, N, K, g, cfg in [("simt", *c) for c in cases] + [("tc", *c) for c in cases if c[1] % 32 == 0]:
    os.environ["INT4JIT_KERNEL"] = kernel
    for sym in (False, True):
        launches += 1
        w = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
        s = (rng.random((N, K // g)) * 0.02 + 0.001).astype(np.float16)
        z = None if sym else rng.integers(0, 16, size=(N, K // g), dtype=np.uint8)
        x = rng.standard_normal(K).astype(np.float16)
        dev = [None if a is None else torch.from_numpy(a).cuda() for a in (x, w, s, z)]
        out = torch.full((N,), float("nan"), dtype=torch.float16, device="cuda")
        int4jit.gemv(*dev, out=out, config=cfg)
        torch.cuda.synchronize()
        ref = int4jit.reference_gemv(x, w, s, z)
        err = float(np.linalg.norm(out.cpu().numpy().astype(np.float64) - ref) / np.linalg.norm(ref))
        worst = max(worst, err)
print(f"sanitize sweep: {launches} launches (both kernels), worst relative error {worst:.2e}")
sys.exit(0 if worst <= 2e-3 else 1)
