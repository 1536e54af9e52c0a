"""Converters: MatMulNBits against onnxruntime on the CPU; AWQ and GPTQ against packings built
here from the formats' documented layouts (code that shares nothing with the converters)."""
import numpy as np
import pytest

import int4jit

from conftest import need as _need, rel_error



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
@pytest.mark.parametrize("K,block", [(256, 16), (512, 32), (1024, 128), (768, 256), (200, 32), (1000, 64), (77 * 2, 16),
                                     (2048, 512), (1500, 512), (3072, 1024)])  # the last three: read as groups of 128
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


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
@pytest.mark.parametrize("K,groups", [(512, 4), (384, 3), (96, 3), (80, 5)])  # g = 128, 128, 32, 16
def test_per_channel_checkpoints_read_as_groups_of_the_same_values(fmt, K, groups):
    # group_size=-1: one scale and zero point a row; read into `groups` groups a row repeating them
    rng = np.random.default_rng()
    N = 24
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = rng.integers(1, 16, (1, N), dtype=np.uint8)
    s = (rng.random((1, N)) * 0.1 + 0.01).astype(np.float16)
    if fmt == "awq":
        out = int4jit.from_awq(pack_awq(q), pack_awq(z), s, group_size=-1)
    else:
        out = int4jit.from_gptq(pack_gptq_weight(q), pack_gptq_zeros(z - 1), s, np.zeros(K, np.int32), group_size=-1)
    assert out.perm is None and out.scales.shape == out.zeros.shape == (N, groups)
    assert (out.scales == s.T).all() and (out.zeros == z.T).all()
    expected = (q.astype(np.float64) - z) * s.astype(np.float64)  # [K, N]
    np.testing.assert_array_equal(int4jit.dequantize(*out), expected.T.astype(np.float32))
    config = {"quant_method": fmt, "bits": 4, "group_size": -1, "desc_act": fmt == "gptq"}
    tensors = {"qweight": pack_awq(q), "qzeros": pack_awq(z), "scales": s} if fmt == "awq" else \
        {"qweight": pack_gptq_weight(q), "qzeros": pack_gptq_zeros(z - 1), "scales": s, "g_idx": np.zeros(K, np.int32)}
    np.testing.assert_array_equal(int4jit.dequantize(*int4jit.from_quantized_layer(config, tensors)), int4jit.dequantize(*out))
    sym = int4jit.from_gptq(pack_gptq_weight(q), pack_gptq_zeros(np.full((1, N), 7, np.uint8)), s, group_size=-1,
                            symmetric=True)
    assert sym.zeros is None and sym.scales.shape == (N, groups)


