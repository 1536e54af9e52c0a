"""A/B experiments prepared for the next device call (issue 4), each in one process:

1. issue barrier (and, with it, twice the loads per step: UNROLL cap 16 // TN), and the
   weights through a 4-deep cp.async ring in shared memory instead (gemv.hip): ptxas sinks most weight loads below the first dot products (SASS of the
   tuned 28672x4096 config, gemv.hip BS=32 TN=8: 3 of 8 LDG.128 issued before the first FFMA;
   with the barrier all 8 are). A branch on the XOR of every loaded word ends the basic block,
   so all loads of a step are in flight before any is used. Both kernels, with and without.
2. programmatic dependent launch (small shapes): each launch may start while the previous
   kernel drains (cuLaunchKernelEx, PROGRAMMATIC_STREAM_SERIALIZATION); the kernel waits
   (griddepcontrol.wait) before its first global read and lets the next one in after its loop.
3. eager launch: cuLaunchKernel through cuda-bindings (the library's path) against a ctypes
   prototype of libcuda's entry point, wall time per call from Python, same kernel and args.

    python3 bench/proto/ab_next.py            # GPU: correctness + timing table
    python3 bench/proto/ab_next.py --sass     # CPU: where the loads issue, with and without
"""
import argparse
import ctypes
import functools
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from int4jit import compiler, launch, reference, tuner  # noqa: E402
from int4jit.shapes import GemvShape, LaunchConfig  # noqa: E402

BARRIER_FN = '''
__device__ __forceinline__ void issue_barrier(u32 v) {
    if (v == 0x9E3779B9u) asm volatile("nanosleep.u32 0;");
}
'''
SIMT_ANCHOR = '''#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (i0 + u >= ITERS || lane + (i0 + u) * KT >= CHUNKS) continue;'''
SIMT_BARRIER = '''        {
            u32 all = 0;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                for (int r = 0; r < TN; ++r)
#pragma unroll
                    for (int i = 0; i < VEC / 4; ++i) all ^= wq[u][r][i];
            issue_barrier(all);
        }
'''
MMA_ANCHOR = '''#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int step = s0 + u * KSPLIT;'''
MMA_BARRIER = '''            {
                u32 all = 0;
#pragma unroll
                for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                    for (int tw = 0; tw < TW; ++tw)
#pragma unroll
                        for (int i = 0; i < 8; ++i) all ^= wq[u][tw][i / 4][i % 4];
                issue_barrier(all);
            }
'''


_REAL_READ = compiler._read_template.__wrapped__
_REAL_CLASSIC = compiler._classic_geometry


def classic_geometry_cap(cap: int):
    """gemv.hip's geometry with UNROLL = min(iters, cap // TN) (shipped: cap 8)."""
    return functools.partial(_REAL_CLASSIC, unroll_cap=cap)


def patched_templates(barrier: bool):
    real = _REAL_READ

    def read(name):
        text = real(name)
        if not barrier:
            return text
        if name == "prelude_cuda.hip":
            return text + BARRIER_FN
        if name == compiler.TEMPLATE_CLASSIC:
            assert SIMT_ANCHOR in text
            return text.replace(SIMT_ANCHOR, SIMT_BARRIER + SIMT_ANCHOR)
        if name == compiler.TEMPLATE_MMA:
            assert MMA_ANCHOR in text
            return text.replace(MMA_ANCHOR, MMA_BARRIER + MMA_ANCHOR)
        return text
    return read


PDL_ENTRY = """    const int tid = threadIdx.x;
    const int lane = tid % KT;"""
PDL_WAIT = """    asm volatile("griddepcontrol.wait;" ::: "memory");
"""
PDL_TAIL = """    // Sum each row over the KT threads of its group"""
PDL_LAUNCH = """    asm volatile("griddepcontrol.launch_dependents;");
"""


def use_pdl_template():
    """gemv.hip with the two griddepcontrol points (waits before any global read)."""
    def read(name):
        text = _REAL_READ(name)
        if name == compiler.TEMPLATE_CLASSIC:
            assert PDL_ENTRY in text and PDL_TAIL in text
            text = text.replace(PDL_ENTRY, PDL_WAIT + PDL_ENTRY).replace(PDL_TAIL, PDL_LAUNCH + PDL_TAIL)
        return text
    compiler._read_template = read
    compiler._classic_geometry = _REAL_CLASSIC
    os.environ["INT4JIT_KERNEL"] = "simt"
    compiler._memo.clear()
    launch._loaded.clear()


