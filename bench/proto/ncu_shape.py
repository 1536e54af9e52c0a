"""One int4jit.gemv launch of a shape at a forced config, for `ncu` (after a warm-up call).
    ncu --clock-control none -k regex:int4jit --launch-skip 1 --launch-count 1 \\
        python3 bench/proto/ncu_shape.py N K GROUP BS TN [KEY=VALUE ...]
KEY=VALUE: a compiler._tc_geometry keyword (a variant, as in tc_ab.py: xwarp=1, kcluster=2)."""
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import int4jit  # noqa: E402
from int4jit import reference  # noqa: E402
from int4jit.shapes import GemvShape  # noqa: E402

import variant  # noqa: E402

N, K, G, BS, TN = map(int, sys.argv[1:6])
keywords = variant.parse(sys.argv[6:])
variant.use(**keywords)
os.environ["INT4JIT_CONFIG"] = f"{BS},{TN}"
x, w, s, z = (torch.from_numpy(a).cuda() for a in reference.random_problem(GemvShape(N, K, G, False)))
out = torch.empty(N, dtype=torch.float16, device="cuda")
for _ in range(2):
    int4jit.gemv(x, w, s, z, out=out)
torch.cuda.synchronize()
ref = int4jit.reference_gemv(*(a.cpu().numpy() for a in (x, w, s, z)))
print(f"{N}x{K} g{G} ({BS},{TN}) {keywords or ''}: rel err {np.linalg.norm(out.cpu().numpy() - ref) / np.linalg.norm(ref):.1e}")
