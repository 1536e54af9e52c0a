"""gemv on a real GPU against the float64 reference, fresh random data every case."""
import numpy as np
import pytest

import int4jit
from int4jit.shapes import SUPPORTED_GROUPS, candidate_grid

from conftest import few_outputs_floor, random_problem, rel_error
from conftest import torch_reference as reference  # float64 on the GPU

pytestmark = pytest.mark.gpu
TOL = 2e-3


try:  # import at collection: torch fails to import late in a long pytest process
    import torch as _torch_module
except ImportError:
    _torch_module = None


def _torch():
    if _torch_module is None:
        pytest.skip("torch is not installed")
    return _torch_module


def run_torch(x, w, s, z, **kw):
    t = _torch()
    dev = lambda a: None if a is None else t.from_numpy(np.ascontiguousarray(a)).cuda()
    xt, wt, st, zt = dev(x), dev(w), dev(s), dev(z)
    out = t.full((w.shape[0],), float("nan"), dtype=t.float16, device="cuda")  # poison
    int4jit.gemv(xt, wt, st, zt, out=out, **kw)
    t.cuda.synchronize()
    return out.cpu().numpy()


def device_problem(rng, N, K, group, symmetric=False):
    """Fresh random problem: host arrays, their torch copies on the GPU, a NaN-poisoned out."""
    t = _torch()
    host = random_problem(rng, N, K, group, symmetric)
    tensors = tuple(None if a is None else t.from_numpy(a).cuda() for a in host)
    return host, tensors, t.full((N,), float("nan"), dtype=t.float16, device="cuda")


SWEEP = [(N, K, g, sym) for N in (1, 7, 896, 4096, 11008) for K in ("g", 896, 4096, 14336)
         for g in SUPPORTED_GROUPS for sym in (True, False) if K == "g" or K % g == 0]


@pytest.mark.parametrize("N,K,group,symmetric", SWEEP)
def test_sweep_against_reference(N, K, group, symmetric, monkeypatch):
    monkeypatch.setenv("INT4JIT_TUNE", "0")  # heuristic pick: the sweep is about correctness
    K = group if K == "g" else K
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, N, K, group, symmetric)
    y = run_torch(x, w, s, z)
    assert rel_error(y, reference(x, w, s, z), few_outputs_floor(x, w, s, z)) <= TOL


@pytest.mark.parametrize("cfg", candidate_grid(exhaustive=True), ids=str)
@pytest.mark.parametrize("N,K,group", [(4096, 4096, 128), (1000, 2064, 16), (1000, 2080, 16)])
def test_every_grid_point(cfg, N, K, group):
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, N, K, group, symmetric=False)
    y = run_torch(x, w, s, z, config=(cfg.BS, cfg.TN))
    assert rel_error(y, reference(x, w, s, z)) <= TOL


MMA_CASES = [(N, K, g, sym) for N in (1, 7, 4097) for K in (32, 96, 4096, 17920) for g in SUPPORTED_GROUPS
             for sym in (True, False) if K % g == 0]


@pytest.mark.parametrize("kernel", ["tc", "simt"])
@pytest.mark.parametrize("N,K,group,symmetric", MMA_CASES)
def test_tensor_core_kernel_against_reference(N, K, group, symmetric, kernel, monkeypatch):
    """Both kernels (INT4JIT_KERNEL=tc, the default for N >= 2048 on sm_80+, and simt) compute
    the same function, down to N = 1 and K = one 32-element chunk."""
    monkeypatch.setenv("INT4JIT_KERNEL", kernel)
    monkeypatch.setenv("INT4JIT_TUNE", "0")
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, N, K, group, symmetric)
    assert rel_error(run_torch(x, w, s, z), reference(x, w, s, z), few_outputs_floor(x, w, s, z)) <= TOL


@pytest.mark.parametrize("kernel", ["tc", "simt"])
@pytest.mark.parametrize("cfg", candidate_grid(exhaustive=True), ids=str)
@pytest.mark.parametrize("K,group", [(2080, 16), (4096, 32)])  # a partial last step; whole steps (paired scale loads)
def test_tensor_core_kernel_every_grid_point(cfg, kernel, K, group, monkeypatch):
    monkeypatch.setenv("INT4JIT_KERNEL", kernel)
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 3001, K, group, symmetric=False)
    y = run_torch(x, w, s, z, config=(cfg.BS, cfg.TN))
    assert rel_error(y, reference(x, w, s, z)) <= TOL


def test_numpy_in_numpy_out():
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 896, 4864, 32, False)
    y = int4jit.gemv(x, w, s, z)
    assert isinstance(y, np.ndarray) and y.dtype == np.float16 and y.shape == (896,)
    assert rel_error(y, reference(x, w, s, z)) <= TOL
    y2 = int4jit.gemv(x.reshape(1, -1), w, s, None)
    assert y2.shape == (1, 896)
    assert rel_error(y2, reference(x.reshape(1, -1), w, s, None)) <= TOL


