import statistics, torch
from int4jit import backends
from int4jit.backends._args import PackedArgs
from int4jit.launch import load
from int4jit.shapes import GemvShape
from int4jit.spec import make_gemm_spec
dev = backends.device(0)
N, K = 14336, 4096
ws = []
for _ in range(3):
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
    s = (torch.rand(N, K // 128, device="cuda") * 0.01).half()
    z = torch.randint(0, 16, (N, K // 128), dtype=torch.uint8, device="cuda")
    ws.append((w, s, z))
st = torch.cuda.current_stream().cuda_stream
def timeit(fn, reps=20, rounds=5):
    fn(0); torch.cuda.synchronize(); ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True); a.record()
        for i in range(reps): fn(i)
        b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(ts)
for T in (512, 256, 2048):
    x = torch.randn(T, K, device="cuda", dtype=torch.float16)
    y = torch.empty(T, N, device="cuda", dtype=torch.float16)
    dense = torch.randn(N, K, device="cuda", dtype=torch.float16)
    td = timeit(lambda i: torch.matmul(x, dense.t(), out=y))
    out = [f"T={T} dense {td:.1f}"]
    for probe in (0, 1, 2):
        for tok, stg in ((128, 4),):
            k = load(dev, make_gemm_spec(GemvShape(N, K, 128, False), dev.arch, dev.sm_count, tok=tok, stages=stg, probe=probe))
            args = [PackedArgs([x.data_ptr(), w.data_ptr(), s.data_ptr(), z.data_ptr(), y.data_ptr(), T]) for w, s, z in ws]
            t = timeit(lambda i: k.launch_packed(args[i % 3], st))
            out.append(f"probe{probe} {t:.1f} ({2*T*N*K/t/1e6:.0f} TFLOPS)")
    print("  ".join(out), flush=True)
