"""End-to-end decode and prefill of a transformers Llama built from a config (issue 19).

A LlamaForCausalLM with Llama-3-8B layer shapes (hidden 4096, intermediate 14336, 32 heads /
8 kv heads, vocabulary 128256) but 4 layers and random weights -- no download -- or a small
one (--config small: Llama-3.2-1B shapes, 4 layers; --quick: a tiny one). The same weights
are served by each system, one after the other in one process:

  fp16            the model as built, nn.Linear in fp16
  bf16            the same model in bf16
  int4jit         int4jit.torch.quantize_model(fp16 model), g=128 asymmetric (time reported)
  int4jit-bf16    quantize_model of the bf16 model
  int4jit-dequant int4jit with every Int4Linear's chunked_tokens at 16 and gemm_max_tokens at 0,
                  unfused: a call of more tokens dequantises (the path before chunked launches, the
                  GEMM and fused layers)
  tinygemm        the bf16 model with every nn.Linear replaced by a module calling
                  torch.ops.aten._weight_int4pack_mm (torchao's int4 weight-only path; the CUDA
                  op takes bf16 activations -- whether it takes fp16 is probed and recorded)
  gemlite         the fp16 model with every nn.Linear replaced by a gemlite A16W4 layer

Per system: decode tok/s, eager (a plain loop: forward one token with the KV cache, 64
tokens, best of 3; then, the systems interleaved, that again in --interleave rounds, and the
median of the rounds reported: the loop is bound by the host, whose speed drifts over minutes)
and with torch.compile(mode="reduce-overhead") on a static cache (a
one-token step compiled into CUDA graphs, 64 tokens, best of 3 after a compiling run) where it works; prefill ms (one
forward of 512 tokens, median of 15), eager and under torch.compile (the model compiled as it is, default mode,
static shapes); the last logits of an 8-token prompt against the fp16
model's (relative difference). A system or a measurement that fails is recorded with its
error and the rest go on; the JSON is rewritten after every system.

    python3 bench/e2e_decode.py                     # 8B-shaped, 4 layers, every system
    python3 bench/e2e_decode.py --config small --systems fp16,int4jit --no-compile
    python3 bench/e2e_decode.py --quick             # a tiny model, few tokens: a smoke test
    python3 bench/e2e_decode.py --layers 32 --isolate   # the whole 8B, each system in a fresh process

Writes bench/results/e2e_decode-<date>.json and the "End-to-end decode" section of
bench/RESULTS.md (not with --quick unless --results-md is given); with --layers L,
e2e_decode-Llayers-<date>.json and the "End-to-end decode (L layers)" section."""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, RESULTS_MD, gpu_or_exit, import_gemlite, tinygemm_mm, write_section  # noqa: E402

CONFIGS = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
    "small": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024),
}
SYSTEMS = ("fp16", "bf16", "int4jit", "int4jit-bf16", "int4jit-dequant", "tinygemm", "gemlite")
SECTION = "End-to-end decode"
GROUP = 128


# --- int4 replacements for nn.Linear (peers) ---------------------------------------------

