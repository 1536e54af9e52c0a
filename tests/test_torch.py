"""int4jit.torch on the CPU (the fallback path) and on the GPU (gemv, graph capture)."""
import numpy as np
import pytest

import os  # noqa: E402

if os.environ.get("CI"):
    import torch  # CI installs it (scripts/test.sh): a skip there would hide that nothing ran
else:
    torch = pytest.importorskip("torch")
import int4jit  # noqa: E402
from int4jit.torch import Int4Linear, quantize_model  # noqa: E402

from conftest import rel_error  # noqa: E402


def test_from_linear_matches_the_reference_on_cpu():
    lin = torch.nn.Linear(256, 96, bias=True)
    q = Int4Linear.from_linear(lin, group_size=64)
    x = torch.randn(3, 5, 256)
    y = q(x)
    assert y.shape == (3, 5, 96)
    w, s, z = q.w.numpy(), q.scales.numpy(), q.zeros.numpy()
    ref = np.stack([int4jit.reference_gemv(v, w, s, z) for v in x.reshape(-1, 256).numpy()]) + lin.bias.detach().half().float().numpy()
    assert rel_error(y.detach().numpy(), ref) < 1e-5


def test_quantize_model_swaps_and_skips(caplog):
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8)))
    quantize_model(model, group_size=32, skip=["2.1"])
    assert isinstance(model[0], Int4Linear) and isinstance(model[2][0], Int4Linear)
    assert type(model[2][1]) is torch.nn.Linear  # skipped by name: on purpose, not warned
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    model2 = torch.nn.Sequential(torch.nn.Linear(48, 8), torch.nn.Linear(8, 64), torch.nn.Linear(64, 8))
    quantize_model(model2, group_size=32)
    assert type(model2[0]) is torch.nn.Linear and type(model2[1]) is torch.nn.Linear  # 48, 8: not multiples of 32
    assert isinstance(model2[2], Int4Linear)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "keeps 2 of 3 nn.Linear layers" in warned[0] and "0 (48), 1 (8)" in warned[0]


def test_wrong_width_is_an_error():
    q = Int4Linear.from_linear(torch.nn.Linear(128, 16), group_size=32)
    with pytest.raises(ValueError, match=r"\[\.\.\., 128\]"):
        q(torch.randn(1, 64))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool, torch.complex64])
def test_a_non_float_input_is_an_error_as_in_nn_linear(dtype):
    # dequantised to an integer dtype, the weight would truncate to zeros and y come out all 0
    q = Int4Linear.from_linear(torch.nn.Linear(128, 16), group_size=32)
    with pytest.raises(TypeError, match=f"float16 or bfloat16.*got {dtype}"):
        q(torch.ones(2, 128, dtype=dtype))
    with pytest.raises(TypeError, match=f"int4jit::gemv takes float16 or bfloat16.*got {dtype}"):
        torch.ops.int4jit.gemv(torch.ones(2, 128, dtype=dtype), q.w, q.scales, q.zeros)  # the op called directly
    x = torch.randn(2, 128, dtype=torch.float64)  # float32 and float64 dequantise + matmul
    W = int4jit.dequantize(q.w.numpy(), q.scales.numpy(), q.zeros.numpy()).astype(np.float64)
    assert rel_error(q(x).detach().numpy(), x.numpy() @ W.T + q.bias.detach().double().numpy()) < 1e-6


@pytest.mark.gpu
def test_int4linear_gpu_eager_and_graph_capture():
    lin = torch.nn.Linear(4096, 2048, bias=True).cuda()
    q = Int4Linear.from_linear(lin, group_size=128)
    x = torch.randn(1, 1, 4096, device="cuda", dtype=torch.float16)
    w, s, z = (t.cpu().numpy() for t in (q.w, q.scales, q.zeros))
    ref = lambda xx: int4jit.reference_gemv(xx.reshape(-1).cpu().numpy(), w, s, z) + q.bias.float().cpu().numpy()
    y = q(x)
    torch.cuda.synchronize()
    assert y.shape == (1, 1, 2048) and y.dtype == torch.float16
    assert rel_error(y.float().cpu().numpy(), ref(x)) < 2e-3
    static_x = x.clone()
    q(static_x)  # warm: select and compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = q(static_x)
    x2 = torch.randn_like(x)
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert rel_error(static_y.float().cpu().numpy(), ref(x2)) < 2e-3
    # several tokens fall back to dequantise + matmul and still agree
    xs = torch.randn(4, 4096, device="cuda", dtype=torch.float16)
    ys = q(xs).float().cpu().numpy()
    refs = np.stack([ref(v) for v in xs])
    assert rel_error(ys, refs) < 2e-3


