"""int4jit.onnx.load: golden models from onnxruntime's quantizer and onnxruntime-genai
(tests/fixtures), and hand-built nodes (act-order g_idx, bias, mixed, prepacked, malformed)
against onnxruntime's CPU kernel or the float64 truth."""
import json
import logging
from pathlib import Path

import numpy as np
import pytest

import int4jit
from int4jit.reference import pack_nibbles

from conftest import need as _need, rel_error

FIXTURES = Path(__file__).parent / "fixtures"


def _y(wt, x):
    """float64 y of one loaded node for x [K] in the model's input order (bias included)."""
    y = int4jit.dequantize(*wt.args()).astype(np.float64) @ wt.prepare_x(np.asarray(x, np.float64))
    return y if wt.bias is None else y + wt.bias.astype(np.float64)


def _y_file_scales(wt, x, scales32):
    """The same with the node's own fp32 scales: isolates the reading of B, zero points and g_idx."""
    q = int4jit.reference.unpack_nibbles(wt.w).astype(np.float64)
    z = np.full(wt.scales.shape, 8.0) if wt.zeros is None else wt.zeros.astype(np.float64)
    g = wt.K_padded // wt.scales.shape[1]
    W = (q - np.repeat(z, g, axis=1)) * np.repeat(np.asarray(scales32, np.float64).reshape(wt.scales.shape), g, axis=1)
    y = W @ wt.prepare_x(np.asarray(x, np.float64))
    return y if wt.bias is None else y + wt.bias.astype(np.float64)


def _initializers(path):
    onnx = _need("onnx")
    from onnx import numpy_helper
    model = onnx.load(str(path))
    return model, {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


# -- golden models ---------------------------------------------------------------------------
def _onnx_cases():
    meta = json.loads((FIXTURES / "fixtures.json").read_text())
    return [(c, m) for c, m in sorted(meta["cases"].items()) if m["kind"] == "onnx"]


@pytest.mark.parametrize("case,meta", _onnx_cases(), ids=[c for c, _ in _onnx_cases()])
def test_golden_model_matches_onnxruntime(case, meta, caplog):
    _need("onnx")
    data = np.load(FIXTURES / "fixtures.npz")
    x = data[f"{case}/x"][0]
    outputs = {k.split("/y/", 1)[1]: data[k][0] for k in data.files if k.startswith(f"{case}/y/")}
    model, inits = _initializers(FIXTURES / meta["file"])
    with caplog.at_level(logging.WARNING, logger="int4jit.onnx"):
        loaded = int4jit.onnx.load(FIXTURES / meta["file"])
    nodes = {n.name: n for n in model.graph.node if n.op_type == "MatMulNBits"}
    assert set(loaded) | set(loaded.skipped) == set(nodes)
    assert set(loaded.skipped) == set(meta.get("int8_nodes", []))
    if loaded.skipped:
        assert all("bits=8" in r for r in loaded.skipped.values())
        assert any(name in rec.getMessage() for rec in caplog.records for name in loaded.skipped)
    for name, wt in loaded.items():
        node = nodes[name]
        y_ort = outputs[node.output[0]]
        assert (wt.K, wt.N) == (meta["K"], meta["N"])
        if case == "genai_gptq_actorder":
            # exact against the checkpoint; onnxruntime's CPU kernel drops packed zero points when
            # g_idx is given (its y is the zero-point-8 product): check that reading too
            assert wt.perm is not None
            W = int4jit.dequantize(*wt.args()).astype(np.float64)
            W_in_order = np.empty_like(W)
            W_in_order[:, wt.perm] = W
            np.testing.assert_array_equal(W_in_order, data[f"{case}/w_true"].astype(np.float64))
            y8 = int4jit.dequantize(wt.w, wt.scales, None).astype(np.float64) @ wt.prepare_x(x)
            assert rel_error(y8, y_ort) < 1e-5
            continue
        assert wt.perm is None
        assert rel_error(_y_file_scales(wt, x, inits[node.input[2]]), y_ort) < 1e-6  # B, zeros, prepacking exact
        assert rel_error(_y(wt, x), y_ort) < 1e-3                                   # fp16 scales: rounding only


def test_prepacked_layouts_decode_to_the_same_weights():
    _need("onnx")
    a, b = (int4jit.onnx.load(FIXTURES / f"genai_prepacked_sm{arch}.onnx") for arch in (80, 90))
    (wa,), (wb,) = a.values(), b.values()
    _, inits = _initializers(FIXTURES / "genai_prepacked_sm80.onnx")
    B = next(v for k, v in inits.items() if v.dtype == np.uint8)
    assert not np.array_equal(wa.w, B.reshape(wa.w.shape))  # the stored bytes are not the plain layout
    np.testing.assert_array_equal(wa.w, wb.w)


# -- hand-built nodes --------------------------------------------------------------------------
def build_model(path, inputs: dict, attrs: dict, name="proj", K=None, N=None, extra_nodes=()):
    """One MatMulNBits node; inputs maps the node's input slots (1..5) to arrays, "" for empty."""
    onnx = _need("onnx")
    from onnx import TensorProto, helper, numpy_helper
    names = ["A"] + [""] * 5
    inits = []
    for slot, arr in inputs.items():
        if isinstance(arr, str):  # "": the slot left empty
            continue
        names[slot] = f"t{slot}"
        if arr is not None:
            inits.append(numpy_helper.from_array(arr, f"t{slot}"))
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], name=name, domain="com.microsoft", **attrs)
    graph_inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, K])]
    graph_inputs += [helper.make_tensor_value_info(f"t{s}", TensorProto.UINT8, None) for s, a in inputs.items()
                     if a is None]
    graph = helper.make_graph([node, *extra_nodes], "g", graph_inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _run_ort(path, x):
    ort = _need("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": x[None].astype(np.float32)})[0][0]