def rtn_int4(W, group):
    """Asymmetric round-to-nearest on the GPU: (q uint8 [N, K] 0..15, scales [N, K/g], zeros [N, K/g]),
    W ~ (q - z) * s."""
    import torch
    N, K = W.shape
    Wg = W.float().reshape(N, K // group, group)
    lo, hi = Wg.amin(-1), Wg.amax(-1)
    s = ((hi - lo) / 15).clamp_min(1e-8)
    z = (-lo / s).round().clamp(0, 15)
    q = (Wg / s[..., None] + z[..., None]).round().clamp(0, 15).to(torch.uint8).reshape(N, K)
    return q, s, z


def make_tinygemm_linear(torch):
    class TinygemmLinear(torch.nn.Module):
        """torchao-style int4 weight-only linear: bf16 x, _weight_int4pack_mm."""

        def __init__(self, lin, group=GROUP, inner_k_tiles=8):
            super().__init__()
            q, s, z = rtn_int4(lin.weight.detach(), group)
            N, K = q.shape
            packed = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # torch >= 2.5: even k in the high nibble
            try:
                wp = torch.ops.aten._convert_weight_to_int4pack(packed, inner_k_tiles)
            except RuntimeError:  # older torch: int32 [N, K] of 0..15
                wp = torch.ops.aten._convert_weight_to_int4pack(q.to(torch.int32), inner_k_tiles)
            # tinygemm dequantises (q - 8) * scale + zero: zero = (8 - z) * s
            sz = torch.stack([s, (8 - z) * s], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
            self.register_buffer("wp", wp)
            self.register_buffer("sz", sz)
            self.group, self.out_features = group, N
            self.bias = lin.bias

        def forward(self, x):
            shape = x.shape
            y = tinygemm_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.wp, self.group, self.sz)
            y = y.reshape(*shape[:-1], self.out_features).to(x.dtype)
            return y if self.bias is None else y + self.bias
    return TinygemmLinear


def make_gemlite_linear(torch):
    GemLiteLinear, DType = import_gemlite()

    def build(lin, group=GROUP):
        q, s, z = rtn_int4(lin.weight.detach(), group)
        N, K = q.shape
        L = GemLiteLinear(4, group_size=group, in_features=K, out_features=N,
                          input_dtype=DType.FP16, output_dtype=DType.FP16)
        L.pack(q, s.to(torch.float16), z.to(torch.float16), None if lin.bias is None else lin.bias.detach())
        return L
    return build


def replace_linears(torch, model, make):
    for _, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and child.in_features % GROUP == 0:
                setattr(module, name, make(child))
    return model


# --- the systems ---------------------------------------------------------------------------

def build_base(torch, cfg_kw, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**cfg_kw, max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False)
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def make_system(torch, name, base) -> tuple[object, dict]:
    """(model, notes) for system `name`, made from a copy of the fp16 base."""
    notes = {}
    if name == "fp16":
        return base, notes
    m = copy.deepcopy(base)
    if name in ("bf16", "int4jit-bf16", "tinygemm"):
        m = m.to(torch.bfloat16)
    if name == "bf16":
        return m, notes
    t0 = time.perf_counter()
    if name.startswith("int4jit"):
        import int4jit.torch as i4t
        # int4jit-dequant is the path before chunked launches, the GEMM and fused layers
        i4t.quantize_model(m, group_size=GROUP, fuse=name != "int4jit-dequant")
        m = m.cuda()
        if name == "int4jit-dequant":  # every call past 16 tokens dequantises (no chunked launches, no GEMM)
            for mod in m.modules():
                if isinstance(mod, i4t.Int4Linear):
                    mod.chunked_tokens, mod.gemm_max_tokens = i4t.MAX_TOKENS, 0
    elif name == "tinygemm":
        replace_linears(torch, m, make_tinygemm_linear(torch))
    elif name == "gemlite":
        replace_linears(torch, m, make_gemlite_linear(torch))
    torch.cuda.synchronize()
    notes["quantize_s"] = round(time.perf_counter() - t0, 2)
    return m, notes


# --- measurements --------------------------------------------------------------------------

def decode_eager(torch, model, vocab, tokens, runs):
    """tok/s of a plain loop: one token at a time with the KV cache; best of `runs`."""
    best = 0.0
    with torch.no_grad():
        for _ in range(runs):
            tok = torch.randint(0, vocab, (1, 1), device="cuda")
            out = model(input_ids=tok, use_cache=True)
            past = out.past_key_values
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(tokens):
                out = model(input_ids=tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            best = max(best, tokens / (time.perf_counter() - t0))
    return best


def decode_compiled(torch, model, vocab, tokens, runs):
    """tok/s of a static-cache decode loop whose one-token step runs under
    torch.compile(mode="reduce-overhead") (CUDA graphs); best of `runs` after one compiling run.
    Each step starts a new graph step (cudagraph_mark_step_begin) and clones the next token out
    of the graph's output, which the next replay overwrites. (model.generate on a static cache
    with our own compiled forward kept logits across replays and failed for every system.)"""
    from transformers import StaticCache
    prompt = 4
    cache = StaticCache(config=model.config, max_cache_len=prompt + tokens + 1)

    def step(tok, pos):
        out = model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True)
        return out.logits[:, -1:].argmax(-1)

    compiled = torch.compile(step, mode="reduce-overhead")

    def run():
        cache.reset()
        ids = torch.randint(0, vocab, (1, prompt), device="cuda")
        tok = step(ids, torch.arange(prompt, device="cuda"))  # the prompt, eagerly
        for i in range(tokens):
            torch.compiler.cudagraph_mark_step_begin()
            tok = compiled(tok, torch.tensor([prompt + i], device="cuda")).clone()
        return tok

    with torch.no_grad():
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        best = 0.0
        for _ in range(runs):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run()
            torch.cuda.synchronize()
            best = max(best, tokens / (time.perf_counter() - t0))
    return best, compile_s


def prefill_ms(torch, model, vocab, n, runs):
    """ms of one forward of n tokens: the median of 5 * runs event-timed forwards after two warm
    ones (a best of 3 moved by 27% between two systems on the same path, 2026-12-06)."""
    ids = torch.randint(0, vocab, (1, n), device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.no_grad():
        for i in range(2 + 5 * runs):
            start.record()
            model(input_ids=ids, use_cache=False)
            end.record()
            end.synchronize()
            if i >= 2:
                times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def last_logits(torch, model, prompt):
    with torch.no_grad():
        return model(input_ids=prompt, use_cache=False).logits[0, -1].float()


def probe_tinygemm_fp16(torch) -> str:
    """Whether this torch's CUDA _weight_int4pack_mm takes fp16 activations (else bf16 only)."""
    try:
        wp = torch.ops.aten._convert_weight_to_int4pack(torch.zeros(64, 128, dtype=torch.uint8, device="cuda"), 8)
    except RuntimeError:
        wp = torch.ops.aten._convert_weight_to_int4pack(torch.zeros(64, 256, dtype=torch.int32, device="cuda"), 8)
    sz = torch.zeros(256 // GROUP, 64, 2, device="cuda")
    out = {}
    for dt in (torch.float16, torch.bfloat16):
        try:
            tinygemm_mm(torch.zeros(1, 256, device="cuda", dtype=dt), wp, GROUP, sz.to(dt))
            out[str(dt)] = "ok"
        except Exception as e:  # noqa: BLE001
            out[str(dt)] = f"{type(e).__name__}: {e}"[:160]
    return json.dumps(out)


def run_system(torch, name, base, cfg_kw, args, ref_logits, prompt, keep: dict) -> dict:
    """System `name`'s figures; its model is left in `keep` for the interleaved eager rounds
    (where args.interleave > 1), else let go."""
    res = {}
    t0 = time.perf_counter()
    model, notes = make_system(torch, name, base)
    res.update(notes, build_s=round(time.perf_counter() - t0, 2))
    vocab = cfg_kw["vocab_size"]
    steps = [("logits_rel_diff_vs_fp16", lambda: float((last_logits(torch, model, prompt) - ref_logits).norm()
                                                        / ref_logits.norm())),
             ("decode_eager_tok_s", lambda: decode_eager(torch, model, vocab, args.tokens, args.runs)),
             ("prefill_ms", lambda: prefill_ms(torch, model, vocab, args.prefill, args.runs))]
    for key, fn in steps:
        try:
            res[key] = fn()
            print(f"  {name}: {key} {res[key]:.4g}", flush=True)
        except Exception as e:  # noqa: BLE001
            res[key + "_error"] = f"{type(e).__name__}: {e}"[:400]
            print(f"  {name}: {key} failed: {res[key + '_error']}", flush=True)
            traceback.print_exc(limit=4)
    if name.startswith("int4jit"):  # the groups quantize_model fused in the eager calls above
        import int4jit.torch as i4t
        res["fused_groups"] = len({id(m._shared) for m in model.modules()
                                   if isinstance(m, i4t.Int4Linear) and isinstance(m._shared, i4t._Fused)})
        print(f"  {name}: {res['fused_groups']} fused groups of layers", flush=True)
    if not args.no_compile:
        try:  # the whole model compiled as a user would: one graph a prompt length
            res["prefill_compiled_ms"] = prefill_ms(torch, torch.compile(model, dynamic=False), vocab, args.prefill,
                                                    args.runs)
            print(f"  {name}: prefill_compiled_ms {res['prefill_compiled_ms']:.4g}", flush=True)
        except Exception as e:  # noqa: BLE001
            res["prefill_compiled_ms_error"] = f"{type(e).__name__}: {e}"[:400]
            print(f"  {name}: torch.compile prefill failed: {res['prefill_compiled_ms_error']}", flush=True)
            traceback.print_exc(limit=4)
        torch._dynamo.reset()
        try:
            res["decode_compiled_tok_s"], res["compile_s"] = decode_compiled(torch, model, vocab, args.tokens, args.runs)
            print(f"  {name}: decode_compiled_tok_s {res['decode_compiled_tok_s']:.4g} "
                  f"(first run with compile {res['compile_s']:.0f} s)", flush=True)
        except Exception as e:  # noqa: BLE001
            res["decode_compiled_tok_s_error"] = f"{type(e).__name__}: {e}"[:400]
            print(f"  {name}: torch.compile decode failed: {res['decode_compiled_tok_s_error']}", flush=True)
            traceback.print_exc(limit=4)
        try:
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
    if args.interleave > 1:
        keep[name] = model
    del model
    torch.cuda.empty_cache()
    return res


def interleaved_eager(torch, kept: dict, vocab, args, doc) -> None:
    """The eager decode of every kept system again, in args.interleave rounds of one system after
    another (each a best of args.runs); the median of the rounds replaces the first figure, which
    was measured minutes apart from the other systems'."""
    rounds = {name: [] for name in kept}
    for r in range(args.interleave):
        for name, model in kept.items():
            try:
                rounds[name].append(decode_eager(torch, model, vocab, args.tokens, args.runs))
            except Exception as e:  # noqa: BLE001
                doc["systems"][name]["decode_eager_rounds_error"] = f"{type(e).__name__}: {e}"[:400]
        print(f"  round {r + 1}: " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in rounds.items() if v), flush=True)
    for name, tok_s in rounds.items():
        if tok_s:
            res = doc["systems"][name]
            res["decode_eager_first_tok_s"] = res.get("decode_eager_tok_s")
            res["decode_eager_rounds"] = tok_s
            res["decode_eager_tok_s"] = statistics.median(tok_s)


def run_in_process(torch, systems, cfg_kw, args, doc, save) -> None:
    """Every system in this process, one after the other, each from a copy of one fp16 base model."""
    print(f"{doc['device']}: building LlamaForCausalLM {cfg_kw} in fp16 on the GPU", flush=True)
    base = build_base(torch, cfg_kw)
    prompt = torch.randint(0, cfg_kw["vocab_size"], (1, 8), device="cuda")
    ref_logits = last_logits(torch, base, prompt)
    kept: dict = {}
    for name in systems:
        print(f"{name} ...", flush=True)
        try:
            doc["systems"][name] = run_system(torch, name, base, cfg_kw, args, ref_logits, prompt, kept)
        except Exception as e:  # a system that cannot be built is recorded, the others still run  # noqa: BLE001
            doc["systems"][name] = dict(error=f"{type(e).__name__}: {e}"[:500])
            print(f"  {name} failed: {doc['systems'][name]['error']}", flush=True)
            traceback.print_exc(limit=4)
            torch.cuda.empty_cache()
        save()
    if kept:
        print(f"eager decode, {args.interleave} rounds of the systems one after another ...", flush=True)
        interleaved_eager(torch, kept, cfg_kw["vocab_size"], args, doc)
        save()


def run_isolated(args, name) -> dict:
    """System `name`'s results from a fresh process of this script (--isolate)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, __file__, "--systems", name, "--out", tmp, "--results-md", "", "--config", args.config,
                "--tokens", str(args.tokens), "--prefill", str(args.prefill), "--runs", str(args.runs), "--interleave", "1"]
        argv += (["--layers", str(args.layers)] if args.layers else []) + (["--no-compile"] if args.no_compile else [])
        argv += ["--quick"] if args.quick else []
        code = subprocess.run(argv).returncode
        found = sorted(Path(tmp).glob("e2e_decode*.json"))
        if code or not found:
            return dict(error=f"its process exited with status {code}" + ("" if found else " and wrote no results"))
        return json.loads(found[0].read_text())["systems"][name]


def markdown(doc) -> str:
    c = doc["config"]
    lines = [f"{doc['device']}, {doc['date']}, transformers {doc['transformers']}, torch {doc['torch']}: "
             f"LlamaForCausalLM from a config (hidden {c['hidden_size']}, intermediate {c['intermediate_size']}, "
             f"{c['num_hidden_layers']} layers, vocabulary {c['vocab_size']}, random weights); decode {doc['tokens']} "
             f"tokens best of {doc['runs']}"
             f"{', eager the median of %d interleaved rounds' % doc['interleave'] if doc.get('interleave', 1) > 1 else ''}"
             f", prefill {doc['prefill']} tokens median of {5 * doc['runs']}"
             f"{', each system in its own process' if doc.get('isolated') else ''} "
             f"(`{doc.get('command', 'python3 bench/e2e_decode.py' + (' --quick' if doc['quick'] else ''))}`)", "",
             "| system | decode tok/s (eager) | decode tok/s (torch.compile reduce-overhead) | prefill ms | "
             "prefill ms (torch.compile) | logits vs fp16 | quantize s |", "|---|---|---|---|---|---|---|"]
    f = lambda r, k, fmt: fmt.format(r[k]) if k in r else ("error" if k + "_error" in r else "n/a")
    for name, r in doc["systems"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'].splitlines()[0][:100]} | | | | | |")
            continue
        lines.append(f"| {name} | {f(r, 'decode_eager_tok_s', '{:.0f}')} | {f(r, 'decode_compiled_tok_s', '{:.0f}')} | "
                     f"{f(r, 'prefill_ms', '{:.2f}')} | {f(r, 'prefill_compiled_ms', '{:.2f}')} | "
                     f"{f(r, 'logits_rel_diff_vs_fp16', '{:.1e}')} | "
                     f"{f(r, 'quantize_s', '{:.1f}')} |")
    errs = [f"{n} {k}: {v.splitlines()[0][:150]}" for n, r in doc["systems"].items() for k, v in r.items()
            if k.endswith("error") and k != "error"]
    if errs:
        lines += ["", "Errors: " + "; ".join(errs)]
    lines += ["", "logits vs fp16: the last logits of an 8-token prompt, relative to the fp16 model's. With random "
              "weights every layer's rounding compounds, so at many layers any quantised system decorrelates "
              "(accuracy is checked per GEMV against float64 and by tests/test_transformers_gpu.py)."]
    if doc.get("tinygemm_dtypes"):
        lines += ["", f"tinygemm's CUDA op with fp16 / bf16 activations: {doc['tinygemm_dtypes']}"]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=("8b", "small"), default="8b", help="layer shapes (4 layers either way)")
    ap.add_argument("--layers", type=int, help="override the number of layers")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--tokens", type=int, help="decode tokens (default 64; 8 with --quick)")
    ap.add_argument("--prefill", type=int, help="prefill tokens (default 512; 32 with --quick)")
    ap.add_argument("--runs", type=int, help="best of (default 3; 2 with --quick)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile decode")
    ap.add_argument("--interleave", type=int, default=3,
                    help="rounds of eager decode with the systems one after another, their median reported "
                         "(default 3; every system's model is kept to the end for them; 1: each system's own best of --runs "
                         "only, one model at a time; with --isolate: 1)")
    ap.add_argument("--isolate", action="store_true",
                    help="measure each system in a fresh process of this script (its own model build, allocator "
                         "and GPU state; the systems' order then cannot move their figures)")
    ap.add_argument("--quick", action="store_true", help="a tiny model, few tokens: a smoke test")
    ap.add_argument("--out", default=str(RESULTS_DIR), help="folder for the JSON (default bench/results)")
    ap.add_argument("--results-md", help="markdown file whose section is replaced (default bench/RESULTS.md; "
                    "none with --quick unless given; '' for none)")
    args = ap.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if any(s not in SYSTEMS for s in systems):
        ap.error(f"unknown system in {systems}; systems are {', '.join(SYSTEMS)}")
    args.tokens = args.tokens or (8 if args.quick else 64)
    args.prefill = args.prefill or (32 if args.quick else 512)
    args.runs = args.runs or (2 if args.quick else 3)
    if args.isolate:
        args.interleave = 1  # each system in its own process: nothing to interleave
    md = Path(args.results_md) if args.results_md else (None if args.quick or args.results_md == "" else RESULTS_MD)
    cfg_kw = dict(CONFIGS["tiny" if args.quick else args.config])
    if args.layers:
        cfg_kw["num_hidden_layers"] = args.layers

    try:
        import transformers
    except ImportError as e:
        sys.exit(f"e2e_decode.py: needs transformers ({e})")
    torch = gpu_or_exit("e2e_decode.py")
    import int4jit
    date = datetime.date.today().isoformat()
    # a run with its own layer count (e.g. --layers 32: the whole 8B) gets its own file and section
    tag = ("-quick" if args.quick else "") + (f"-{args.layers}layers" if args.layers else "")
    section = SECTION + (f" ({args.layers} layers)" if args.layers else "")
    json_path = Path(args.out) / f"e2e_decode{tag}-{date}.json"
    doc = dict(device=torch.cuda.get_device_name(), date=date, quick=args.quick, config=cfg_kw, tokens=args.tokens,
               prefill=args.prefill, runs=args.runs, interleave=args.interleave, group=GROUP, torch=torch.__version__,
               transformers=transformers.__version__, int4jit=int4jit.__version__,
               command=" ".join(["python3 bench/e2e_decode.py", *sys.argv[1:]]), systems={})
    try:
        doc["tinygemm_dtypes"] = probe_tinygemm_fp16(torch)
    except Exception as e:  # noqa: BLE001
        doc["tinygemm_dtypes"] = f"probe failed: {e}"[:200]

    print(f"writing {json_path}", flush=True)

    def save():
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(doc, indent=1))

    if args.isolate:
        doc["isolated"] = True
        for name in systems:
            print(f"{name} in its own process ...", flush=True)
            doc["systems"][name] = run_isolated(args, name)
            save()
    else:
        run_in_process(torch, systems, cfg_kw, args, doc, save)
    if md is not None:
        write_section(section, markdown(doc), md)
        print(f"wrote the '{section}' section of {md}")
    print(markdown(doc))


if __name__ == "__main__":
    main()
