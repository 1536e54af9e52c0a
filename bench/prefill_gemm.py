"""Prototype check of templates/gemm_sm90.hip on the GPU: correctness vs float64, timing vs dense / dequant+mm."""
import statistics, sys, time, json
import torch
from int4jit import backends
from int4jit.api import GemvWeights
from int4jit.backends._args import PackedArgs
from int4jit.launch import load
from int4jit.shapes import GemvShape
from int4jit.spec import make_gemm_spec, make_xperm_spec

dev = backends.device(0)
print(dev, flush=True)
torch.manual_seed(0)
G = 128

def xperm(x):
    T, K = x.shape
    return x.view(T, K // 128, 4, 4, 2, 2, 2).permute(0, 1, 3, 5, 6, 2, 4).reshape(T, K)

def make_w(N, K, dt_s=torch.float16, sym=False):
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
    s = (torch.rand(N, K // G, device="cuda") * 0.01 + 0.001).to(dt_s)
    z = None if sym else torch.randint(0, 16, (N, K // G), dtype=torch.uint8, device="cuda")
    return w, s, z

def dequant64(w, s, z, K):
    lo = (w & 15).to(torch.float64); hi = (w >> 4).to(torch.float64)
    q = torch.stack([lo, hi], -1).reshape(w.shape[0], K)
    zz = torch.full_like(s, 8, dtype=torch.float64) if z is None else z.to(torch.float64)
    return (q - zz.repeat_interleave(G, 1)) * s.to(torch.float64).repeat_interleave(G, 1)

def run_gemm(k, xp, w, s, z, y, T):
    args = PackedArgs([xp.data_ptr(), w.data_ptr(), s.data_ptr(), 0 if z is None else z.data_ptr(), y.data_ptr(), T])
    k.launch_packed(args, torch.cuda.current_stream().cuda_stream)
    return args

def timeit(fn, reps=20, rounds=5):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for i in range(reps): fn(i)
        b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(ts)

configs = [(128, 3), (128, 4), (128, 5), (64, 4)]
# correctness
bad = 0
for dt in (torch.float16, torch.bfloat16):
    for (N, K, T, sym, sdt) in ((256, 512, 1, False, torch.float16), (384, 1024, 77, True, torch.float16), (1024, 4096, 300, False, dt),
                                (4096, 4096, 512, False, torch.float16), (512, 896 if False else 1024, 129, False, torch.bfloat16)):
        w, s, z = make_w(N, K, sdt, sym)
        x = torch.randn(T, K, device="cuda", dtype=dt)
        ref = x.double() @ dequant64(w, s, z, K).t()
        xk = load(dev, make_xperm_spec(GemvShape(N, K, G, sym, dtype=str(dt)[6:]), dev.arch, dev.sm_count))
        xp_k = torch.full_like(x, float("nan"))
        xk.launch_packed(PackedArgs([x.data_ptr(), 0, 0, 0, xp_k.data_ptr(), T]), torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        same = torch.equal(xp_k, xperm(x).contiguous())
        bad += not same
        print("xperm kernel equals torch permute:", same, flush=True)
        for tok, st in configs:
            spec = make_gemm_spec(GemvShape(N, K, G, sym, dtype="bfloat16" if dt == torch.bfloat16 else "float16",
                                            scale_dtype="bfloat16" if sdt == torch.bfloat16 else "float16"), dev.arch, dev.sm_count, tok=tok, stages=st)
            try:
                kern = load(dev, spec)
            except Exception as e:
                print("LOAD FAIL", tok, st, str(e)[:2000]); bad += 1; continue
            y = torch.full((T, N), float("nan"), device="cuda", dtype=dt)
            run_gemm(kern, xperm(x).contiguous(), w, s, z, y, T)
            torch.cuda.synchronize()
            err = ((y.double() - ref).norm() / ref.norm()).item()
            mx = ((y.double() - ref).abs().max() / ref.abs().max()).item()
            ok = err < (5e-3 if dt == torch.bfloat16 else 2e-3) and not torch.isnan(y).any().item()
            bad += not ok
            print(f"check {str(dt)[6:]} N={N} K={K} T={T} sym={sym} tok={tok} st={st}: rel {err:.2e} max {mx:.2e} {'ok' if ok else 'BAD'}", flush=True)
print("bad", bad, flush=True)

# timing
copy_b = torch.empty(256 << 20, dtype=torch.uint8, device="cuda"); copy_a = torch.empty_like(copy_b)
t = timeit(lambda i=0: copy_b.copy_(copy_a), 10, 5)
print(f"copy {2 * copy_b.numel() / t / 1e6:.2f} TB/s", flush=True)
rows = []
for name, N, K in (("q/o", 4096, 4096), ("k/v", 1024, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336), ("lm_head", 128256, 4096)):
    for dt in (torch.float16, torch.bfloat16):
        T = 512
        copies = max(2, min(8, int(120e6 // (N * K // 2)) + 1))
        ws = [make_w(N, K) for _ in range(copies)]
        dense = [torch.randn(N, K, device="cuda", dtype=dt) for _ in range(max(2, min(copies, int(2e9 // (N * K * 2)))))]
        x = torch.randn(T, K, device="cuda", dtype=dt)
        y = torch.empty(T, N, device="cuda", dtype=dt)
        t_dense = timeit(lambda i=0: torch.matmul(x, dense[i % len(dense)].t(), out=y))
        layers = [GemvWeights(*wz) for wz in ws]
        wsp = torch.empty(N, K, device="cuda", dtype=dt)
        t_dq = timeit(lambda i=0: torch.matmul(x, layers[i % copies].dense(wsp).t(), out=y))
        xk = load(dev, make_xperm_spec(GemvShape(N, K, G, False, dtype=str(dt)[6:]), dev.arch, dev.sm_count))
        xp_buf = torch.empty_like(x)
        xargs = PackedArgs([x.data_ptr(), 0, 0, 0, xp_buf.data_ptr(), T])
        t_perm = timeit(lambda i=0: xk.launch_packed(xargs, torch.cuda.current_stream().cuda_stream))
        row = {"name": name, "N": N, "K": K, "dtype": str(dt)[6:], "dense": t_dense, "dequant_mm": t_dq, "xperm": t_perm}
        xp = xperm(x).contiguous()
        for tok, st in configs:
            spec = make_gemm_spec(GemvShape(N, K, G, False, dtype=str(dt)[6:]), dev.arch, dev.sm_count, tok=tok, stages=st)
            kern = load(dev, spec)
            argss = [PackedArgs([xp.data_ptr(), w.data_ptr(), s.data_ptr(), z.data_ptr(), y.data_ptr(), T]) for (w, s, z) in ws]
            stream = torch.cuda.current_stream().cuda_stream
            row[f"gemm{tok}_{st}"] = timeit(lambda i=0: kern.launch_packed(argss[i % copies], stream))
        best_cfg = min((k2 for k2 in row if k2.startswith("gemm")), key=row.get)
        tok, st = map(int, best_cfg[4:].split("_"))
        kern = load(dev, make_gemm_spec(GemvShape(N, K, G, False, dtype=str(dt)[6:]), dev.arch, dev.sm_count, tok=tok, stages=st))
        gargs = [PackedArgs([xp_buf.data_ptr(), w.data_ptr(), s.data_ptr(), z.data_ptr(), y.data_ptr(), T]) for (w, s, z) in ws]
        def both(i=0):
            st_ = torch.cuda.current_stream().cuda_stream
            xk.launch_packed(xargs, st_); kern.launch_packed(gargs[i % copies], st_)
        row["xperm+gemm"] = timeit(both)
        best = row["xperm+gemm"] - t_perm
        print(f"{name:8s} {dt} dense {t_dense:7.1f} dq+mm {t_dq:7.1f} ({t_dq/t_dense:.2f}x) xperm {t_perm:5.1f} "
              + " ".join(f"{k2} {v:7.1f}" for k2, v in row.items() if k2.startswith("gemm") and "_" in k2)
              + f"  xperm+gemm {row['xperm+gemm']:7.1f} = {row['xperm+gemm']/t_dense:.2f}x dense", flush=True)
        rows.append(row)
        del ws, dense, layers, wsp
        torch.cuda.empty_cache()
import os
json.dump(rows, open(os.environ.get("OUT", "/tmp") + "/gemm_try.json", "w"), indent=1)