@pytest.mark.parametrize("version", [1, 2])
def test_gptq_groups_wider_than_the_kernels_read_exactly_with_act_order(version):
    rng = np.random.default_rng()
    K, N, G = 2048, 16, 512  # read as groups of 128
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = rng.integers(0, 16, (K // G, N), dtype=np.uint8)
    s = (rng.random((K // G, N)) * 0.1 + 0.01).astype(np.float16)
    g_idx = _act_order_g_idx(rng, K, G)
    qz = pack_gptq_zeros(z).view(np.uint32) - np.uint32(0x11111111 if version == 1 else 0)
    out = int4jit.from_gptq(pack_gptq_weight(q), qz.view(np.int32), s, g_idx, group_size=G, version=version)
    assert out.scales.shape == out.zeros.shape == (N, K // 128) and out.perm is not None
    x = rng.standard_normal(K)
    y = int4jit.dequantize(out.w, out.scales, out.zeros).astype(np.float64) @ x[out.perm]
    np.testing.assert_allclose(y, _true_weights(q, z, s, g_idx) @ x, rtol=1e-6, atol=1e-6)


def test_per_channel_needs_k_in_whole_groups_and_other_sizes_are_named():
    with pytest.raises(ValueError, match="group_size=-1 .per channel. with K=72"):
        int4jit.from_gptq(np.zeros((9, 8), np.int32), np.zeros((1, 1), np.int32), np.ones((1, 8), np.float16),
                          group_size=-1)
    for bad in (-2, 0, 24, 1000, "128", True):  # 48 is read as groups of 16
        with pytest.raises(ValueError, match=rf"GPTQ group_size={bad!r} is not supported.*multiple of one"):
            int4jit.from_gptq(np.zeros((8, 8), np.int32), np.zeros((1, 1), np.int32), np.ones((1, 8), np.float16),
                              group_size=bad)


@pytest.mark.parametrize("fmt", ["gptq", "awq", "matmulnbits"])
def test_torch_tensors_read_as_their_numpy_values_bfloat16_scales_too(fmt):
    # checkpoints load as torch tensors (safetensors), with bfloat16 scales from some producers
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    K, N, G = 256, 16, 64
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = rng.integers(0, 16, (K // G, N), dtype=np.uint8)
    s = torch.from_numpy((rng.random((K // G, N)) * 0.1 + 0.01).astype(np.float32)).bfloat16()
    s_np = s.float().numpy()  # bfloat16 values, exact in float32 (and in float16 at this range)
    if fmt == "gptq":
        args, kw, read = (pack_gptq_weight(q), pack_gptq_zeros(z)), dict(group_size=G, version=2), int4jit.from_gptq
    elif fmt == "awq":
        args, kw, read = (pack_awq(q), pack_awq(z)), dict(group_size=G), int4jit.from_awq
    else:  # MatMulNBits: scales [N, K/G]
        B, _, zp = random_matmulnbits(rng, K, N, G, False)
        args, kw, read = (B,), dict(zero_points=zp, K=K, N=N, block_size=G), int4jit.from_matmulnbits
        s, s_np = s.T.contiguous(), s_np.T
    want = read(*args, s_np, **kw)
    got = read(*(torch.from_numpy(np.ascontiguousarray(a)) for a in args), s,
               **{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="meta tensor.*load the checkpoint"):
        read(*(torch.from_numpy(np.ascontiguousarray(a)).to("meta") for a in args), s, **kw)


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


def _true_weights(q_kn, z_gn, s_gn, g_idx):
    """float64 [N, K] weights of a GPTQ layer as its producers define them: (q - z[g]) * s[g]."""
    return ((q_kn.astype(np.float64) - z_gn[g_idx]) * s_gn.astype(np.float64)[g_idx]).T


def _act_order_g_idx(rng, K, G):
    order = rng.permutation(K)  # GPTQ desc_act: input order[i] is quantised i-th, into group i // G
    g_idx = np.empty(K, np.int32)
    g_idx[order] = np.arange(K) // G
    return g_idx


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_act_order_reads_exactly(version, symmetric):
    rng = np.random.default_rng()
    K, N, G = 512, 32, 64
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = np.full((K // G, N), 8, np.uint8) if symmetric else rng.integers(0, 16, (K // G, N), dtype=np.uint8)
    s = (rng.random((K // G, N)) * 0.1 + 0.01).astype(np.float16)
    g_idx = _act_order_g_idx(rng, K, G)
    qz = pack_gptq_zeros(z).view(np.uint32)
    if version == 1:
        qz = qz - np.uint32(0x11111111)
    out = int4jit.from_gptq(pack_gptq_weight(q), qz.view(np.int32), s, g_idx, group_size=G, version=version,
                            symmetric=symmetric)
    assert out.perm is not None and out.perm.dtype == np.int32 and out.perm.shape == (K,)
    np.testing.assert_array_equal(np.sort(out.perm), np.arange(K))
    assert (out.zeros is None) == symmetric
    x = rng.standard_normal(K)
    W = _true_weights(q, z, s, g_idx)
    y = int4jit.dequantize(out.w, out.scales, out.zeros).astype(np.float64) @ x[out.perm]
    np.testing.assert_allclose(y, W @ x, rtol=1e-6, atol=1e-6)
    # the same layer read without its g_idx (what a caller ignoring desc_act gets) is wrong
    plain = int4jit.from_gptq(pack_gptq_weight(q), qz.view(np.int32), s, group_size=G, version=version,
                              symmetric=symmetric)
    assert plain.perm is None
    assert np.abs(int4jit.dequantize(*plain).astype(np.float64) @ x - W @ x).max() > 1e-3
    with pytest.raises(TypeError, match="perm"):
        w, sc, zc = out  # an act-order result never unpacks into three silently


def test_gptq_ramp_g_idx_gives_no_perm_and_unpacks():
    rng = np.random.default_rng()
    K, N, G = 256, 16, 32
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = rng.integers(0, 16, (K // G, N), dtype=np.uint8)
    s = np.ones((K // G, N), np.float16)
    out = int4jit.from_gptq(pack_gptq_weight(q), pack_gptq_zeros(z), s, np.arange(K) // G, group_size=G, version=2)
    assert out.perm is None and isinstance(out, int4jit.Int4Weights)
    w, sc, zc = out
    assert w is out.w and sc is out.scales and zc is out.zeros


def test_gptq_act_order_groups_must_be_group_size_long():
    K, N, G = 256, 16, 32
    g_idx = np.arange(K) // G
    g_idx[0] = 1  # group 0 holds 31 inputs, group 1 holds 33
    with pytest.raises(ValueError, match="groups of exactly 32"):
        int4jit.from_gptq(np.zeros((K // 8, N), np.int32), np.zeros((K // G, N // 8), np.int32),
                          np.ones((K // G, N), np.float16), g_idx, group_size=G)
    with pytest.raises(TypeError, match="g_idx must be integer"):
        int4jit.from_gptq(np.zeros((K // 8, N), np.int32), np.zeros((K // G, N // 8), np.int32),
                          np.ones((K // G, N), np.float16), (np.arange(K) // G).astype(np.float32), group_size=G)


def test_gptq_v1_zero_point_zero_borrows_across_the_word():
    """GPTQModel writes v1 qzeros as (packed true zeros) - 0x11111111 on the whole word: a zero point
    of 0 turns into 15 and borrows 1 from the next nibble. Read back by adding the word."""
    rng = np.random.default_rng()
    K, N, G = 128, 16, 32
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = rng.integers(0, 16, (K // G, N), dtype=np.uint8)
    z[0, :8] = [0, 5, 0, 0, 15, 1, 0, 9]   # borrows chain through neighbours
    z[1, 8:16] = 0                          # a word of zeros: 0 - 0x11111111 wraps to 0xEEEEEEEF
    s = (rng.random((K // G, N)) * 0.1 + 0.01).astype(np.float16)
    stored = (pack_gptq_zeros(z).view(np.uint32) - np.uint32(0x11111111)).view(np.int32)
    assert stored.view(np.uint32)[1, 1] == 0xEEEEEEEF
    naive = ((z.astype(np.int16) - 1) & 0xF).astype(np.uint8)  # a per-nibble reading would differ
    assert not np.array_equal(pack_gptq_zeros(naive), stored)
    out = int4jit.from_gptq(pack_gptq_weight(q), stored, s, group_size=G, version=1)
    np.testing.assert_array_equal(out.zeros, z.T)
    W = _true_weights(q, z, s, np.arange(K) // G)
    np.testing.assert_array_equal(int4jit.dequantize(*out).astype(np.float64), W.astype(np.float32))


@pytest.mark.parametrize("bad,match", [(70000.0, "overflow float16"), (1e-9, "underflow float16"),
                                       (np.nan, "NaN or infinite"), (-np.inf, "NaN or infinite")])
def test_fp32_scales_outside_fp16_are_an_error(bad, match):
    rng = np.random.default_rng()
    K, N, G = 128, 16, 32
    s = (rng.random((K // G, N)) * 0.1 + 0.01).astype(np.float32)
    s[2, 3] = bad
    q = np.zeros((K // 8, N), np.int32)
    z = np.zeros((K // G, N // 8), np.int32)
    with pytest.raises(ValueError, match=rf"GPTQ scales: 1 value\(s\) {match}.*\(3, 2\)"):
        int4jit.from_gptq(q, z, s, group_size=G, version=2)
    with pytest.raises(ValueError, match=rf"AWQ scales: 1 value\(s\) {match}"):
        int4jit.from_awq(np.zeros((K, N // 8), np.int32), z, s, group_size=G)
    with pytest.raises(ValueError, match=match):
        int4jit.from_matmulnbits(np.zeros((N, K // G, G // 2), np.uint8), s.T, K=K, N=N, block_size=G)
    s[2, 3] = 65519.0  # still rounds to 65504, and 0 stays 0: both fine
    s[0, 0] = 0.0
    out = int4jit.from_gptq(q, z, s, group_size=G, version=2)
    assert out.scales.dtype == np.float16 and out.scales[3, 2] == 65504 and np.all(np.isfinite(out.scales))


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_converters_refuse_wrong_dtypes_naming_the_argument(fmt):
    K, N, G = 128, 16, 32
    if fmt == "gptq":
        conv = lambda qw, qz: int4jit.from_gptq(qw, qz, np.ones((K // G, N), np.float16), group_size=G)  # noqa: E731
        qw, qz = np.zeros((K // 8, N), np.int32), np.zeros((K // G, N // 8), np.int32)
    else:
        conv = lambda qw, qz: int4jit.from_awq(qw, qz, np.ones((K // G, N), np.float16), group_size=G)  # noqa: E731
        qw, qz = np.zeros((K, N // 8), np.int32), np.zeros((K // G, N // 8), np.int32)
    conv(qw, qz)
    for bad_qz in (qz.astype(np.float32), qz.astype(np.int64), qz.astype(np.uint8), None, qz[0]):
        with pytest.raises(TypeError, match="qzeros must be int32"):
            conv(qw, bad_qz)
    for bad_qw in (qw.astype(np.float16), qw.astype(np.int64), None, qw[None]):
        with pytest.raises(TypeError, match="qweight must be int32"):
            conv(bad_qw, qz)
    with pytest.raises(TypeError, match="scales must be floating"):
        (int4jit.from_gptq if fmt == "gptq" else int4jit.from_awq)(
            qw, qz, np.ones((K // G, N), np.int32), group_size=G)


def test_from_quantized_layer_reads_the_flags_from_the_config():
    rng = np.random.default_rng()
    K, N, G = 256, 16, 32
    q = rng.integers(0, 16, (K, N), dtype=np.uint8)
    z = rng.integers(0, 16, (K // G, N), dtype=np.uint8)
    s = (rng.random((K // G, N)) * 0.1 + 0.01).astype(np.float16)
    g_idx = _act_order_g_idx(rng, K, G)
    bias = rng.standard_normal(N).astype(np.float16)
    v1 = (pack_gptq_zeros(z).view(np.uint32) - np.uint32(0x11111111)).view(np.int32)
    tensors = {"model.layers.0.mlp.up_proj.qweight": pack_gptq_weight(q), "model.layers.0.mlp.up_proj.qzeros": v1,
               "model.layers.0.mlp.up_proj.scales": s, "model.layers.0.mlp.up_proj.g_idx": g_idx,
               "model.layers.0.mlp.up_proj.bias": bias}
    config = {"model_type": "llama", "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": G,
                                                             "desc_act": True, "sym": False,
                                                             "checkpoint_format": "gptq"}}
    out = int4jit.from_quantized_layer(config, tensors)
    x = rng.standard_normal(K)
    W = _true_weights(q, z, s, g_idx)
    np.testing.assert_allclose(int4jit.dequantize(out.w, out.scales, out.zeros).astype(np.float64) @ out.permute_x(x),
                               W @ x, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out.bias, bias)
    # the v2 label on v1 data reads zero points one lower: the format key matters
    v2 = int4jit.from_quantized_layer({**config["quantization_config"], "checkpoint_format": "gptq_v2"}, tensors)
    assert not np.array_equal(v2.zeros, out.zeros)
    with pytest.raises(ValueError, match="desc_act=True.*no g_idx"):
        int4jit.from_quantized_layer(config, {k: v for k, v in tensors.items() if not k.endswith("g_idx")})
    for bad, match in (({"bits": 8}, "bits=8"), ({"checkpoint_format": "marlin"}, "marlin"),
                       ({"quant_method": "hqq"}, "hqq"), ({"pack_dtype": "int16"}, "int16")):
        with pytest.raises(ValueError, match=match):
            int4jit.from_quantized_layer({**config["quantization_config"], **bad}, tensors)
    awq = int4jit.from_quantized_layer({"w_bit": 4, "q_group_size": G, "zero_point": True, "version": "GEMM"},
                                       {"qweight": pack_awq(q), "qzeros": pack_awq(z), "scales": s})
    assert awq.perm is None
    np.testing.assert_array_equal(int4jit.dequantize(*awq).astype(np.float64),
                                  _true_weights(q, z, s, np.arange(K) // G).astype(np.float32))


# -- golden fixtures written by the real producers (tests/fixtures/make_fixtures.py) ----------
FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures"


def _fixture_cases(kind):
    import json
    meta = json.loads((FIXTURES / "fixtures.json").read_text())
    return [(case, m) for case, m in sorted(meta["cases"].items()) if m["kind"] == kind]


@pytest.mark.parametrize("case,meta", _fixture_cases("gptq") + _fixture_cases("awq"), ids=lambda v: v if isinstance(v, str) else "")
def test_producer_fixture_reads_exactly(case, meta):
    """GPTQModel and AutoAWQ layers, read through the checkpoint config: our float64 weights,
    rounded to fp16, equal the producer's own fp16 dequantisation bit for bit."""
    data = np.load(FIXTURES / "fixtures.npz")
    tensors = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith(case + "/")}
    reference = tensors.pop("dequantized").astype(np.float64).T  # [N, K], the checkpoint's input order
    out = int4jit.from_quantized_layer(meta["config"], tensors)
    assert (out.perm is not None) == bool(meta["config"].get("desc_act", False))
    W = int4jit.dequantize(out.w, out.scales, out.zeros).astype(np.float64)
    if out.perm is not None:
        W_in_order = np.empty_like(W)
        W_in_order[:, out.perm] = W
        W = W_in_order
    assert W.shape == (meta["N"], meta["K"])
    np.testing.assert_array_equal(W.astype(np.float16).astype(np.float64), reference)
    x = np.random.default_rng().standard_normal(meta["K"])
    y = int4jit.dequantize(out.w, out.scales, out.zeros).astype(np.float64) @ out.permute_x(x)
    np.testing.assert_allclose(y, reference @ x, rtol=2e-3, atol=2e-3)
    if "bias" in tensors:
        np.testing.assert_array_equal(out.bias, tensors["bias"])


def test_fixtures_hold_v1_zero_points_of_zero():
    """The GPTQ v1 fixtures exercise the word borrow (a v1 zero point of 0)."""
    cases = dict(_fixture_cases("gptq"))
    assert cases["gptqmodel_gptq_asym"]["zero_points_0_present"]
    assert cases["gptqmodel_gptq_asym_actorder"]["zero_points_0_present"]