def test_numpy_out_argument():
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 300, 512, 64, True)
    out = np.full(300, np.nan, dtype=np.float16)
    r = int4jit.gemv(x, w, s, z, out=out)
    assert r is out
    assert rel_error(out, reference(x, w, s, z)) <= TOL


def test_torch_returns_torch_on_current_stream():
    t = _torch()
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 2048, 2048, 128, False)
    args = [t.from_numpy(a).cuda() for a in (x, w, s, z)]
    side = t.cuda.Stream()
    with t.cuda.stream(side):
        y = int4jit.gemv(*args)
    side.synchronize()
    assert isinstance(y, t.Tensor) and y.dtype == t.float16 and y.is_cuda and tuple(y.shape) == (2048,)
    assert rel_error(y.cpu().numpy(), reference(x, w, s, z)) <= TOL


def test_explicit_non_default_stream():
    t = _torch()
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 4096, 4096, 64, True)
    args = [t.from_numpy(a).cuda() for a in (x, w, s)]
    out = t.full((4096,), float("nan"), dtype=t.float16, device="cuda")
    stream = t.cuda.Stream()
    t.cuda.synchronize()
    int4jit.gemv(*args, None, out=out, stream=stream)
    stream.synchronize()
    assert rel_error(out.cpu().numpy(), reference(x, w, s, None)) <= TOL
    out.fill_(float("nan"))
    t.cuda.synchronize()
    int4jit.gemv(*args, None, out=out, stream=stream.cuda_stream)  # raw handle
    stream.synchronize()
    assert rel_error(out.cpu().numpy(), reference(x, w, s, None)) <= TOL


def test_cupy_inputs():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 1152, 896, 32, False)
    y = int4jit.gemv(*(cp.asarray(a) for a in (x, w, s, z)))
    assert isinstance(y, cp.ndarray) and y.dtype == np.float16
    assert rel_error(cp.asnumpy(y), reference(x, w, s, z)) <= TOL


def test_quantized_real_weights_match_fp_product():
    """End to end: quantize float weights, run, compare with the float64 reference."""
    rng = np.random.default_rng()
    W = rng.standard_normal((4096, 4096)).astype(np.float32) * 0.02
    w, s, z = int4jit.quantize(W, 128)
    x = rng.standard_normal(4096).astype(np.float16)
    y = run_torch(x, w, s, z)
    assert rel_error(y, reference(x, w, s, z)) <= TOL


def test_mismatched_device_mix_rejected_before_launch():
    t = _torch()
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 64, 256, 32, False)
    with pytest.raises(TypeError, match="host"):
        int4jit.gemv(t.from_numpy(x).cuda(), w, s, z)


VARIANTS = ["", "streaming=1", "streaming=1,raw_a=1", "kcluster=2", "one_wave=1", "loads=8", "prefetch=0",
            "prefetch=2", "streaming=1,kcluster=2,loads=8", "early=1", "early=1,raw_a=1,loads=8", "early=1,kcluster=2",
            "xahead=1", "streaming=1,xahead=1", "early=1,xahead=1,loads=8"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("N,K,group,symmetric,cfg", [(4096, 4096, 128, False, "128,4"), (3001, 2080, 16, True, "256,2"),
                                                     (5120, 17920, 32, False, "256,8"), (28672, 4096, 128, True, "128,8")])
def test_every_variant_against_reference(N, K, group, symmetric, cfg, variant):
    """Each variant field of the tc kernel (data the tuner searches) computes the same function."""
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, N, K, group, symmetric)
    y = run_torch(x, w, s, z, config=cfg + ("," + variant if variant else ""))
    assert rel_error(y, reference(x, w, s, z)) <= TOL


TC_TOKEN_CASES = [(1, "bfloat16", "float16"), (1, "bfloat16", "bfloat16"), (1, "float16", "bfloat16"),
                  (2, "float16", "float16"), (5, "bfloat16", "float16"), (8, "float16", "float16"),
                  (8, "bfloat16", "bfloat16")]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("N,K,group,symmetric,cfg", [(4096, 4096, 128, False, "128,4"), (3001, 2080, 16, True, "256,2"),
                                                     (5120, 17920, 32, False, "256,8"), (28672, 4096, 128, True, "128,8"),
                                                     (4097, 4352, 256, False, "64,2")])
@pytest.mark.parametrize("M,dtype,scale_dtype", TC_TOKEN_CASES)
def test_tc_tokens_and_bf16_every_variant(M, dtype, scale_dtype, N, K, group, symmetric, cfg, variant):
    """The tc kernel with bf16 (x, out, scales) and several tokens (scaled A under g128, a partial
    last step at 2080), every variant field (those that cannot apply are normalised away), against
    the float64 reference; outputs poisoned first."""
    t = _torch()
    rng = np.random.default_rng()
    _, w, s, z = random_problem(rng, N, K, group, symmetric)
    st = t.from_numpy(s).cuda().to(getattr(t, scale_dtype))
    xs = t.randn(M, K, device="cuda", dtype=getattr(t, dtype))
    out = t.full((M, N), float("nan"), dtype=getattr(t, dtype), device="cuda")
    int4jit.gemv(xs, t.from_numpy(w).cuda(), st, None if z is None else t.from_numpy(z).cuda(), out=out,
                 config=cfg + ("," + variant if variant else ""))
    t.cuda.synchronize()
    ref = reference(xs.float().cpu().numpy(), w, st.float().cpu().numpy(), z)
    assert rel_error(out.float().cpu().numpy(), ref) <= (TOL if dtype == "float16" else 5e-3)


