"""Int4Linear layers called on one x (q/k/v, gate/up) fused into one launch: which layers are
fused, that their outputs equal the unfused layers', and that anything unexpected splits them up."""
import copy
import logging
import os

import pytest

if os.environ.get("CI"):
    import torch  # CI installs it: a skip there would hide that nothing ran
else:
    torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from int4jit.torch import Int4Linear, _Fused, fuse_shared_inputs, quantize_model  # noqa: E402


class Attention(nn.Module):
    """q, k, v on x (k and v on `memory` where given, as cross-attention does), o on their mix."""

    def __init__(self, d=128, kv=64, bias=(True, False, True)):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, n, bias=b) for n, b in zip((d, kv, kv), bias))
        self.o_proj = nn.Linear(d, d)

    def forward(self, x, memory=None):
        m = x if memory is None else memory
        q, k, v = self.q_proj(x), self.k_proj(m), self.v_proj(m)
        return self.o_proj(q * torch.cat([k, v], -1).sigmoid())


class Mlp(nn.Module):
    def __init__(self, d=128, h=256):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(d, h), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, d=128, kv=64, h=256):
        super().__init__()
        self.attn, self.mlp = Attention(d, kv), Mlp(d, h)

    def forward(self, x, memory=None):
        h = x + self.attn(x, memory)
        return h + self.mlp(h)


def _pair(seed=0):
    """The same block quantised twice: fused, and each layer alone (the reference)."""
    torch.manual_seed(seed)
    block = Block()
    ref = quantize_model(copy.deepcopy(block), group_size=32, fuse=False)
    return quantize_model(block, group_size=32), ref


def _count_launches(monkeypatch):
    """Count the dequantise + matmul calls (the CPU's launch): one per Int4Linear that computes."""
    calls = []
    original = Int4Linear._on_the_cpu
    monkeypatch.setattr(Int4Linear, "_on_the_cpu", lambda self, x: calls.append(self.out_features) or original(self, x))
    return calls


def test_layers_called_on_one_x_run_as_one_and_match_the_unfused_layers(monkeypatch):
    fused, ref = _pair()
    for _ in range(3):
        x = torch.randn(2, 5, 128)
        torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)
    a, m = fused.attn, fused.mlp
    assert isinstance(a.q_proj._shared, _Fused) and a.q_proj._shared is a.k_proj._shared is a.v_proj._shared
    assert isinstance(m.gate_proj._shared, _Fused) and m.gate_proj._shared is m.up_proj._shared
    assert a.o_proj._shared is None and m.down_proj._shared is None  # called on other inputs
    # the members' weights are views of one tensor: held once
    assert a.k_proj.w.untyped_storage().data_ptr() == a.q_proj.w.untyped_storage().data_ptr()
    x = torch.randn(3, 128)
    want = ref(x)
    calls = _count_launches(monkeypatch)
    torch.testing.assert_close(fused(x), want, rtol=1e-5, atol=1e-5)
    assert sorted(calls) == sorted([128 + 64 + 64, 128, 256 + 256, 128])  # q/k/v, o, gate/up, down


def test_layers_on_different_inputs_are_not_fused():
    fused, ref = _pair()
    for _ in range(2):
        x, memory = torch.randn(4, 128), torch.randn(4, 128)
        torch.testing.assert_close(fused(x, memory), ref(x, memory), rtol=1e-5, atol=1e-5)
    a = fused.attn
    assert a.q_proj._shared is None  # alone on x
    assert isinstance(a.k_proj._shared, _Fused) and a.k_proj._shared is a.v_proj._shared  # both on memory
    assert a.k_proj._shared.members == (a.k_proj, a.v_proj)


def test_a_call_with_another_input_splits_the_group_up_and_stays_right(caplog):
    fused, ref = _pair()
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    a, r = fused.attn, ref.attn
    assert isinstance(a.q_proj._shared, _Fused)
    x1, x2 = torch.randn(1, 128), torch.randn(1, 128)
    with caplog.at_level(logging.WARNING, logger="int4jit"):
        torch.testing.assert_close(a.q_proj(x1), r.q_proj(x1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.k_proj(x2), r.k_proj(x2), rtol=1e-5, atol=1e-5)  # not q's x: computed alone
    assert [r.getMessage() for r in caplog.records if "no longer run as one" in r.getMessage()]
    assert a.q_proj._shared is a.k_proj._shared is a.v_proj._shared is None
    x = torch.randn(2, 128)
    torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)