def _layer(rng, K, N, block):
    kb = K // block
    q = rng.integers(0, 16, (N, K), dtype=np.uint8)
    z = rng.integers(0, 16, (N, kb), dtype=np.uint8)
    s = (rng.random((N, kb)) * 0.02 + 0.002).astype(np.float16).astype(np.float32)  # fp16-exact
    return q, z, s


def _packed(q, block):
    """q [N, K] as MatMulNBits' B: [N, K / block, block / 2] bytes."""
    N, K = q.shape
    return pack_nibbles(q).reshape(N, K // block, block // 2)


def _g_idx(rng, K, block):
    order = rng.permutation(K)
    g = np.empty(K, np.int32)
    g[order] = np.arange(K) // block
    return g


@pytest.mark.parametrize("zero_points", ["float", "none"])
def test_act_order_and_bias_against_onnxruntime(tmp_path, zero_points):
    """g_idx (input 4) and bias (input 5) against onnxruntime's CPU kernel. (Its g_idx path ignores
    packed uint8 zero points, so the packed form is checked against the float64 truth below.)"""
    rng = np.random.default_rng()
    K, N, block = 256, 48, 32
    q, z, s = _layer(rng, K, N, block)
    g = _g_idx(rng, K, block)
    bias = rng.standard_normal(N).astype(np.float32)
    zp = z.astype(np.float32) if zero_points == "float" else ""
    path = build_model(tmp_path / "m.onnx", {1: _packed(q, block), 2: s, 3: zp, 4: g, 5: bias},
                       dict(K=K, N=N, bits=4, block_size=block), K=K, N=N)
    x = rng.standard_normal(K).astype(np.float16).astype(np.float32)
    (wt,) = int4jit.onnx.load(path).values()
    assert wt.perm is not None and wt.bias is not None
    y_ort = _run_ort(path, x)
    assert rel_error(_y(wt, x), y_ort) < 1e-6
    wt.bias = None
    assert rel_error(_y(wt, x), y_ort) > 1e-3  # the bias is really there


def test_act_order_packed_zero_points_and_ragged_k(tmp_path):
    rng = np.random.default_rng()
    K, N, block = 200, 16, 32  # ragged: 6 full groups and one of 8
    kb = -(-K // block)
    q = rng.integers(0, 16, (N, kb * block), dtype=np.uint8)
    q[:, K:] = 0
    z = rng.integers(0, 16, (N, kb), dtype=np.uint8)
    s = (rng.random((N, kb)) * 0.02 + 0.002).astype(np.float16)
    g = np.arange(K) // block
    g = g[rng.permutation(K)].astype(np.int32)
    zp = int4jit.to_matmulnbits(pack_nibbles(q), s, z)[2]
    path = build_model(tmp_path / "m.onnx", {1: _packed(q, block), 2: s, 3: zp, 4: g},
                       dict(K=K, N=N, bits=4, block_size=block), K=K, N=N)
    (wt,) = int4jit.onnx.load(path).values()
    assert wt.K_padded == kb * block and wt.perm.shape == (wt.K_padded,)
    W = (q[:, :K].astype(np.float64) - z[:, g]) * s.astype(np.float64)[:, g]  # the node's meaning
    x = rng.standard_normal(K)
    np.testing.assert_allclose(_y(wt, x), W @ x, rtol=1e-10, atol=1e-10)


def test_uneven_g_idx_groups_are_skipped_with_the_reason(tmp_path, caplog):
    rng = np.random.default_rng()
    K, N, block = 128, 16, 32
    q, z, s = _layer(rng, K, N, block)
    g = (np.arange(K) // block).astype(np.int32)
    g[:3] = 1
    path = build_model(tmp_path / "m.onnx", {1: _packed(q, block), 2: s, 4: g},
                       dict(K=K, N=N, bits=4, block_size=block), name="odd", K=K, N=N)
    with caplog.at_level(logging.WARNING, logger="int4jit.onnx"):
        loaded = int4jit.onnx.load(path)
    assert list(loaded) == [] and "groups of exactly 32" in loaded.skipped["odd"]
    assert "odd" in caplog.text
    with pytest.raises(ValueError, match="odd: .*groups of exactly 32"):
        int4jit.onnx.load(path, strict=True)


def test_mixed_model_keeps_the_readable_nodes(tmp_path):
    onnx = _need("onnx")
    from onnx import helper
    rng = np.random.default_rng()
    K, N, block = 128, 16, 32
    q, z, s = _layer(rng, K, N, block)
    B4 = _packed(q, block)
    B8 = rng.integers(0, 256, (N, K // block, block), dtype=np.uint8)
    int8_node = helper.make_node("MatMulNBits", ["A", "B8", "t2"], ["Y8"], name="lm_head", domain="com.microsoft",
                                 K=K, N=N, bits=8, block_size=block)
    dyn_node = helper.make_node("MatMulNBits", ["A", "A", "t2"], ["Yd"], name="dynamic", domain="com.microsoft",
                                K=K, N=N, bits=4, block_size=block)
    odd_node = helper.make_node("MatMulNBits", ["A", "t1", "t2"], ["Yp"], name="future", domain="com.microsoft",
                                K=K, N=N, bits=4, block_size=block, weight_prepacked=3)
    path = build_model(tmp_path / "m.onnx", {1: B4, 2: s}, dict(K=K, N=N, bits=4, block_size=block), K=K, N=N,
                       extra_nodes=[int8_node, dyn_node, odd_node])
    model = onnx.load(str(path))
    model.graph.initializer.append(onnx.numpy_helper.from_array(B8, "B8"))
    onnx.save(model, str(path))
    loaded = int4jit.onnx.load(path)
    assert list(loaded) == ["proj"]
    assert "bits=8" in loaded.skipped["lm_head"]
    assert "not an initializer" in loaded.skipped["dynamic"]
    assert "weight_prepacked=3" in loaded.skipped["future"]
    x = rng.standard_normal(K)
    W = (q.astype(np.float64) - 8) * np.repeat(s.astype(np.float64), block, axis=1)
    np.testing.assert_allclose(_y(loaded["proj"], x), W @ x, rtol=1e-10)
    with pytest.raises(ValueError, match="lm_head: bits=8"):
        int4jit.onnx.load(path, strict=True)


def test_prepacked_node_with_unsupported_shape_is_refused_never_misread(tmp_path):
    rng = np.random.default_rng()
    K, N, block = 96, 16, 32  # K % 64 != 0: not a shape the fpA_intB layout can hold
    q, z, s = _layer(rng, K, N, block)
    path = build_model(tmp_path / "m.onnx", {1: _packed(q, block), 2: s},
                       dict(K=K, N=N, bits=4, block_size=block, weight_prepacked=1), K=K, N=N)
    loaded = int4jit.onnx.load(path)
    assert list(loaded) == [] and "weight_prepacked=1" in loaded.skipped["proj"]


def _refused(tmp_path, name: str, match: str, attrs=None, scales=None, bias=None):
    """A one-node model (K=64, N=16, blocks of 32) with what a test spoils: onnx.load names the node."""
    K, N, block = 64, 16, 32
    q, z, s = _layer(np.random.default_rng(), K, N, block)
    inputs = {1: _packed(q, block), 2: s if scales is None else scales(s)}
    if bias is not None:
        inputs[5] = bias
    attrs = dict(K=K, N=N, bits=4, block_size=block) if attrs is None else attrs(dict(K=K, N=N, bits=4, block_size=block))
    path = build_model(tmp_path / "m.onnx", inputs, attrs, name=name, K=K, N=N)
    with pytest.raises(ValueError, match=match):
        int4jit.onnx.load(path)


@pytest.mark.parametrize("missing", ["K", "N", "block_size"])
def test_missing_attribute_names_the_node_and_the_attribute(tmp_path, missing):
    _refused(tmp_path, "layers.3.mlp", rf"layers\.3\.mlp: MatMulNBits attribute '{missing}' is missing",
             attrs=lambda a: {k: v for k, v in a.items() if k != missing})


def test_scales_outside_fp16_name_the_node_and_tensor(tmp_path):
    def overflowing(s):
        s[5, 1] = 1e6
        return s
    _refused(tmp_path, "layers.7.o_proj", r"layers\.7\.o_proj \(tensor 't2'.*overflow float16.*\(5, 1\)",
             scales=overflowing)


def test_bias_of_the_wrong_shape_is_an_error(tmp_path):
    _refused(tmp_path, "p", r"p: bias 't5' must be float \[N=16\]", bias=np.zeros(17, np.float32))
