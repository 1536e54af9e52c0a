"""Converters: MatMulNBits against onnxruntime on the CPU; AWQ and GPTQ against packings built
here from the formats' documented layouts (code that shares nothing with the converters)."""
import numpy as np
import pytest

import int4jit

from conftest import rel_error



def _need(mod):
    import os
    try:
        return __import__(mod)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{mod} is missing in CI: scripts/test.sh installs it")
        pytest.skip(f"{mod} not installed")


def build_matmulnbits_model(path, K, N, block, B, scales, zero_points):
    onnx = _need("onnx")
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["A", "B", "scales"]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "zp"))
        inputs.append("zp")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], name="proj", domain="com.microsoft",
                            K=K, N=N, bits=4, block_size=block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


def random_matmulnbits(rng, K, N, block, symmetric):
    kb = -(-K // block)
    B = rng.integers(0, 256, (N, kb, block // 2), dtype=np.uint8)
    scales = (rng.random((N, kb)) * 0.05 + 0.001).astype(np.float16).astype(np.float32)  # fp16-exact
    zp = None if symmetric else rng.integers(0, 256, (N, (kb + 1) // 2), dtype=np.uint8)
    return B, scales, zp


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("K,block", [(256, 16), (512, 32), (1024, 128), (768, 256), (200, 32), (1000, 64), (77 * 2, 16)])
def test_matmulnbits_against_onnxruntime(tmp_path, K, block, symmetric):
    ort = _need("onnxruntime")
    rng = np.random.default_rng()
    N = 48
    B, scales, zp = random_matmulnbits(rng, K, N, block, symmetric)
    path = build_matmulnbits_model(tmp_path / "m.onnx", K, N, block, B, scales, zp)
    x = rng.standard_normal((1, K)).astype(np.float16)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y_ort = sess.run(None, {"A": x.astype(np.float32)})[0]
    weights = int4jit.onnx.load(path)
    assert list(weights) == ["proj"]
    wt = weights["proj"]
    assert (wt.K, wt.N, wt.block_size) == (K, N, block) and wt.K_padded % block == 0
    y = int4jit.reference_gemv(wt.pad_x(x), *wt.args())
    assert rel_error(y, y_ort) < 1e-5


def test_matmulnbits_flat_scales_and_float_zero_points():
    rng = np.random.default_rng()
    K, N, block = 256, 8, 32
    B, scales, zp = random_matmulnbits(rng, K, N, block, False)
    w1, s1, z1 = int4jit.from_matmulnbits(B, scales, zp, K=K, N=N, block_size=block)
    w2, s2, z2 = int4jit.from_matmulnbits(B, scales.reshape(-1), zp.reshape(-1), K=K, N=N, block_size=block)
    zf = z1.astype(np.float32)
    w3, s3, z3 = int4jit.from_matmulnbits(B, scales, zf, K=K, N=N, block_size=block)
    for a, b in [(w1, w2), (s1, s2), (z1, z2), (z1, z3), (w1, w3)]:
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="integers 0..15"):
        int4jit.from_matmulnbits(B, scales, zf + 0.5, K=K, N=N, block_size=block)


def test_matmulnbits_round_trip_and_errors():
    rng = np.random.default_rng()
    B, scales, zp = random_matmulnbits(rng, 512, 16, 64, False)
    w, s, z = int4jit.from_matmulnbits(B, scales, zp, K=512, N=16, block_size=64)
    B2, s2, zp2, attrs = int4jit.to_matmulnbits(w, s, z)
    np.testing.assert_array_equal(B2, B)
    np.testing.assert_array_equal(zp2, zp)
    assert attrs == {"K": 512, "N": 16, "bits": 4, "block_size": 64}
    with pytest.raises(ValueError, match="bits=4"):
        int4jit.from_matmulnbits(B, scales, zp, K=512, N=16, block_size=64, bits=8)
    with pytest.raises(ValueError, match="block_size=8"):
        int4jit.from_matmulnbits(B, scales, zp, K=512, N=16, block_size=8)
    with pytest.raises(ValueError, match="must be uint8"):
        int4jit.from_matmulnbits(B[:, :-1], scales, zp, K=512, N=16, block_size=64)


# -- AWQ / GPTQ from their documented layouts ------------------------------------------------
def pack_awq(q_kn):
    """AWQ GEMM: int32 [K, N/8], nibble slot i of column c holds column 8c + [0,2,4,6,1,3,5,7][i]."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    R, C = q_kn.shape
    out = np.zeros((R, C // 8), dtype=np.uint32)
    for r in range(R):
        for c in range(C // 8):
            word = 0
            for slot in range(8):
                word |= int(q_kn[r, 8 * c + order[slot]]) << (4 * slot)
            out[r, c] = word
    return out.view(np.int32)


def pack_gptq_weight(q_kn):
    """GPTQ: int32 [K/8, N], row r holds k = 8r..8r+7, k = 8r in the lowest bits."""
    K, N = q_kn.shape
    out = np.zeros((K // 8, N), dtype=np.uint32)
    for r in range(K // 8):
        for i in range(8):
            out[r] |= q_kn[8 * r + i].astype(np.uint32) << (4 * i)
    return out.view(np.int32)


def pack_gptq_zeros(z_gn):
    G, N = z_gn.shape
    out = np.zeros((G, N // 8), dtype=np.uint32)
    for c in range(N // 8):
        for i in range(8):
            out[:, c] |= z_gn[:, 8 * c + i].astype(np.uint32) << (4 * i)
    return out.view(np.int32)


def test_awq_matches_documented_layout():
    rng = np.random.default_rng()
    K, N, G = 256, 64, 64
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = rng.integers(0, 16, (K // G, N), dtype=np.uint8)
    s = (rng.random((K // G, N)) * 0.1).astype(np.float16)
    w, sc, zc = int4jit.from_awq(pack_awq(q), pack_awq(z), s, group_size=G)
    expected = (q.astype(np.float64) - np.repeat(z, G, axis=0)) * np.repeat(s.astype(np.float64), G, axis=0)  # [K, N]
    np.testing.assert_array_equal(int4jit.dequantize(w, sc, zc).astype(np.float64), expected.T.astype(np.float32))
    x = rng.standard_normal(K).astype(np.float16)
    np.testing.assert_allclose(int4jit.reference_gemv(x, w, sc, zc), x.astype(np.float64) @ expected, rtol=1e-10)


@pytest.mark.parametrize("version", [1, 2])
def test_gptq_matches_documented_layout(version):
    rng = np.random.default_rng()
    K, N, G = 512, 32, 128
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = rng.integers(1 if version == 1 else 0, 16, (K // G, N), dtype=np.uint8)
    s = (rng.random((K // G, N)) * 0.1).astype(np.float16)
    stored = z - 1 if version == 1 else z
    g_idx = np.arange(K) // G
    w, sc, zc = int4jit.from_gptq(pack_gptq_weight(q), pack_gptq_zeros(stored), s, g_idx, group_size=G, version=version)
    expected = (q.astype(np.float64) - np.repeat(z, G, axis=0)) * np.repeat(s.astype(np.float64), G, axis=0)
    np.testing.assert_array_equal(int4jit.dequantize(w, sc, zc), expected.T.astype(np.float32))


def test_gptq_symmetric_v1_stores_seven():
    rng = np.random.default_rng()
    K, N, G = 256, 16, 32
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    s = (rng.random((K // G, N)) * 0.1).astype(np.float16)
    sevens = np.full((K // G, N), 7, np.uint8)
    w, sc, zc = int4jit.from_gptq(pack_gptq_weight(q), pack_gptq_zeros(sevens), s, group_size=G, symmetric=True)
    assert zc is None
    expected = (q.astype(np.float64) - 8) * np.repeat(s.astype(np.float64), G, axis=0)
    np.testing.assert_array_equal(int4jit.dequantize(w, sc, None), expected.T.astype(np.float32))
    with pytest.raises(ValueError, match="not all 8"):  # the v2 reading of a v1 checkpoint
        int4jit.from_gptq(pack_gptq_weight(q), pack_gptq_zeros(sevens), s, group_size=G, version=2, symmetric=True)


def test_gptq_act_order_is_rejected():
    K, N, G = 256, 16, 32
    g_idx = np.random.default_rng().permutation(np.arange(K) // G)
    with pytest.raises(ValueError, match="act-order"):
        int4jit.from_gptq(np.zeros((K // 8, N), np.int32), np.zeros((K // G, N // 8), np.int32),
                          np.ones((K // G, N), np.float16), g_idx, group_size=G)