class PDLKernel:
    """A loaded kernel launched with programmatic stream serialization allowed."""
    def __init__(self, kernel):
        from cuda.bindings import driver
        from int4jit.backends._args import PackedArgs
        self.k, self.drv, self.packed = kernel, driver, PackedArgs
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        self.attrs = [attr]

    def __call__(self, x, w, s, z, y, stream=0):
        cfg = self.drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.k.grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.k.block, 1, 1
        cfg.sharedMemBytes, cfg.hStream = 0, stream
        cfg.attrs, cfg.numAttrs = self.attrs, 1
        args = self.packed((x, w, s, z, y))
        (err,) = self.drv.cuLaunchKernelEx(cfg, self.k.function, args.params_address, 0)
        if int(err):
            raise RuntimeError(f"cuLaunchKernelEx: {err}")


def pdl_ab(dev):
    """Graph replay of back-to-back launches, plain vs PDL, on small and mid suite shapes."""
    import torch
    print(f"{'shape':>24s} {'plain':>8s} {'PDL':>8s}  (us per call, table config, graph replay)")
    for N, K in [(896, 896), (1152, 896), (2048, 2048), (3072, 2048), (4096, 4096), (28672, 4096)]:
        shape = GemvShape(N, K, 128, False)
        cfg = tuner.select_config(shape, dev.arch, None).config
        bufs = tuner.BenchBuffers(dev, shape)
        stream = dev.create_stream()
        try:
            use_variant(False, "simt")
            plain = tuner.time_kernel(launch.load_kernel(dev, shape, cfg), bufs, stream)
            use_pdl_template()
            k = launch.load_kernel(dev, shape, cfg)
            pdl = tuner.time_kernel(PDLKernel(k), bufs, stream)
            x, w, s, z = reference.random_problem(shape)  # correctness of the PDL variant
            t = [torch.from_numpy(a).cuda() for a in (x, w, s, z)]
            out = torch.full((N,), float("nan"), dtype=torch.float16, device="cuda")
            PDLKernel(k)(*(a.data_ptr() for a in t), out.data_ptr(), torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            ref = reference.reference_gemv(x, w, s, z)
            err = np.linalg.norm(out.cpu().numpy().astype(np.float64) - ref) / np.linalg.norm(ref)
            print(f"{shape.key():>24s} {plain:6.2f}us {pdl:6.2f}us  err {err:.1e}", flush=True)
        finally:
            dev.destroy_stream(stream)
            bufs.free()


CP_PRELUDE = """
// cp.async (sm_80+): 16 or 8 bytes global -> shared without a register, completed by groups.
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, int bytes) {
    unsigned long long s;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(smem));
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((u32)s), "l"(gmem) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"((u32)s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(PENDING) : "memory");
}
"""
CP_LOOP_OLD = """    for (int i0 = 0; i0 < ITERS; i0 += UNROLL) {
        u32 wq[UNROLL][TN][VEC / 4];"""
CP_LOOP_NEW = """    // Weights stream through a CP_STAGES-deep ring in shared memory (each thread its own
    // slots): CP_STAGES - 1 batches are always in flight, in no register.
    constexpr int CP_STAGES = 4;
    constexpr int BATCHES = (ITERS + UNROLL - 1) / UNROLL;
    __shared__ u32x4 wstage[CP_STAGES][UNROLL][TN][BS];
    auto issue = [&](int batch) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            int c = lane + (batch * UNROLL + u) * KT;
            c = c < CHUNKS ? c : CHUNKS - 1;
#pragma unroll
            for (int r = 0; r < TN; ++r)
                cp_async(&wstage[batch % CP_STAGES][u][r][tid], w + rows[r] * ROW_BYTES + (long long)c * VEC, VEC);
        }
    };
#pragma unroll
    for (int b = 0; b < CP_STAGES - 1; ++b) {
        if (b < BATCHES) issue(b);
        cp_async_commit();
    }
    for (int i0 = 0; i0 < ITERS; i0 += UNROLL) {
        {   // refill the slot read one batch ago (its values are consumed), then wait for this batch
            const int b = i0 / UNROLL + CP_STAGES - 1;
            if (b < BATCHES) issue(b);
            cp_async_commit();
            cp_async_wait<CP_STAGES - 1>();
        }
        u32 wq[UNROLL][TN][VEC / 4];"""
CP_LOAD_OLD = """                const u8* p = w + rows[r] * ROW_BYTES + (long long)c * VEC;
                if constexpr (VEC == 16) {
                    const u32x4 v = load_stream16(p);
                    wq[u][r][0] = v.x; wq[u][r][1] = v.y; wq[u][r][2] = v.z; wq[u][r][3] = v.w;
                } else {
                    const u32x2 v = load_stream8(p);
                    wq[u][r][0] = v.x; wq[u][r][1] = v.y;
                }"""
CP_LOAD_NEW = """                const u32x4 v = wstage[(i0 / UNROLL) % CP_STAGES][u][r][tid];
                wq[u][r][0] = v.x; wq[u][r][1] = v.y;
                if constexpr (VEC == 16) { wq[u][r][2] = v.z; wq[u][r][3] = v.w; }"""


def use_cpasync_template():
    """gemv.hip with its weights through a cp.async ring (UNROLL 1: the ring is the depth)."""
    def read(name):
        text = _REAL_READ(name)
        if name == "prelude_cuda.hip":
            return text + CP_PRELUDE
        if name == compiler.TEMPLATE_CLASSIC:
            assert CP_LOOP_OLD in text and CP_LOAD_OLD in text
            text = text.replace(CP_LOOP_OLD, CP_LOOP_NEW).replace(CP_LOAD_OLD, CP_LOAD_NEW)
        return text
    compiler._read_template = read
    compiler._classic_geometry = classic_geometry_cap(1)
    os.environ["INT4JIT_KERNEL"] = "simt"
    compiler._memo.clear()
    launch._loaded.clear()


def use_variant(barrier: bool, kernel: str, cap: int = 8):
    compiler._read_template = patched_templates(barrier)
    compiler._classic_geometry = classic_geometry_cap(cap)
    os.environ["INT4JIT_KERNEL"] = kernel
    compiler._memo.clear()
    launch._loaded.clear()


def sass_check(cuobjdump):
    import subprocess
    import tempfile
    for kernel, cfg in [("simt", LaunchConfig(32, 8)), ("simt", LaunchConfig(64, 4)), ("simt", LaunchConfig(256, 2)),
                        ("mma", LaunchConfig(128, 2))]:
        for barrier, cap in ((False, 8), (True, 8), (True, 16)):
            if kernel == "mma" and cap == 16:
                continue
            use_variant(barrier, kernel, cap)
            c = compiler.compile_gemv(GemvShape(28672, 4096, 128, False), cfg, "sm_90")
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(c.binary)
                f.flush()
                sass = subprocess.run([cuobjdump, "--dump-sass", f.name], capture_output=True, text=True).stdout
            ops = re.findall(r"\b(LDG\.E\.NA\.128\S*|FFMA|HMMA\S*)", sass)
            first = next(i for i, o in enumerate(ops) if not o.startswith("LDG"))
            print(f"{kernel} {cfg} barrier={barrier} cap={cap}: {ops[:first].count('LDG.E.NA.128.CONSTANT')} of "
                  f"{sum(o.startswith('LDG') for o in ops)} weight loads issued before the first use")


def gpu_run():
    from int4jit import backends
    dev = backends.device()
    # Each experiment stands alone: one that fails is reported and the others still run.
    for part in (barrier_correctness, barrier_timing, eager_ab, pdl_ab):
        try:
            part(dev)
        except Exception as e:  # noqa: BLE001
            import traceback
            print(f"{part.__name__} FAILED: {e!r}")
            traceback.print_exc()


def barrier_correctness(dev):
    import torch
    rng = np.random.default_rng()
    print("correctness (both kernels, every variant):")
    for N, K, g, sym in [(4097, 4096, 128, False), (1000, 2080, 16, True), (7, 896, 32, False)]:
        shape = GemvShape(N, K, g, sym)
        x, w, s, z = reference.random_problem(shape, rng)
        ref = reference.reference_gemv(x, w, s, z)
        t = [None if a is None else torch.from_numpy(a).cuda() for a in (x, w, s, z)]
        for kernel, barrier, cap in [("simt", False, 8), ("simt", True, 8), ("simt", True, 16),
                                     ("mma", False, 8), ("mma", True, 8), ("cpasync", False, 1)]:
            if kernel == "cpasync":
                use_cpasync_template()
            else:
                use_variant(barrier, kernel, cap)
            for cfg in (LaunchConfig(32, 8), LaunchConfig(128, 2), LaunchConfig(64, 4)):
                out = torch.full((N,), float("nan"), dtype=torch.float16, device="cuda")
                launch.load_kernel(dev, shape, cfg)(*(0 if a is None else a.data_ptr() for a in t), out.data_ptr())
                torch.cuda.synchronize()
                y = out.cpu().numpy().astype(np.float64)
                err = np.linalg.norm(y - ref) / np.linalg.norm(ref) if np.isfinite(y).all() else float("inf")
                assert err < 2e-3, (shape, kernel, barrier, cap, cfg, err)
    print("  all within 2e-3")


def barrier_timing(dev):
    variants = {"plain": lambda k: use_variant(False, k, 8), "barrier": lambda k: use_variant(True, k, 8),
                "barrier16": lambda k: use_variant(True, k, 16), "cp.async": lambda k: use_cpasync_template()}
    print(f"{'shape':>24s} {'kernel':>5s} " + " ".join(f"{v:>10s}" for v in variants)
          + "  (best of the 20-point grid, us; cp.async: gemv.hip only)")
    for N, K, g in [(28672, 4096, 128), (128256, 4096, 128), (4096, 4096, 128), (4096, 14336, 128),
                    (28672, 4096, 32), (2048, 2048, 128)]:
        shape = GemvShape(N, K, g, False)
        bufs = tuner.BenchBuffers(dev, shape)
        stream = dev.create_stream()
        try:
            for kernel in ("simt", "mma"):
                best = {}
                for name, apply in variants.items():
                    if kernel == "mma" and name in ("barrier16", "cp.async"):
                        continue
                    apply(kernel)
                    compiled = tuner._compile_all(shape, tuner.candidate_grid(True), dev.arch)  # in parallel
                    times = [tuner.time_kernel(launch.load_kernel(dev, shape, c), bufs, stream)
                             for c, ok in compiled.items() if ok is not None]  # too much shared memory: dropped
                    best[name] = min(times)
                cells = " ".join(f"{best[v]:8.2f}us" if v in best else f"{'':>10s}" for v in variants)
                print(f"{shape.key():>24s} {kernel:>5s} {cells}", flush=True)
        finally:
            dev.destroy_stream(stream)
            bufs.free()


def eager_ab(dev):
    """Per-call wall time of one launch from Python: the bindings' cuLaunchKernel vs ctypes."""
    import torch
    from int4jit.backends._args import PackedArgs
    use_variant(False, "simt")
    shape = GemvShape(4096, 4096, 128, False)
    k = launch.load_kernel(dev, shape, tuner.select_config(shape, dev.arch, None).config)
    x, w, s, z = reference.random_problem(shape)
    t = [torch.from_numpy(a).cuda() for a in (x, w, s, z)] + [torch.empty(4096, dtype=torch.float16, device="cuda")]
    args = PackedArgs([a.data_ptr() for a in t])
    stream = torch.cuda.current_stream().cuda_stream
    lib = ctypes.CDLL("libcuda.so.1")
    c_launch = lib.cuLaunchKernel
    c_launch.restype = ctypes.c_int
    c_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    fn = int(k.function)

    def via_bindings():
        k.launch_packed(args, stream)

    def via_ctypes():
        if c_launch(fn, k.grid, 1, 1, k.block, 1, 1, 0, stream or None, args.params_address, None):
            raise RuntimeError("cuLaunchKernel failed")

    def gemv_call():
        import int4jit
        int4jit.gemv(t[0], t[1], t[2], t[3], out=t[4])

    for name, fn_ in [("bindings", via_bindings), ("ctypes", via_ctypes), ("int4jit.gemv", gemv_call)]:
        runs = []
        for _ in range(5):
            fn_()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                fn_()
            torch.cuda.synchronize()
            runs.append((time.perf_counter() - t0) / 2000 * 1e6)
        print(f"eager {name:>13s}: {statistics.median(runs):6.2f} us/call (launch only, GPU time 4096x4096 "
              f"~6 us)", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", metavar="CUOBJDUMP", nargs="?", const="cuobjdump")
    a = ap.parse_args()
    sass_check(a.sass) if a.sass else gpu_run()