@pytest.mark.gpu
def test_gemv_on_converted_weights(tmp_path):
    """MatMulNBits -> canonical -> gemv on the GPU, against the reference."""
    rng = np.random.default_rng()
    K, N, block = 1000, 512, 64  # ragged last block
    kb = -(-K // block)
    B = rng.integers(0, 256, (N, kb, block // 2), dtype=np.uint8)
    scales = (rng.random((N, kb)) * 0.05 + 0.001).astype(np.float32)
    zp = rng.integers(0, 256, (N, (kb + 1) // 2), dtype=np.uint8)
    w, s, z = int4jit.from_matmulnbits(B, scales, zp, K=K, N=N, block_size=block)
    x = np.zeros(2 * w.shape[1], np.float16)
    x[:K] = rng.standard_normal(K)
    y = int4jit.gemv(x, w, s, z)
    assert rel_error(y, int4jit.reference_gemv(x, w, s, z)) < 2e-3


def test_cpu_fallback_warns_once_and_keeps_the_dense_weight(caplog):
    """On the CPU, Int4Linear dequantises once per module (kept), warns once naming why, and is right."""
    import logging
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 64, bias=True)
    q = Int4Linear.from_linear(lin, group_size=32)
    W = torch.from_numpy(int4jit.dequantize(q.w.numpy(), q.scales.numpy(), q.zeros.numpy())).float()
    x = torch.randn(3, 256)
    with caplog.at_level(logging.WARNING, logger="int4jit"):
        y1 = q(x)
        y2 = q(torch.randn(1, 256))
    assert len([r for r in caplog.records if "Int4Linear 64x256" in r.getMessage()]) == 1
    assert "the CPU" in caplog.records[0].getMessage()
    assert q._dense is not None and q._dense.shape == (64, 256)
    ref = x.double() @ W.double().t() + lin.bias.detach().to(torch.float16).double()
    assert torch.allclose(y1.double(), ref, rtol=1e-4, atol=1e-4)
    assert y2.shape == (1, 64)


def test_the_cpus_dense_weight_follows_weights_loaded_in_place():
    torch.manual_seed(0)
    q = Int4Linear.from_linear(torch.nn.Linear(128, 32), group_size=32)
    other = Int4Linear.from_linear(torch.nn.Linear(128, 32), group_size=32)
    x = torch.randn(2, 128)
    torch.testing.assert_close(q(x), q(x))  # the dense weight is kept now
    q.load_state_dict(other.state_dict())  # copied into q's own tensors
    torch.testing.assert_close(q(x), other(x))


@pytest.mark.parametrize("N,K,tokens", [(1024, 4096, 32), (4096, 4096, 32), (8192, 4096, 48), (14336, 4096, 48),
                                         (4096, 14336, 48), (16384, 8192, 64), (128256, 4096, 64)])
def test_chunked_tokens_follow_the_weights_size(N, K, tokens):
    """How many tokens Int4Linear serves as launches of 16 before dequantising: 2 launches under
    16 MB of int4 weights, 3 under 64 MB, 4 from 64 MB (the measured break-even)."""
    from int4jit.torch import chunked_tokens
    assert chunked_tokens(N, K) == tokens


@pytest.mark.parametrize("N,K,gemm", [(1024, 4096, 0), (2048, 4096, 0), (3072, 3072, 0), (2048, 6144, 512),
                                       (4096, 4096, 512), (2048, 8192, 512), (6144, 4096, 512)])
def test_the_gemm_serves_layers_of_6_mb_and_more(N, K, gemm):
    """Int4Linear runs prompts through the int4 GEMM (Hopper) only from GEMM_MIN_BYTES (6 MB) of
    int4 weights: below it one dequantising launch + cuBLAS measured faster at 33 to 512 tokens."""
    from int4jit.torch import gemm_max_tokens
    assert gemm_max_tokens(N, K) == gemm
    assert Int4Linear(torch.zeros(N, K // 2, dtype=torch.uint8), torch.ones(N, K // 128, dtype=torch.float16),
                      torch.zeros(N, K // 128, dtype=torch.uint8)).gemm_max_tokens == gemm


def test_a_module_pickled_without_chunked_tokens_gets_them():
    import pickle
    from int4jit.torch import GEMM_MAX_TOKENS
    q = Int4Linear.from_linear(torch.nn.Linear(4096, 1024), group_size=128)
    old = pickle.loads(pickle.dumps(q))
    assert old.chunked_tokens == 32
    state = q.__getstate__()
    del state["chunked_tokens"], state["gemm_max_tokens"]  # as an Int4Linear pickled before they existed
    restored = Int4Linear.__new__(Int4Linear)
    restored.__setstate__(state)
    assert restored.chunked_tokens == 32 and restored.gemm_max_tokens == 0  # 2 MB: under GEMM_MIN_BYTES
    x = torch.randn(3, 4096)
    assert torch.equal(restored(x), q(x))
    state = Int4Linear.from_linear(torch.nn.Linear(4096, 4096), group_size=128).__getstate__()
    del state["gemm_max_tokens"]
    big = Int4Linear.__new__(Int4Linear)
    big.__setstate__(state)
    assert big.gemm_max_tokens == GEMM_MAX_TOKENS == 512


def test_a_module_keeps_the_paths_of_its_latest_prompt_shapes_and_pickles_without_them():
    """Int4Linear keeps the path each GPU prefill shape took (closures: not picklable) for at most
    PROMPT_SHAPES shapes, dropping the oldest; a copy or pickle starts with none."""
    import pickle
    from int4jit.torch import PROMPT_SHAPES
    q = Int4Linear.from_linear(torch.nn.Linear(256, 64), group_size=64)
    for n in range(1, PROMPT_SHAPES + 7):
        q._remember(torch.empty(n, 256), lambda x, n=n: n)
    kept = sorted(key[0][0][0] for key in q._prompts)
    assert kept == list(range(7, PROMPT_SHAPES + 7))
    assert q._prompts[(torch.Size([PROMPT_SHAPES + 6, 256]), torch.float32), q.chunked_tokens,
                      q.gemm_max_tokens](None) == PROMPT_SHAPES + 6
    assert pickle.loads(pickle.dumps(q))._prompts == {} and len(q._prompts) == PROMPT_SHAPES


def test_custom_op_is_registered_with_a_fake_implementation():
    """torch.compile traces torch.ops.int4jit.gemv through its fake implementation: the output
    shape [..., N] and dtype of x, on x's device, without running anything."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    assert hasattr(torch.ops.int4jit, "gemv")
    with FakeTensorMode():
        x = torch.empty(1, 1, 4096, dtype=torch.float16)
        w = torch.empty(512, 2048, dtype=torch.uint8)
        s = torch.empty(512, 32, dtype=torch.float16)
        y = torch.ops.int4jit.gemv(x, w, s, None)
        assert y.shape == (1, 1, 512) and y.dtype == torch.float16


class _PathLayer:
    """A GemvWeights stand-in on 'device -1' (where CPU tensors report themselves) for the op's GPU
    kernel: each path writes its own value into y, so the output says which ran."""
    device_index = -1

    def __init__(self, N, K, gemm=True, chunks=True, gemv=True):
        self.N, self.K, self.gemm, self.chunks, self.gemv, self.ran = N, K, gemm, chunks, gemv, []

    def __call__(self, x):
        self.ran.append("gemv")
        if not self.gemv:
            raise NotImplementedError("bfloat16 needs the tensor-core kernels")
        return torch.full((*x.shape[:-1], self.N), 1.0, dtype=x.dtype)

    def gemm_unsupported(self, dtype):
        return None if self.gemm else "not Hopper"

    def matmul(self, x, out):
        self.ran.append("gemm")
        return out.fill_(2.0)

    def launch_chunks(self, x, out):
        self.ran.append("chunks")
        if not self.chunks:
            raise NotImplementedError("no several-token kernel here")
        return out.fill_(3.0)

    def dense(self, out):
        self.ran.append("dense")
        return out.fill_(1.0 / self.K)  # y = the sum of x / K


@pytest.mark.parametrize("gemm", [True, False])
def test_op_on_the_gpu_takes_the_eager_path_for_every_token_count(monkeypatch, caplog, gemm):
    """torch.ops.int4jit.gemv's GPU kernel serves any number of tokens (a compiled model calls it
    for prompts too): 1..16 the GEMV kernel; on Hopper 33..512 the int4 GEMM (layers of 6 MB of
    int4 weights or more); up to chunked_tokens the kernel once per 16; more, or where the
    several-token kernel is missing (warned once), one dequantising launch + cuBLAS; float32 the
    weight in float16. x's first 16 tokens get the launch checks."""
    from int4jit import torch as i4t
    checked = []
    monkeypatch.setattr(i4t, "validate_x", lambda x, K, device: checked.append(tuple(x.shape)))
    big = _PathLayer(4096, 4096, gemm=gemm)  # 8 MB of int4 weights: chunks to 32 tokens, the GEMM to 512
    assert (i4t.chunked_tokens(4096, 4096), i4t.gemm_max_tokens(4096, 4096)) == (32, 512)
    for tokens, path in ((1, "gemv"), (16, "gemv"), (17, "chunks"), (32, "chunks"), (33, "gemm" if gemm else "dense"),
                         (512, "gemm" if gemm else "dense")):
        x = torch.randn(1, tokens, 4096, dtype=torch.bfloat16)
        y = i4t._on_the_gpu(big, x)
        assert big.ran[-1] == path and y.shape == (1, tokens, 4096) and y.dtype == torch.bfloat16
        want = {"gemv": 1.0, "chunks": 3.0, "gemm": 2.0}.get(path)
        if want is not None:
            assert torch.all(y == want)
    assert checked == [(16, 4096)] * 4
    small = _PathLayer(64, 256, chunks=False)  # 8 KB: never the GEMM
    x = torch.randn(600, 256, dtype=torch.float16)
    assert torch.allclose(i4t._on_the_gpu(small, x).float(), x.float().sum(-1, keepdim=True).expand(600, 64) / 256,
                          rtol=1e-2, atol=1e-2) and small.ran == ["dense"]
    for _ in range(2):
        i4t._on_the_gpu(small, torch.randn(20, 256, dtype=torch.float16))
    assert small.ran == ["dense", "chunks", "dense", "dense"]  # the missing kernel is tried once
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "64x256 dequantises for 17 to 32 tokens: no several-token kernel" in warned[0]
    y = i4t._on_the_gpu(small, torch.randn(3, 256, dtype=torch.float64))
    assert y.dtype == torch.float64 and small.ran[-1] == "dense"
    small.ran.clear()
    i4t._on_the_gpu(small, torch.randn(3, 255, dtype=torch.float16))  # malformed: GemvWeights' checks
    assert small.ran == ["gemv"]
    big.ran.clear()  # limits given (a module's own, passed by Int4Linear under torch.compile)
    i4t._on_the_gpu(big, torch.randn(20, 4096, dtype=torch.float16), 16, 0)
    i4t._on_the_gpu(big, torch.randn(40, 4096, dtype=torch.float16), 48, 0)
    i4t._on_the_gpu(big, torch.randn(40, 4096, dtype=torch.float16), 48, -1)
    assert big.ran == ["dense", "chunks", "gemm" if gemm else "chunks"]


@pytest.mark.parametrize("gemm", [True, False])
def test_eager_gpu_call_takes_the_ops_paths_at_the_modules_limits(monkeypatch, caplog, gemm):
    """Int4Linear's eager GPU call chooses as the op does (_gpu_path), at the module's own
    chunked_tokens and gemm_max_tokens; a prompt's path is kept for its shape (the GEMM's and the
    dequantising one's); a kernel missing for a token count is said once, that count dequantises
    from then on, and the result is right (a stand-in layer on 'device -1' says which path ran)."""
    import logging
    from int4jit import torch as i4t
    monkeypatch.setattr(i4t, "validate_x", lambda x, K, device: None)
    q = Int4Linear(torch.zeros(4096, 2048, dtype=torch.uint8), torch.ones(4096, 32, dtype=torch.float16),
                   torch.zeros(4096, 32, dtype=torch.uint8), bias=torch.full((4096,), 0.5))
    layer = _PathLayer(4096, 4096, gemm=gemm, chunks=False, gemv=False)
    monkeypatch.setattr(q, "_prepared", lambda: layer)
    for tokens, path in ((17, "chunks"), (32, "chunks"), (33, "gemm" if gemm else "dense"), (300, "gemm" if gemm else "dense")):
        x = torch.randn(1, tokens, 4096, dtype=torch.float16)
        assert q.path(x) == "cpu"  # a CPU x is the CPU's
        assert i4t._gpu_path(layer, x.dtype, tokens, q.chunked_tokens, q.gemm_max_tokens) == path
        layer.ran.clear()
        with caplog.at_level(logging.WARNING, logger="int4jit"):
            y = q._on_the_gpu(x)
        assert y.shape == (1, tokens, 4096) and y.dtype == torch.float16
        if path == "chunks":  # the kernel is missing: tried once, then dequantised
            assert layer.ran == ["chunks", "dense"] and (torch.float16, tokens) in q._no_kernel
        else:
            assert layer.ran == [path]
        if path == "gemm":
            assert torch.all(y == 2.5)  # the stand-in GEMM's 2, plus the bias
        else:  # dequantised: the sum of x / K, plus the bias
            torch.testing.assert_close(y.float(), x.float().sum(-1, keepdim=True).expand_as(y) / 4096 + 0.5,
                                       rtol=1e-2, atol=1e-2)
    kept = sorted(key[0][0][1] for key in q._prompts)
    assert kept == [17, 32, 33, 300]  # the GEMM's or the dequantising path (here for the missing chunks' too)
    warned = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(warned) == 2 and all("4096x4096 falls back to dequantise + matmul: no several-token kernel" in w
                                    for w in warned)
    layer.ran.clear()
    q._on_the_gpu(torch.randn(17, 4096, dtype=torch.float16))  # 17 tokens again: not tried again
    assert layer.ran == ["dense"]
    q.gemm_max_tokens, q.chunked_tokens = 0, 16  # the module's own limits
    assert i4t._gpu_path(layer, torch.float16, 40, q.chunked_tokens, q.gemm_max_tokens) == "dense"
    layer.ran.clear()
    y = q._on_the_gpu(torch.randn(3, 4096, dtype=torch.bfloat16))  # one launch's tokens, its kernel missing
    assert layer.ran == ["gemv", "dense"] and (torch.bfloat16, 3) in q._no_kernel and y.dtype == torch.bfloat16
    # the prefills above were traced, not warned: the first float32 call is still warned, once
    assert not [r for r in caplog.records if "runs dequantise" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="int4jit"):
        for _ in range(2):
            assert q._on_the_gpu(torch.randn(2, 4096, dtype=torch.float32)).dtype == torch.float32
    warned = [r.getMessage() for r in caplog.records if "runs dequantise" in r.getMessage()]
    assert len(warned) == 1 and "for torch.float32 activations (2 tokens" in warned[0]
    layer.ran.clear()
    y = q._on_the_gpu(torch.randn(3, 4096, dtype=torch.float32))  # float32: the weight in float16
    assert layer.ran == ["dense"] and y.dtype == torch.float32
    assert i4t._gpu_path(layer, torch.float64, 1, 32, 512) == "float"
    assert i4t._gpu_path(layer, torch.float16, 0, 32, 512) == "dense"  # an empty x


def test_compiled_int4linear_is_one_graph_for_any_number_of_tokens():
    """Under torch.compile every call is one int4jit::gemv node (the op picks the path when it
    runs): fullgraph compiles at 1, 20 and 600 tokens, in float32 and bfloat16, and gives the
    eager result (CPU)."""
    lin = torch.nn.Linear(256, 64)
    q = Int4Linear.from_linear(lin, group_size=64)
    compiled = torch.compile(q, fullgraph=True, backend="eager", dynamic=False)  # a graph break would raise
    for tokens in (1, 20, 600):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(2, tokens, 256).to(dtype)
            torch.testing.assert_close(compiled(x), q(x), rtol=1e-2, atol=1e-2)
    graphs = []  # the module's own limits are the node's arguments
    q.chunked_tokens, q.gemm_max_tokens = 16, 0
    torch.compile(q, fullgraph=True, backend=lambda gm, inputs: graphs.append(gm) or gm.forward,
                  dynamic=False)(torch.randn(20, 256))
    nodes = [n for n in graphs[0].graph.nodes if n.target in (torch.ops.int4jit.gemv, torch.ops.int4jit.gemv.default)]
    assert len(nodes) == 1 and tuple(nodes[0].args[4:]) == (16, 0)


def test_act_order_layer_permutes_x_on_the_cpu():
    """Int4Linear.from_weights keeps an act-order permutation: y = W_canonical @ x[perm] (+ bias)."""
    rng = np.random.default_rng(1)
    N, K, G = 32, 256, 32
    q = rng.integers(0, 16, (N, K), dtype=np.uint8)
    w = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    s = (rng.random((N, K // G)) * 0.05 + 0.01).astype(np.float16)
    z = rng.integers(0, 16, (N, K // G), dtype=np.uint8)
    perm = rng.permutation(K).astype(np.int32)
    bias = rng.standard_normal(N).astype(np.float16)
    layer = Int4Linear.from_weights(int4jit.Int4Weights(w, s, z, perm=perm, bias=bias))
    x = rng.standard_normal((2, K)).astype(np.float32)
    y = layer(torch.from_numpy(x)).double().numpy()
    W = int4jit.dequantize(w, s, z).astype(np.float64)
    ref = x[:, perm].astype(np.float64) @ W.T + bias.astype(np.float64)
    assert np.allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert "act_order=True" in repr(layer)
    bad = perm.copy()
    bad[0] = K  # an index past K would fault the gather on a GPU
    with pytest.raises(ValueError, match=f"perm must be a permutation of 0..{K - 1}; got values 0..{K}"):
        Int4Linear(w, s, z, perm=bad)
    with pytest.raises(ValueError, match=f"perm must be of shape \\({K},\\)"):
        Int4Linear(w, s, z, perm=perm[:-1])


def _stubbed_layer(mod, is_capturing=lambda stream: False):
    """A GemvWeights for mod's weights on a stubbed GPU ('device -1', where a CPU tensor reports
    itself; stream 0x50; weight pointers 1, 2, 3), launching through api.kernel_for."""
    import threading
    from int4jit.backends._args import PackedArgs
    from int4jit.shapes import GemvShape
    device = type("D", (), {"is_capturing": staticmethod(is_capturing)})()
    layer = object.__new__(int4jit.GemvWeights)
    N, K = mod.out_features, mod.in_features
    layer.__dict__.update(_torch=torch, shape=GemvShape(N, K, mod.group_size, mod.zeros is None), w=mod.w,
                          scales=mod.scales, zeros=mod.zeros, perm=None, device_index=-1, device=device, N=N, K=K,
                          _stream_of=lambda i: 0x50, _args=PackedArgs([0, 1, 2, 3, 0]), calls={}, _dense_launch={},
                          _chunk_launches={}, _gemm_launches={}, _gemm_why={},
                          _gemm_args=PackedArgs([0, 1, 2, 3, 0, 0]), _lock=threading.Lock(),
                          _one=int4jit.api.weight_ones(torch, mod.w))
    layer._values = layer._args.values
    return layer


def test_matmul_lays_out_x_then_runs_the_gemm(monkeypatch):
    """GemvWeights.matmul (Int4Linear's prefill on Hopper): the x layout kernel writes a workspace
    of whole 128-token tiles, then the GEMM reads it with the layer's weights and writes out; both
    get the token count; the kernels are loaded once per dtype. The workspace is x' then, per SM,
    a 96 KB slot of partial sums (the largest block's D: 384 threads x 64 fp32) and a 4-byte
    flag. The GEMM launches with PDL (INT4JIT_PDL=0: plainly), the layout kernel plainly.
    Elsewhere: NotImplementedError naming why. The GPU is stubbed."""
    from int4jit import api
    mod = Int4Linear.from_linear(torch.nn.Linear(512, 256), group_size=128)
    layer = _stubbed_layer(mod)
    layer.device.arch, layer.device.sm_count, layer.device.supports_overlap = "sm_90", 132, True
    launches, loaded = [], []

    def fake_load(dev, spec):
        loaded.append((spec.kernel, spec.pdl))
        run = lambda args, stream: launches.append((spec.kernel, list(args.values), stream))
        return type("K", (), {"launch_packed": staticmethod(run)})()

    monkeypatch.setattr(api, "load", fake_load)
    x, out = torch.randn(300, 512).half(), torch.empty(300, 256).half()
    workspaces = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: workspaces.append(a[0]) or real_empty(*a, **k))
    for _ in range(2):
        launches.clear()
        assert layer.matmul(x, out) is out
        (k1, a1, s1), (k2, a2, s2) = launches
        assert (k1, k2, s1, s2) == ("xperm", "gemm", 0x50, 0x50)
        assert a1[0] == x.data_ptr() and a1[5] == a2[5] == 300 and a2[0] == a1[4]
        assert a2[1:4] == [1, 2, 3] and a2[4] == out.data_ptr()
    assert loaded == [("xperm", False), ("gemm", True)]
    assert workspaces[0] == (384 * 512 * 2 + 132 * (384 * 64 * 4 + 4)) // 2
    monkeypatch.setenv("INT4JIT_PDL", "0")
    layer._gemm_launches.clear()
    layer.matmul(x.bfloat16(), out.bfloat16())
    assert loaded[2:] == [("xperm", False), ("gemm", False)]
    layer.device.arch = "sm_80"
    layer._gemm_launches.clear()
    layer._gemm_why.clear()
    with pytest.raises(NotImplementedError, match="needs Hopper"):
        layer.matmul(x, out)


def test_matmul_picks_the_tile_height_per_call(monkeypatch):
    """A layer whose N both tile heights divide (384 rows) runs 192-row tiles (blocks of 384
    threads) for a prompt whose tiles fill 3/4 of the SMs and 128-row ones (256 threads) for a
    shorter one, each build loaded once and kept beside the other; one x' layout serves both."""
    from int4jit import api
    layer = _stubbed_layer(Int4Linear.from_linear(torch.nn.Linear(512, 384), group_size=128))
    layer.device.arch, layer.device.sm_count, layer.device.supports_overlap = "sm_90", 8, True
    loaded, launched = [], []

    def fake_load(dev, spec):
        loaded.append((spec.kernel, spec.block))
        run = lambda args, stream: launched.append((spec.kernel, spec.block))
        return type("K", (), {"launch_packed": staticmethod(run)})()

    monkeypatch.setattr(api, "load", fake_load)
    for T, block in ((1000, 384), (128, 256), (1000, 384), (129, 256)):  # 2 row tiles x 8, 1, 8, 2 token tiles
        launched.clear()
        layer.matmul(torch.randn(T, 512).half(), torch.empty(T, 384).half())
        assert launched == [("xperm", 256), ("gemm", block)]
    assert loaded == [("xperm", 256), ("gemm", 384), ("xperm", 256), ("gemm", 256)]


def test_launch_chunks_walks_x_and_y_a_chunk_a_launch(monkeypatch):
    """GemvWeights.launch_chunks (Int4Linear's path for 17..chunked_tokens tokens): one launch per
    16 rows with x's and y's pointers advanced a chunk each time, the partial last chunk through
    its own plan, made without a runtime search; plans are made once. The GPU is stubbed."""
    from int4jit import api
    N, K = 64, 256
    mod = Int4Linear.from_linear(torch.nn.Linear(K, N, bias=False), group_size=128)
    launched, planned = [], []

    def kernel_for(dev, shape, config, stream, fixed_weights=False, tune=True):
        assert fixed_weights and tune == (shape.M == 16)  # no search for a remainder mid-prompt
        planned.append(shape.M)
        return type("K", (), {"launch_packed": staticmethod(lambda args, s: launched.append((list(args.values), s, shape.M)))})()

    layer = _stubbed_layer(mod)
    monkeypatch.setattr(api, "kernel_for", kernel_for)
    for T, chunks in ((40, [16, 16, 8]), (32, [16, 16]), (40, [16, 16, 8])):
        x, y = torch.randn(T, K).half(), torch.empty(T, N).half()
        assert layer.launch_chunks(x, y) is y
        got = launched[-len(chunks):]
        assert [m for _, _, m in got] == chunks
        for i, (values, stream, _) in enumerate(got):
            assert values == [x.data_ptr() + i * 16 * K * 2, 1, 2, 3, y.data_ptr() + i * 16 * N * 2] and stream == 0x50
    assert planned == [16, 8] and len(launched) == 8  # each chunk shape planned once


def test_eager_call_launches_with_the_prepared_layer_until_the_weights_move(monkeypatch):
    """Int4Linear's eager call (the decode path: 1..16 tokens, fp16 or bf16) of an x shape and
    dtype that a checked call planned goes straight to its layer's ShapedCall: the launch gets x's
    pointer and a new y's, y shaped [..., N] like x, new memory every call; a plan variable set
    later plans again; a shape no kernel serves, or first seen inside a graph capture (its pick
    is the capture's cheap one), keeps no entry; after the weights are replaced
    (as .to() / .cuda() or an assignment does) it no longer launches that layer. The GPU is
    stubbed: a layer prepared for 'device -1' (where a CPU tensor reports itself), whose checked
    call (GemvWeights.__call__) plans each shape first."""
    from int4jit import api
    N, K = 64, 256
    mod = Int4Linear.from_linear(torch.nn.Linear(K, N, bias=False), group_size=128)
    launched, planned = [], []

    def kernel_for(dev, shape, config, stream, fixed_weights=False, tune=True):
        if shape.M == 5:
            raise NotImplementedError("no kernel for 5 tokens here")
        planned.append((shape, os.environ.get("INT4JIT_CONFIG")))
        return type("K", (), {"launch_packed": staticmethod(lambda args, s: launched.append((list(args.values), s, shape)))})()

    capturing = [False]
    layer = _stubbed_layer(mod, lambda stream: capturing[0])
    monkeypatch.setattr(api, "kernel_for", kernel_for)
    monkeypatch.delenv("INT4JIT_CONFIG", raising=False)
    mod._layer = layer
    kept = []  # every y stays alive: each call's must be memory of its own
    for make in (lambda: torch.randn(1, 1, K).half(), lambda: torch.randn(K).half(),
                 lambda: torch.randn(1, 3, K).to(torch.bfloat16)):
        layer(make())  # the checked call plans the shape
        for _ in range(2):
            x = make()
            y = mod(x)
            assert y.shape == x.shape[:-1] + (N,) and y.dtype == x.dtype and y.is_contiguous()
            assert y.data_ptr() not in {k.data_ptr() for k in kept}
            kept.append(y)
            values, stream, shape = launched[-1]
            assert values == [x.data_ptr(), 1, 2, 3, y.data_ptr()] and stream == 0x50
            assert (shape.M, shape.dtype) == (x.numel() // K, str(x.dtype).removeprefix("torch."))
    assert len(launched) == 9 and len(planned) == 3 and len(layer.calls) == 3
    # what a plan keeps to make y from views the weights: it allocates nothing (memory a call kept
    # would stop torch.compile's CUDA graphs from recording)
    w_storage = mod.w.untyped_storage().data_ptr()
    assert all(c.like.untyped_storage().data_ptr() == w_storage for c in layer.calls.values())
    capturing[0] = True  # a shape first seen inside a graph capture: launched, its pick not kept
    layer(torch.randn(2, K).half())
    assert len(launched) == 10 and len(planned) == 4 and len(layer.calls) == 3
    capturing[0] = False
    launched.pop(), planned.pop()
    monkeypatch.setenv("INT4JIT_CONFIG", "128,2")  # a plan variable set later: planned again, then kept
    mod(torch.randn(K).half())
    mod(torch.randn(K).half())
    assert len(launched) == 11 and len(planned) == 4 and planned[-1][1] == "128,2"
    with pytest.raises(NotImplementedError):
        layer(torch.randn(5, K).half())
    assert len(layer.calls) == 3  # no entry for what no kernel serves
    y = mod(torch.randn(5, K).half())  # on the CPU: dequantise + matmul
    assert y.shape == (5, N) and len(launched) == 11
    mod.w = mod.w.clone()  # the weights moved: the prepared layer holds the old buffer
    y = mod(torch.randn(K).half())  # on the CPU that is the dequantising fallback
    assert len(launched) == 11 and y.shape == (N,)


def test_gradients_flow_to_x_through_every_path():
    """Fine-tuning adapters on frozen int4 layers needs dL/dx = dL/dy @ W: the custom op has a
    backward (checked by torch's opcheck and gradcheck), and Int4Linear's CPU path is dense; the
    int4 weights get no gradient."""
    q = Int4Linear.from_linear(torch.nn.Linear(256, 64), group_size=64)
    W = torch.from_numpy(int4jit.dequantize(q.w.numpy(), q.scales.numpy(), q.zeros.numpy()))
    for zeros in (q.zeros, None):
        torch.library.opcheck(torch.ops.int4jit.gemv.default, (torch.randn(3, 256, requires_grad=True), q.w, q.scales, zeros))
    torch.library.opcheck(torch.ops.int4jit.gemv.default,  # with a module's own limits
                          (torch.randn(20, 256, requires_grad=True), q.w, q.scales, q.zeros, 16, 0))
    x = torch.randn(3, 256, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: torch.ops.int4jit.gemv(t, q.w, q.scales, q.zeros), (x,))
    x = torch.randn(2, 256, requires_grad=True)
    g = torch.randn(2, 64)
    (q(x) * g).sum().backward()
    assert torch.allclose(x.grad, g @ W, rtol=1e-4, atol=1e-5)
    x.grad = None
    (torch.ops.int4jit.gemv(x, q.w, q.scales, q.zeros) * g).sum().backward()
    assert torch.allclose(x.grad, g @ W, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gradients_flow_to_x_on_the_gpu_kernels():
    """On the GPU a call whose x requires grad (with grad enabled) runs the kernel through the
    custom op, so y matches the reference and x.grad = dL/dy @ W, for one token and several (40:
    more than a 2 MB layer's chunks take, dequantised); under torch.no_grad the eager path is
    unchanged."""
    q = Int4Linear.from_linear(torch.nn.Linear(4096, 1024, bias=False).cuda(), group_size=128).cuda()
    w, s, z = (t.cpu().numpy() for t in (q.w, q.scales, q.zeros))
    W = torch.from_numpy(int4jit.dequantize(w, s, z)).cuda()
    for tokens in (1, 4, 20, 40):  # 20: in chunks of 16
        x = torch.randn(1, tokens, 4096, device="cuda", dtype=torch.float16, requires_grad=True)
        y = q(x)
        assert y.requires_grad and y.shape == (1, tokens, 1024)
        ref = np.stack([int4jit.reference_gemv(v, w, s, z) for v in x.detach().reshape(-1, 4096).cpu().numpy()])
        assert rel_error(y.detach().float().reshape(tokens, -1).cpu().numpy(), ref) < 2e-3
        g = torch.randn_like(y)
        y.backward(g)
        expected = (g.float().reshape(tokens, -1) @ W).reshape(x.shape)
        assert rel_error(x.grad.float().cpu().numpy(), expected.cpu().numpy()) < 5e-3
    with torch.no_grad():
        assert not q(torch.randn(1, 1, 4096, device="cuda", dtype=torch.float16)).requires_grad


def test_model_dtype_conversions_keep_the_quantised_scales():
    """model.float() / .to(torch.bfloat16) / .double() convert the bias but not the scales: they
    stay as quantised (a cast would change the weights, and the kernels read fp16 or bf16)."""
    q = Int4Linear.from_linear(torch.nn.Linear(256, 64), group_size=64)
    scales = q.scales.clone()
    for convert, bias_dtype in ((lambda m: m.float(), torch.float32), (lambda m: m.to(torch.bfloat16), torch.bfloat16),
                                (lambda m: torch.nn.Sequential(m).double(), torch.float64)):
        convert(q)
        assert q.scales.dtype == torch.float16 and torch.equal(q.scales, scales) and q.bias.dtype == bias_dtype
    x = torch.randn(2, 256, dtype=torch.float64)
    W = int4jit.dequantize(q.w.numpy(), scales.numpy(), q.zeros.numpy()).astype(np.float64)
    assert np.allclose(q(x).numpy(), x.numpy() @ W.T + q.bias.numpy(), rtol=1e-6, atol=1e-6)


def test_the_custom_ops_prepared_layers_live_as_long_as_their_weights(monkeypatch):
    """torch.ops.int4jit.gemv prepares one layer per weight set and keeps it on the weight tensor:
    the same layer while the same tensors come back, a new one for other scales or after w got
    new storage, and none left once the weights are gone (a table would keep every compiled
    model's weights alive). GemvWeights is stubbed (it needs a GPU)."""
    import gc
    import weakref
    import int4jit.torch as i4t
    made = []

    class Layer:
        def __init__(self, w, scales, zeros):
            self.w, self.scales, self.zeros, self.w_ptr = w, scales, zeros, w.data_ptr()
            made.append(weakref.ref(self))

    monkeypatch.setattr(i4t, "GemvWeights", Layer)
    w, s, z = torch.zeros(64, 128, dtype=torch.uint8), torch.ones(64, 2, dtype=torch.float16), None
    a = i4t._layer_for(w, s, z)
    assert i4t._layer_for(w, s, z) is a and len(made) == 1
    assert i4t._layer_for(w, s.clone(), z) is not a and len(made) == 2
    w.set_(torch.zeros(64, 128, dtype=torch.uint8))  # new storage, same object
    b = i4t._layer_for(w, s, z)
    assert b is not a and b.w_ptr == w.data_ptr() and len(made) == 3
    del w, a, b
    gc.collect()
    assert all(r() is None for r in made)


@pytest.mark.parametrize("bad,pattern", [
    (dict(scales=torch.ones(64, 3, dtype=torch.float16)), r"scales must be of shape \[N, K/g\]"),
    (dict(scales=torch.ones(64, 2, dtype=torch.float32)), r"scales must be float16 or bfloat16"),
    (dict(w=torch.zeros(64, 128, dtype=torch.int8)), r"w must be uint8"),
    (dict(zeros=torch.zeros(64, 4, dtype=torch.uint8)), r"zeros must be uint8 of the shape of scales"),
    (dict(zeros=torch.full((64, 2), 16, dtype=torch.uint8)), r"zeros must be zero points 0..15"),
    (dict(bias=torch.ones(1)), r"bias must have shape \(64,\), one value an output row; got \(1,\)"),
    (dict(bias=torch.ones(64, 1)), r"bias must have shape \(64,\)"),
])
def test_a_layer_with_inconsistent_weights_is_refused_when_made(bad, pattern):
    """Int4Linear(w, scales, zeros) checks the layout gemv takes when it is made, naming the
    tensor, instead of failing at its first call."""
    args = dict(w=torch.zeros(64, 128, dtype=torch.uint8), scales=torch.ones(64, 2, dtype=torch.float16),
                zeros=torch.zeros(64, 2, dtype=torch.uint8))
    Int4Linear(**args, bias=torch.ones(64))
    with pytest.raises((TypeError, ValueError), match=pattern):
        Int4Linear(**{**args, **bad})


def test_a_scalar_input_is_refused_with_the_shape_expected():
    q = Int4Linear(torch.zeros(64, 128, dtype=torch.uint8), torch.ones(64, 2, dtype=torch.float16))
    assert q(torch.zeros(3, 256)).shape == (3, 64)
    with pytest.raises(ValueError, match=r"expects \[\.\.\., 256\] inputs; got \(\)"):
        q(torch.tensor(1.0))