def test_autotune_stores_the_winner_and_reuses_it(monkeypatch):
    from int4jit import backends, plan, tuner
    from int4jit.shapes import GemvShape
    from int4jit.tuning_db import TuningDB
    dev = backends.device()
    shape = GemvShape(3000, 2048, 64, False)
    p = plan.plan(shape, dev.arch, dev)
    assert p.tier == "tuned"
    rec = TuningDB(dev.arch).get(tuner.db_key(shape, p.spec.kernel), tuner.db_context(p.spec.kernel, dev.arch, dev))
    assert rec is not None and rec.config["BS"] == p.spec.config.BS and len(rec.candidates) >= 9
    times = {k: v for k, v in rec.candidates.items() if v is not None}
    assert rec.us == min(times.values()) and all(v > 0 for v in times.values())
    assert plan.plan(shape, dev.arch, dev).tier == "db"
    # gemv uses the stored winner and is right
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 3000, 2048, 64, False)
    assert rel_error(run_torch(x, w, s, z), reference(x, w, s, z)) <= TOL


def test_repeated_eager_calls_follow_new_data_and_new_tensors():
    """The per-call fast path re-reads pointers: new values, new tensors, new shapes all work."""
    t = _torch()
    rng = np.random.default_rng()
    (x, w, s, z), (xt, wt, st, zt), out = device_problem(rng, 4096, 4096, 128)
    for _ in range(3):
        x2 = rng.standard_normal(4096).astype(np.float16)
        xt.copy_(t.from_numpy(x2))
        out.fill_(float("nan"))
        int4jit.gemv(xt, wt, st, zt, out=out)
        t.cuda.synchronize()
        assert rel_error(out.cpu().numpy(), reference(x2, w, s, z)) <= TOL
    host, args, out = device_problem(rng, 4096, 4096, 128)  # fresh tensors, same shape
    int4jit.gemv(*args, out=out)
    t.cuda.synchronize()
    assert rel_error(out.cpu().numpy(), reference(*host)) <= TOL


def test_graph_capture_and_replay():
    t = _torch()
    rng = np.random.default_rng()
    (x, w, s, z), (xt, wt, st, zt), out = device_problem(rng, 2048, 8192, 32)
    int4jit.gemv(xt, wt, st, zt, out=out)  # select + compile outside the capture
    t.cuda.synchronize()
    out.fill_(float("nan"))
    g = t.cuda.CUDAGraph()
    with t.cuda.graph(g):
        int4jit.gemv(xt, wt, st, zt, out=out)
    x2 = rng.standard_normal(8192).astype(np.float16)
    xt.copy_(t.from_numpy(x2))
    g.replay()
    t.cuda.synchronize()
    assert rel_error(out.cpu().numpy(), reference(x2, w, s, z)) <= TOL


def test_sixteen_threads_own_streams_shared_weights():
    import threading
    t = _torch()
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, 4096, 4096, 128, False)
    wt, st, zt = (t.from_numpy(a).cuda() for a in (w, s, z))
    xs = [rng.standard_normal(4096).astype(np.float16) for _ in range(16)]
    refs = [reference(xi, w, s, z) for xi in xs]
    errors, results = [], [None] * 16

    def worker(i):
        try:
            stream = t.cuda.Stream()
            with t.cuda.stream(stream):
                xt = t.from_numpy(xs[i]).cuda()
                out = t.full((4096,), float("nan"), dtype=t.float16, device="cuda")
                for _ in range(50):
                    int4jit.gemv(xt, wt, st, zt, out=out)
            stream.synchronize()
            results[i] = out.cpu().numpy()
        except Exception as e:  # collected and re-raised on the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for y, ref in zip(results, refs):
        assert rel_error(y, ref) <= TOL


@pytest.mark.parametrize("N,K,group", [(262144, 1024, 128), (2048, 65536, 256), (8192, 17920, 32)])
def test_large_problems(N, K, group):
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, N, K, group, False)
    y = run_torch(x, w, s, z)
    assert rel_error(y, reference(x, w, s, z)) <= TOL


CHAIN_CONFIGS = ["", "*=256,2,streaming=1,prefetch=1", "*=256,2,early=1", "*=128,4,early=1,prefetch=1",
                 "*=512,4,early=1,loads=8", "*=256,2,early=1,kcluster=2"]