def test_an_input_changed_in_place_is_computed_again():
    fused, ref = _pair()
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    a, r = fused.attn, ref.attn
    x = torch.randn(1, 128)
    a.q_proj(x)
    x.mul_(-2)  # the same object, other values: k must not return the slice made for the old ones
    torch.testing.assert_close(a.k_proj(x), r.k_proj(x), rtol=1e-5, atol=1e-5)


def test_a_layer_asked_twice_for_one_input_gets_its_output_again():
    fused, ref = _pair()
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    a, r = fused.attn, ref.attn
    x = torch.randn(2, 128)
    y1, y2 = a.q_proj(x), a.q_proj(x)
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(a.v_proj(x), r.v_proj(x), rtol=1e-5, atol=1e-5)
    assert isinstance(a.q_proj._shared, _Fused)


def test_outputs_are_contiguous_like_nn_linears():
    fused, _ = _pair()
    fused(torch.randn(3, 7, 128)), fused(torch.randn(3, 7, 128))
    a = fused.attn
    x = torch.randn(3, 7, 128)
    ys = [a.q_proj(x), a.k_proj(x), a.v_proj(x)]
    assert [tuple(y.shape) for y in ys] == [(3, 7, 128), (3, 7, 64), (3, 7, 64)]
    assert all(y.is_contiguous() for y in ys)
    ys[1].view(21, 64)  # what a model may do with a projection's output


def test_state_dict_keeps_each_layers_keys_and_loading_reaches_the_fused_weights():
    fused, ref = _pair()
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    assert set(fused.state_dict()) == set(ref.state_dict())
    _, other = _pair(seed=1)
    fused.load_state_dict(other.state_dict())  # copied into the views: the fused weights follow
    x = torch.randn(2, 128)
    torch.testing.assert_close(fused(x), other(x), rtol=1e-5, atol=1e-5)
    fused.load_state_dict(ref.state_dict(), assign=True)  # new tensors: the group is made again
    torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)
    assert isinstance(fused.attn.q_proj._shared, _Fused)


def test_dtype_conversion_and_copies_stay_right():
    fused, ref = _pair()
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    fused.to(torch.float64), ref.to(torch.float64)
    x = torch.randn(2, 128, dtype=torch.float64)
    torch.testing.assert_close(fused(x), ref(x), rtol=1e-9, atol=1e-9)
    twin = copy.deepcopy(fused)  # a copy runs each layer alone, on its own views
    assert all(m._shared is None for m in twin.modules() if isinstance(m, Int4Linear))
    torch.testing.assert_close(twin(x), ref(x), rtol=1e-9, atol=1e-9)