def chain_problems(rng, dims, group=128):
    """Random problems for a chain (layer i: K = dims[i], N = dims[i + 1]) whose scales are
    shrunk so a layer keeps |y| near |x|: seven raw random layers grow past fp16's range."""
    out = []
    for K, N in zip(dims[:-1], dims[1:]):
        x, w, s, z = random_problem(rng, N, K, group, False)
        y = reference(x, w, s, z)
        gain = np.linalg.norm(y) / np.sqrt(N) / (np.linalg.norm(x.astype(np.float64)) / np.sqrt(K))
        out.append((w, (s.astype(np.float64) / gain).astype(np.float16), z))
    return out


@pytest.mark.parametrize("config", CHAIN_CONFIGS)
def test_chain_of_pdl_launches_equals_per_call_results(config, monkeypatch):
    """A decode-like chain in one graph (each GEMV's x is the previous one's y, PDL between them;
    weights prefetched or loaded before the wait where the variant says) gives exactly the
    per-call results."""
    if config:
        monkeypatch.setenv("INT4JIT_CONFIG", config)
    t = _torch()
    rng = np.random.default_rng()
    dims = [4096, 6144, 4096, 14336, 4096, 2048, 4096]  # y of one layer is x of the next
    layers = [(host, tuple(t.from_numpy(a).cuda() for a in host)) for host in chain_problems(rng, dims)]
    x0 = t.from_numpy(rng.standard_normal(dims[0]).astype(np.float16) * 0.1).cuda()
    outs = [t.empty(N, dtype=t.float16, device="cuda") for N in dims[1:]]

    def chain():
        x = x0
        for (_, (w, s, z)), out in zip(layers, outs):
            int4jit.gemv(x, w, s, z, out=out)
            x = out
    chain()
    t.cuda.synchronize()
    expected = [o.clone() for o in outs]
    x = x0
    for (host, _), e in zip(layers, expected):  # each step against the reference
        ref = reference(x.cpu().numpy(), *host)
        assert rel_error(e.cpu().numpy(), ref) <= TOL
        x = e
    s = t.cuda.Stream()
    g = t.cuda.CUDAGraph()
    with t.cuda.graph(g, stream=s):
        chain()
    for o in outs:
        o.fill_(float("nan"))
    g.replay()
    t.cuda.synchronize()
    for o, e in zip(outs, expected):
        assert t.equal(o, e)


@pytest.mark.parametrize("group", [128, 32])
@pytest.mark.parametrize("config", CHAIN_CONFIGS + ["layers"])
def test_pdl_chain_through_two_buffers(config, group, monkeypatch):
    """The chain through two ping-pong buffers, after a torch copy writes x: each GEMV overwrites
    the buffer its predecessor read (a write after read across the PDL overlap) and reads what its
    predecessor wrote. The graph's last output equals the per-call chain's, bit for bit.
    'layers': GemvWeights calls (fixed weights: the early build where it is measured or ruled faster)."""
    if config and config != "layers":
        monkeypatch.setenv("INT4JIT_CONFIG", config)
    t = _torch()
    rng = np.random.default_rng()
    dims = [4096, 14336, 4096, 6144, 4096, 4096, 2048, 4096]
    layers = [tuple(t.from_numpy(a).cuda() for a in host) for host in chain_problems(rng, dims, group)]
    x0 = t.from_numpy(rng.standard_normal(dims[0]).astype(np.float16) * 0.1).cuda()
    bufs = [t.empty(max(dims), dtype=t.float16, device="cuda") for _ in range(2)]

    fixed = [int4jit.GemvWeights(w, s, z) for w, s, z in layers]

    def chain(sync=False):
        bufs[0][:dims[0]].copy_(x0)
        for i, ((w, s, z), K, N) in enumerate(zip(layers, dims[:-1], dims[1:])):
            if config == "layers":
                fixed[i](bufs[i % 2][:K], out=bufs[(i + 1) % 2][:N])
            else:
                int4jit.gemv(bufs[i % 2][:K], w, s, z, out=bufs[(i + 1) % 2][:N])
            if sync:  # one call at a time: nothing overlaps
                t.cuda.synchronize()
        return bufs[len(layers) % 2][:dims[-1]]
    expected = chain(sync=True).clone()
    t.cuda.synchronize()
    assert t.isfinite(expected).all()
    g = t.cuda.CUDAGraph()
    with t.cuda.graph(g, stream=t.cuda.Stream()):
        chain()
    for b in bufs:
        b.fill_(float("nan"))
    g.replay()
    t.cuda.synchronize()
    assert t.equal(bufs[len(layers) % 2][:dims[-1]], expected)


def test_gemv_weights_new_tensors_every_call():
    """GemvWeights (the per-layer path Int4Linear uses): a new x and out every call, right each time;
    bad x refused naming it."""
    t = _torch()
    rng = np.random.default_rng()
    (x, w, s, z), (xt, wt, st, zt), _ = device_problem(rng, 4096, 4096, 128)
    layer = int4jit.GemvWeights(wt, st, zt)
    for _ in range(3):
        x2 = rng.standard_normal(4096).astype(np.float16)
        y = layer(t.from_numpy(x2).cuda())
        t.cuda.synchronize()
        assert rel_error(y.cpu().numpy(), reference(x2, w, s, z)) <= TOL
    with pytest.raises(TypeError, match="x must be float16"):
        layer(t.zeros(4096, dtype=t.float32, device="cuda"))
    with pytest.raises(ValueError, match="x must be"):
        layer(t.zeros(4095, dtype=t.float16, device="cuda"))
    bad = zt.clone()
    bad[0, 0] = 200
    with pytest.raises(ValueError, match="zero points 0..15"):
        int4jit.GemvWeights(wt, st, bad)
    with pytest.raises(ValueError, match="zeros must be zero points 0..15"):  # gemv checks device zeros too
        int4jit.gemv(t.from_numpy(x).cuda(), wt, st, bad)
    perm = t.arange(4096, dtype=t.int32, device="cuda")
    perm[7] = 4096  # would fault the gather
    with pytest.raises(ValueError, match="perm must be a permutation of 0..4095"):
        int4jit.gemv(t.from_numpy(x).cuda(), wt, st, zt, perm=perm)
    with pytest.raises(ValueError, match="perm must be a permutation"):
        int4jit.GemvWeights(wt, st, zt, perm=perm)


def test_compile_only_warm_covers_tuning(monkeypatch, tmp_path):
    """`int4jit warm --compile-only` (plan.search_space) compiles every candidate the runtime search
    measures, variants included: tuning afterwards compiles nothing."""
    from int4jit import backends, compiler, plan
    from int4jit.shapes import GemvShape
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path))
    dev = backends.device()
    shape = GemvShape(5000, 3584, 128, False)  # not in table.json
    space = plan.search_space(shape, dev.arch)
    assert len(space) > 9  # variants beyond the (BS, TN) grid
    for spec in space:
        compiler.build(spec)
    compiler._memo.clear()
    mod = backends.module_for_arch(dev.arch)
    compiles = []
    real = mod.compile_source
    monkeypatch.setattr(mod, "compile_source", lambda *a, **k: compiles.append(a[1]) or real(*a, **k))
    p = plan.plan(shape, dev.arch, dev)
    assert p.tier == "tuned" and compiles == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("N,K,group,symmetric", [(4096, 4096, 128, False), (1000, 2064, 16, True), (3001, 896, 32, False)])
def test_dense_dequantisation_for_prefill(N, K, group, symmetric, dtype):
    """GemvWeights.dense (templates/dequant.hip) writes dequantize()'s matrix, rounded to the dtype."""
    t = _torch()
    rng = np.random.default_rng()
    (x, w, s, z), (xt, wt, st, zt), _ = device_problem(rng, N, K, group, symmetric)
    out = t.full((N, K), float("nan"), dtype=getattr(t, dtype), device="cuda")
    int4jit.GemvWeights(wt, st, zt).dense(out)
    want = t.from_numpy(int4jit.dequantize(w, s, z).astype(np.float32)).to(getattr(t, dtype))
    assert t.equal(out.cpu(), want)


def _hopper() -> bool:
    return _torch().cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("tokens", [17, 32, 33, 40, 48, 49, 200, 300, 700])
def test_int4linear_prefill_matches_reference(tokens, monkeypatch):
    """More tokens than one launch takes: on Hopper the int4 GEMM from GEMM_MIN_TOKENS (33) to
    GEMM_MAX_TOKENS (40 and 49 tokens: 64 tiles, fewer than the SMs, cut between them; 300 tokens:
    192 tiles); elsewhere the kernel once per 16 tokens (a partial last chunk included) up to
    chunked_tokens (48 for 16 MB of int4 weights), and above it (and past GEMM_MAX_TOKENS: 700
    tokens) one dequantising launch + cuBLAS. fp16 and bf16, with a bias, against the float64
    reference, and the path taken is the one documented; a second prompt of the shape (a new x)
    takes the path the first one took, until the module's gemm_max_tokens changes."""
    t = _torch()
    from int4jit.torch import GEMM_MAX_TOKENS, GEMM_MIN_TOKENS, Int4Linear
    lin = t.nn.Linear(4096, 8192).cuda().half()
    q = Int4Linear.from_linear(lin, group_size=128)
    assert q.chunked_tokens == 48
    W = int4jit.dequantize(q.w.cpu().numpy(), q.scales.cpu().numpy(), q.zeros.cpu().numpy()).astype(np.float64)
    bias = q.bias.double().cpu().numpy()
    layer = q._prepared()
    dense_calls, gemm_calls = [], []
    real_dense, real_matmul = layer.dense, layer.matmul
    monkeypatch.setattr(layer, "dense", lambda out: dense_calls.append(out.dtype) or real_dense(out))
    monkeypatch.setattr(layer, "matmul", lambda x, out: gemm_calls.append(x.dtype) or real_matmul(x, out))

    def check(dtype):
        xs = t.randn(1, tokens, 4096, device="cuda", dtype=dtype)
        y = q(xs)
        assert y.shape == (1, tokens, 8192) and y.dtype == dtype
        ref = xs[0].double().cpu().numpy() @ W.T + bias
        assert rel_error(y.float().cpu().numpy()[0], ref) <= (2e-3 if dtype == t.float16 else 5e-3)

    for dtype in (t.float16, t.bfloat16, t.float16, t.bfloat16):
        check(dtype)
    gemm = _hopper() and GEMM_MIN_TOKENS <= tokens <= GEMM_MAX_TOKENS
    assert len(gemm_calls) == (4 if gemm else 0)
    assert len(dense_calls) == (4 if tokens > 48 and not gemm else 0)
    q.gemm_max_tokens = 0
    check(t.float16)
    assert len(gemm_calls) == (4 if gemm else 0) and len(dense_calls) == (4 * (not gemm) + 1 if tokens > 48 else 0)