def test_only_compatible_siblings_are_candidates():
    torch.manual_seed(0)
    parent = nn.Module()
    parent.a, parent.b = (Int4Linear.from_linear(nn.Linear(128, 32), group_size=32) for _ in range(2))
    parent.c = Int4Linear.from_linear(nn.Linear(128, 32), group_size=64)  # another group size
    parent.d = Int4Linear.from_linear(nn.Linear(128, 32), group_size=32, symmetric=True)
    assert fuse_shared_inputs(parent) == 1
    assert parent.a._shared is parent.b._shared is not None
    assert parent.c._shared is None and parent.d._shared is None
    assert quantize_model(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), group_size=32)[0]._shared is not None
    assert quantize_model(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), group_size=32, fuse=False)[0]._shared is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_layers_on_the_gpu_eager_captured_and_as_prefill(dtype, monkeypatch):
    """One token (the kernels), 40 tokens (dequantise + cuBLAS, or the GEMM on Hopper: these
    layers are under GEMM_MIN_BYTES, which is set to 0 here so the fused GEMM runs) and a CUDA
    graph of a one-token step, against the same layers run alone."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    import int4jit.torch as i4t
    monkeypatch.setattr(i4t, "GEMM_MIN_BYTES", 0)
    torch.manual_seed(0)
    block = Block(512, 256, 1024).to("cuda", dtype)  # k and v of 256: q * [k, v]
    ref = quantize_model(copy.deepcopy(block), group_size=128, fuse=False)
    fused = quantize_model(block, group_size=128)
    with torch.no_grad():
        for tokens in (1, 1, 40, 1):
            x = torch.randn(1, tokens, 512, device="cuda", dtype=dtype)
            got, want = fused(x), ref(x)
            assert ((got - want).float().norm() / want.float().norm()) < 1e-2, tokens
        assert isinstance(fused.attn.q_proj._shared, _Fused) and isinstance(fused.mlp.up_proj._shared, _Fused)
        static = torch.randn(1, 1, 512, device="cuda", dtype=dtype)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = fused(static)
        for _ in range(2):
            static.copy_(torch.randn_like(static))
            y.fill_(float("nan"))
            graph.replay()
            want = ref(static)
            assert ((y - want).float().norm() / want.float().norm()) < 1e-2


def test_a_deleted_fused_model_frees_its_weights_without_the_garbage_collector():
    import gc
    import weakref
    fused, _ = _pair()
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    group = fused.attn.q_proj._shared
    assert isinstance(group, _Fused)
    weights = weakref.ref(group.linear.w)
    gc.disable()
    try:
        del fused, group
        assert weights() is None
    finally:
        gc.enable()


def test_a_fused_model_compiles_in_one_graph_with_each_layer_alone():
    fused, ref = _pair()
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    assert isinstance(fused.attn.q_proj._shared, _Fused)
    compiled = torch.compile(fused, fullgraph=True, backend="eager")  # a graph break would raise
    x = torch.randn(2, 128)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x), rtol=1e-5, atol=1e-5)
    assert fused.attn.q_proj._shared.x is None  # the group was not used while compiled


def test_fused_layers_run_under_inference_mode():
    """Inference tensors keep no version counter: the group goes by the x object alone there."""
    fused, ref = _pair()
    with torch.inference_mode():
        for tokens in (1, 3, 1):
            x = torch.randn(tokens, 128)
            torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-5)
    assert isinstance(fused.attn.q_proj._shared, _Fused)


def test_gradients_reach_x_through_a_fused_group():
    fused, ref = _pair()
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    x = torch.randn(2, 128, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    fused(x).square().sum().backward()
    ref(x_ref).square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)


def test_layers_whose_rows_would_start_off_alignment_are_not_fused():
    """K/g = 4 zero points a row: a member starting at row 2 would start 8 bytes into a 16-byte
    line, which the kernels cannot read when it runs alone on its views."""
    torch.manual_seed(0)
    parent = nn.Module()
    parent.a, parent.b = (Int4Linear.from_linear(nn.Linear(128, n), group_size=32) for n in (2, 32))
    fuse_shared_inputs(parent)
    for _ in range(2):
        x = torch.randn(1, 128)
        ya, yb = parent.a(x), parent.b(x)
    assert parent.a._shared is None and parent.b._shared is None
    parent.c, parent.d = (Int4Linear.from_linear(nn.Linear(128, n), group_size=32) for n in (4, 32))
    fuse_shared_inputs(parent)
    for _ in range(2):
        x = torch.randn(1, 128)
        parent.c(x), parent.d(x)
    assert isinstance(parent.c._shared, _Fused)  # 4 rows of 4 zero points: 16 bytes
    assert parent.d.zeros.data_ptr() % 16 == 0 and parent.d.scales.data_ptr() % 16 == 0


def test_a_bf16_group_with_and_without_biases_keeps_their_dtype():
    fused, ref = _pair()  # q and v have biases, k has none
    fused.to(torch.bfloat16), ref.to(torch.bfloat16)
    for _ in range(2):
        x = torch.randn(2, 128, dtype=torch.bfloat16)
        torch.testing.assert_close(fused(x), ref(x), rtol=2e-2, atol=2e-2)
    a = fused.attn
    assert isinstance(a.q_proj._shared, _Fused) and a.k_proj.bias is None
    assert a.q_proj.bias.dtype == a.v_proj.bias.dtype == a.q_proj._shared.linear.bias.dtype == torch.bfloat16


def test_fused_members_let_go_of_their_own_weights():
    """Members computed alone while watched (the CPU keeps their dense weight and what it was made
    of); once fused, nothing holds their own tensors: the weights are held once."""
    import weakref
    fused, _ = _pair()
    own = weakref.ref(fused.attn.k_proj.w)
    fused(torch.randn(1, 128)), fused(torch.randn(1, 128))
    assert isinstance(fused.attn.k_proj._shared, _Fused)
    assert own() is None