GEMM_CASES = [(128, 256, 128, False, 1), (384, 1024, 32, True, 77), (1024, 4096, 64, False, 300),
              (4096, 4096, 128, False, 512), (256, 14336, 128, True, 129), (128, 512, 128, False, 1000),
              (8192, 1024, 128, False, 640), (5120, 1024, 64, True, 400), (6144, 4096, 128, False, 512),
              (576, 2048, 64, True, 300), (12288, 1024, 128, False, 1000)]


@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("N,K,group,symmetric,T", GEMM_CASES)
def test_gemm_against_reference(N, K, group, symmetric, T, dtype, scale_dtype):
    """GemvWeights.matmul (templates/xperm.hip, then templates/gemm_sm90.hip) on Hopper: partial
    token tiles, one token, symmetric, g32/g64/g128, bf16 scales; on 132 SMs: fewer tiles than
    3/4 of the SMs, every tile cut between blocks (1 to 24 tiles: a tile's 2 to 112 steps over up
    to 132 blocks), one data-parallel wave (4096 x 512: 128 tiles), tiles cut in the last waves
    (8192 x 640: 320 tiles, a data-parallel wave, then 188 tiles split; 5120 x 400: 160 tiles,
    all split); tiles of 192 rows (N % 192 == 0: 6144 x 512 one wave of 128 tiles, 576 x 300 all
    cut, 12288 x 1000 two whole waves then 248 tiles cut); out poisoned before the call, against
    the float64 reference; a second call (into a fresh workspace) gives the same bits."""
    if not _hopper():
        pytest.skip("the int4 GEMM is Hopper's (sm_90)")
    t = _torch()
    rng = np.random.default_rng()
    x, w, s, z = random_problem(rng, N, K, group, symmetric)
    st = t.from_numpy(s).cuda().to(getattr(t, scale_dtype))
    layer = int4jit.GemvWeights(t.from_numpy(w).cuda(), st, None if z is None else t.from_numpy(z).cuda())
    xs = t.randn(T, K, device="cuda", dtype=getattr(t, dtype))
    out = t.full((T, N), float("nan"), dtype=getattr(t, dtype), device="cuda")
    assert layer.matmul(xs, out) is out
    t.cuda.synchronize()
    ref = reference(xs.float().cpu().numpy(), w, st.float().cpu().numpy(), z)
    assert rel_error(out.float().cpu().numpy(), ref) <= (TOL if dtype == "float16" else 5e-3)
    again = t.full_like(out, float("nan"))
    assert t.equal(layer.matmul(xs, again), out)


def test_gemm_chain_reads_each_output_after_it_is_written():
    """Three prefill GEMMs in a row, each laying out the one before's output as its x: the next
    layout kernel must see the whole output (stream order; what an overlapping launch such as
    PDL must keep). Eagerly and replayed from a CUDA graph with new inputs, outputs
    poisoned before each run; every stage against the float64 reference of its own input (weights
    scaled so each output is of unit size)."""
    if not _hopper():
        pytest.skip("the int4 GEMM is Hopper's (sm_90)")
    t = _torch()
    rng = np.random.default_rng()
    N = K = 2048
    T = 200
    raw, layers = [], []
    for _ in range(3):
        w = t.from_numpy(rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)).cuda()
        s = t.from_numpy((rng.random((N, K // 128)) + 0.5) / (6.5 * K ** 0.5)).half().cuda()
        z = t.from_numpy(rng.integers(0, 16, size=(N, K // 128), dtype=np.uint8)).cuda()
        raw.append((w, s, z))
        layers.append(int4jit.GemvWeights(w, s, z))

    def chain(x):
        outs = []
        for layer in layers:
            x = layer.matmul(x, t.full((T, N), float("nan"), dtype=t.float16, device="cuda"))
            outs.append(x)
        return outs

    def check(x, outs):
        for (w, s, z), inp, out in zip(raw, [x] + outs[:-1], outs):
            ref = reference(inp.float(), w, s.float(), z)
            assert 0.3 < ref.std() < 3
            assert rel_error(out.float().cpu().numpy(), ref) <= TOL

    x = t.randn(T, K, dtype=t.float16, device="cuda")
    outs = chain(x)
    t.cuda.synchronize()
    check(x, outs)
    graph = t.cuda.CUDAGraph()
    with t.cuda.graph(graph):
        outs = chain(x)
    for _ in range(2):
        x.copy_(t.randn_like(x))
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        t.cuda.synchronize()
        check(x, outs)


def test_gemm_refuses_what_it_cannot_serve():
    """N a multiple of neither 128 nor 192, or groups of 16: NotImplementedError naming the limits
    (Int4Linear then dequantises)."""
    if not _hopper():
        pytest.skip("the int4 GEMM is Hopper's (sm_90)")
    t = _torch()
    rng = np.random.default_rng()
    for N, K, group in ((200, 512, 128), (256, 512, 16)):
        x, w, s, z = random_problem(rng, N, K, group, False)
        layer = int4jit.GemvWeights(*(t.from_numpy(a).cuda() for a in (w, s, z)))
        with pytest.raises(NotImplementedError, match="K % 128 == 0, group % 32 == 0 and N a multiple of 128 or 192"):
            layer.matmul(t.zeros(300, K, dtype=t.float16, device="cuda"), t.empty(300, N, dtype=t.float16, device="cuda"))


@pytest.mark.parametrize("N,K,group,symmetric", [(4096, 4096, 128, False), (3001, 2048, 32, True), (896, 14336, 128, False)])
def test_act_order_perm_against_reference(N, K, group, symmetric):
    """gemv(perm=) on torch tensors: y = W_canonical @ x[perm], against the float64 reference;
    Int4Linear.from_weights does the same in the one-token and several-token paths."""
    t = _torch()
    from int4jit.torch import Int4Linear
    rng = np.random.default_rng()
    (x, w, s, z), (xt, wt, st, zt), out = device_problem(rng, N, K, group, symmetric)
    perm = rng.permutation(K).astype(np.int32)
    int4jit.gemv(xt, wt, st, zt, perm=t.from_numpy(perm).cuda(), out=out)
    t.cuda.synchronize()
    ref = reference(x, w, s, z, perm=perm)
    assert rel_error(out.cpu().numpy(), ref) <= TOL
    layer = Int4Linear.from_weights(int4jit.Int4Weights(wt, st, zt, perm=t.from_numpy(perm).cuda()))
    assert rel_error(layer(xt).float().cpu().numpy(), ref) <= TOL
    xs = rng.standard_normal((5, K)).astype(np.float16)
    ys = layer(t.from_numpy(xs).cuda()).float().cpu().numpy()
    assert rel_error(ys, reference(xs, w, s, z, perm=perm)) <= TOL


SIMT_BF16_CASES = [(N, K, g, sym) for (N, K) in ((1, 48), (7, 896), (896, 4864), (1000, 2080), (2500, 4096))
                   for g in (16, 32, 128) for sym in (True, False) if K % g == 0]


@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("N,K,group,symmetric", SIMT_BF16_CASES)
def test_simt_kernel_bf16_against_reference(N, K, group, symmetric, scale_dtype, monkeypatch):
    """One bf16 token on the simt kernel (the few-row shapes' kernel, and AMD's): 8- and 16-byte
    loads, fp16 and bf16 scales, against the float64 reference; output poisoned first."""
    monkeypatch.setenv("INT4JIT_KERNEL", "simt")
    t = _torch()
    rng = np.random.default_rng()
    _, w, s, z = random_problem(rng, N, K, group, symmetric)
    st = t.from_numpy(s).cuda().to(getattr(t, scale_dtype))
    x = t.randn(K, device="cuda", dtype=t.bfloat16)
    out = t.full((N,), float("nan"), dtype=t.bfloat16, device="cuda")
    int4jit.gemv(x, t.from_numpy(w).cuda(), st, None if z is None else t.from_numpy(z).cuda(), out=out)
    t.cuda.synchronize()
    xf, sf = x.float().cpu().numpy(), st.float().cpu().numpy()
    ref = reference(xf, w, sf, z)
    assert rel_error(out.float().cpu().numpy(), ref, few_outputs_floor(xf, w, sf, z)) <= 5e-3


@pytest.mark.parametrize("cfg", candidate_grid(exhaustive=True), ids=str)
@pytest.mark.parametrize("K,group", [(2080, 16), (4096, 128)])  # 8-byte loads; 16-byte loads
def test_simt_kernel_bf16_every_grid_point(cfg, K, group, monkeypatch):
    monkeypatch.setenv("INT4JIT_KERNEL", "simt")
    t = _torch()
    rng = np.random.default_rng()
    _, w, s, z = random_problem(rng, 1001, K, group, symmetric=False)
    x = t.randn(K, device="cuda", dtype=t.bfloat16)
    y = int4jit.gemv(x, *(t.from_numpy(a).cuda() for a in (w, s, z)), config=(cfg.BS, cfg.TN))
    t.cuda.synchronize()
    ref = reference(x.float().cpu().numpy(), w, s, z)
    assert y.dtype == t.bfloat16 and rel_error(y.float().cpu().numpy(), ref) <= 5e-3


TOKEN_CASES = [(M, N, K, g, sym) for M in (2, 5, 8, 9, 16) for (N, K, g, sym) in
               [(4096, 4096, 128, False), (3001, 2080, 16, True), (1000, 4096, 32, False), (7, 896, 64, True)]]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("M,N,K,group,symmetric", TOKEN_CASES)
def test_several_tokens_and_bf16_against_reference(M, N, K, group, symmetric, dtype, monkeypatch):
    """x [M, K] (M = 2..16) in one launch (tc_batch), fp16 and bf16, against the float64 reference."""
    monkeypatch.setenv("INT4JIT_TUNE", "0")
    t = _torch()
    rng = np.random.default_rng()
    _, w, s, z = random_problem(rng, N, K, group, symmetric)
    xs = t.randn(M, K, device="cuda", dtype=getattr(t, dtype))
    args = [None if a is None else t.from_numpy(a).cuda() for a in (w, s, z)]
    out = t.full((M, N), float("nan"), dtype=getattr(t, dtype), device="cuda")
    int4jit.gemv(xs, *args, out=out)
    t.cuda.synchronize()
    ref = reference(xs.float().cpu().numpy(), w, s, z)
    assert rel_error(out.float().cpu().numpy(), ref) <= (TOL if dtype == "float16" else 5e-3)


@pytest.mark.parametrize("M,dtype,group", [(1, "bfloat16", 32), (8, "float16", 32), (16, "bfloat16", 32),
                                           (8, "bfloat16", 128), (3, "float16", 128)])
@pytest.mark.parametrize("cfg", candidate_grid(exhaustive=True), ids=str)
def test_tokens_and_bf16_every_grid_point(cfg, M, dtype, group):
    """tc (one bf16 token; up to 8 tokens at g >= 128) and tc_batch (the rest) at every (BS, TN)."""
    t = _torch()
    rng = np.random.default_rng()
    _, w, s, z = random_problem(rng, 2051, 4224, group, False)
    xs = t.randn(M, 4224, device="cuda", dtype=getattr(t, dtype))
    args = [t.from_numpy(a).cuda() for a in (w, s, z)]
    y = int4jit.gemv(xs, *args, config=(cfg.BS, cfg.TN))
    t.cuda.synchronize()
    ref = reference(xs.float().cpu().numpy(), w, s, z)
    assert rel_error(y.float().cpu().numpy(), ref) <= (TOL if dtype == "float16" else 5e-3)


def test_bf16_scales_and_int4linear_tokens():
    """bf16 scales; Int4Linear with 1..16 tokens in fp16 and bf16 runs on the kernels (no fallback)."""
    t = _torch()
    from int4jit.torch import Int4Linear
    rng = np.random.default_rng()
    _, w, s, z = random_problem(rng, 2048, 4096, 128, False)
    sb = t.from_numpy(s).cuda().to(t.bfloat16)
    xs = t.randn(4, 4096, device="cuda", dtype=t.bfloat16)
    y = int4jit.gemv(xs, t.from_numpy(w).cuda(), sb, t.from_numpy(z).cuda())
    ref = reference(xs.float().cpu().numpy(), w, sb.float().cpu().numpy(), z)
    assert rel_error(y.float().cpu().numpy(), ref) <= 5e-3
    layer = Int4Linear(t.from_numpy(w).cuda(), t.from_numpy(s).cuda(), t.from_numpy(z).cuda())
    for M in (1, 3, 16):
        for dtype in (t.float16, t.bfloat16):
            x = t.randn(1, M, 4096, device="cuda", dtype=dtype)
            y = layer(x)
            assert y.shape == (1, M, 2048) and y.dtype == dtype
            ref = reference(x[0].float().cpu().numpy(), w, s, z)
            assert rel_error(y[0].float().cpu().numpy(), ref) <= (TOL if dtype == t.float16 else 5e-3)
    assert not layer._warned and not layer._no_kernel


@pytest.mark.parametrize("cfg", ["128,4,loads=8", "256,2,loads=8", "512,2,loads=8"])
@pytest.mark.parametrize("M,dtype,group", [(8, "float16", 128), (16, "bfloat16", 32), (3, "float16", 16)])
def test_tc_batch_loads_variant(cfg, M, dtype, group):
    t = _torch()
    rng = np.random.default_rng()
    K = 4224 if group == 128 else 4160  # a partial last step where the group allows one
    _, w, s, z = random_problem(rng, 3001, K, group, False)
    xs = t.randn(M, K, device="cuda", dtype=getattr(t, dtype))
    y = int4jit.gemv(xs, *[t.from_numpy(a).cuda() for a in (w, s, z)], config=cfg)
    t.cuda.synchronize()
    ref = reference(xs.float().cpu().numpy(), w, s, z)
    assert rel_error(y.float().cpu().numpy(), ref) <= (TOL if dtype == "float16" else 5e-3)
