"""KernelSpec: its canonical key, its geometry, the variant record and the override grammar
that reaches it. Pure functions: no compiler, no GPU."""
from dataclasses import replace
from functools import partial

import pytest

from int4jit import plan, tuner
from int4jit.shapes import GemvShape, LaunchConfig
from int4jit.spec import (SIMT_VARIANT, Variant, choose_kernel, default_variant, make_spec, normalise_variant,
                          template_hash, variant_space)

SHAPE = GemvShape(28672, 4096, 128, False)   # streams by default: every variant field applies
CFG = LaunchConfig(128, 4)


def _spec(**change):
    """make_spec with one argument changed from a tc build on sm_90 with PDL."""
    args = dict(shape=SHAPE, arch="sm_90", kernel="tc", config=CFG, variant=None, pdl=True, sm_count=132)
    args.update(change)
    return make_spec(**args)


# -- the canonical key --------------------------------------------------------------------
def test_key_is_the_same_for_the_same_build():
    a, b = _spec(), _spec()
    assert a.key() == b.key() and a == b and hash(a) == hash(b)
    assert a.canonical() == b.canonical()
    # the default variant named explicitly is the same build as variant=None
    assert _spec(variant=default_variant(SHAPE, "tc", CFG)).key() == a.key()
    # the SM count changes nothing here (no one_wave register cap): same build, same key
    assert _spec(sm_count=108).key() == a.key()


@pytest.mark.parametrize("change", [
    {"variant": replace(default_variant(SHAPE, "tc", CFG), streaming=False, raw_a=False)},
    {"variant": replace(default_variant(SHAPE, "tc", CFG), raw_a=False)},
    {"variant": replace(default_variant(SHAPE, "tc", CFG), kcluster=2)},
    {"variant": replace(default_variant(SHAPE, "tc", CFG), one_wave=True)},
    {"variant": replace(default_variant(SHAPE, "tc", CFG), loads=8)},
    {"variant": replace(default_variant(SHAPE, "tc", CFG), prefetch=1)},
    {"variant": replace(default_variant(SHAPE, "tc", CFG), prefetch=2)},
    {"config": LaunchConfig(256, 4)}, {"config": LaunchConfig(128, 8)},
    {"pdl": False},
    {"shape": GemvShape(28672, 4096, 128, True)}, {"shape": GemvShape(28672, 4096, 64, False)},
    {"shape": GemvShape(28673, 4096, 128, False)}, {"shape": GemvShape(28672, 4224, 128, False)},
    {"arch": "sm_80"}, {"arch": "sm_89"},
    {"kernel": "simt", "variant": None},
], ids=lambda c: ",".join(f"{k}={v.text() if isinstance(v, Variant) else v}" for k, v in c.items()))
def test_key_changes_with_every_field_that_changes_the_build(change):
    base, other = _spec(), _spec(**change)
    assert other.key() != base.key() and other != base
    assert other.canonical() != base.canonical()


def test_key_ignores_a_variant_field_that_normalises_away():
    """kcluster=2 cannot build on sm_80, prefetch needs PDL (sm_90), raw_a needs streaming: the
    spec holds what is built, so such a request has the key of the build it becomes."""
    v = default_variant(SHAPE, "tc", CFG)
    assert _spec(arch="sm_80", variant=replace(v, kcluster=2)).key() == _spec(arch="sm_80", variant=v).key()
    assert _spec(arch="sm_80", variant=replace(v, prefetch=2)).key() == _spec(arch="sm_80", variant=v).key()
    plain = Variant()
    assert _spec(variant=replace(plain, raw_a=True)).key() == _spec(variant=plain).key()


def test_one_wave_key_follows_the_sm_count_it_was_capped_for():
    v = replace(default_variant(SHAPE, "tc", CFG), one_wave=True)
    a, b = _spec(variant=v, sm_count=132), _spec(variant=v, sm_count=66)
    assert a.param("KERNEL_ATTRS") != b.param("KERNEL_ATTRS") and a.key() != b.key()


def test_template_hash_is_per_kernel_stable_and_short():
    import re
    assert template_hash("tc") == template_hash("tc") != template_hash("simt")
    assert re.fullmatch(r"[0-9a-f]{16}", template_hash("simt"))
    assert _spec().canonical()["template"] == template_hash("tc")


# -- geometry ----------------------------------------------------------------------------
@pytest.mark.parametrize("N,K,group,cfg", [(4096, 4096, 128, LaunchConfig(128, 4)),
                                           (4097, 4160, 32, LaunchConfig(256, 2)),
                                           (2048, 128, 16, LaunchConfig(512, 8)),
                                           (11008, 14336, 256, LaunchConfig(64, 16))])
def test_tc_geometry_covers_every_row_and_step(N, K, group, cfg):
    s = make_spec(GemvShape(N, K, group, False), "sm_90", "tc", cfg, Variant())
    steps = -(-K // 128)
    ksplit, tw = s.param("KSPLIT"), s.param("TW")
    assert tw == cfg.TN // 2 and s.rows_per_block == 16 * tw
    assert ksplit == min(cfg.BS // 32, steps) and s.block == 32 * ksplit
    assert s.grid * s.rows_per_block >= N > (s.grid - 1) * s.rows_per_block
    assert s.param("CONTIG") == ("true" if group < 128 else "false")
    assert s.param("UNROLL") >= 1 and 0 < s.k_efficiency <= 1


@pytest.mark.parametrize("N,K,cfg,ksplit,grid", [
    (5120, 17920, LaunchConfig(256, 2), 8, 640),    # 8 warps a block, two blocks a row block
    (4097, 4096, LaunchConfig(32, 2), 1, 2 * 257),  # one warp a block: the cluster still splits K
    (2048, 256, LaunchConfig(512, 2), 1, 256),      # two steps: one each
])
def test_kcluster_doubles_the_grid_on_sm_90(N, K, cfg, ksplit, grid):
    shape = GemvShape(N, K, 128, False)
    one = make_spec(shape, "sm_90", "tc", cfg, Variant())
    two = make_spec(shape, "sm_90", "tc", cfg, Variant(kcluster=2))
    assert two.variant.kcluster == 2 and two.param("KCLUSTER") == 2 and two.grid == 2 * one.grid == grid
    assert two.param("KSPLIT") == ksplit and two.block == 32 * ksplit and 2 * ksplit <= -(-K // 128)
    assert "__cluster_dims__(2, 1, 1)" in two.param("KERNEL_ATTRS")
    assert "__cluster_dims__" not in one.param("KERNEL_ATTRS")


@pytest.mark.parametrize("arch,K", [("sm_80", 4096), ("sm_89", 4096), ("sm_90", 128)])
def test_kcluster_is_normalised_where_it_cannot_apply(arch, K):
    """Before sm_90 there are no clusters; K of one step cannot be split."""
    shape = GemvShape(4096, K, 128, False)
    s = make_spec(shape, arch, "tc", CFG, Variant(kcluster=2))
    assert s.variant.kcluster == 1 and s.param("KCLUSTER") == 1
    assert s.grid == make_spec(shape, arch, "tc", CFG, Variant()).grid == 4096 // 32


def test_prefetch_is_built_only_with_pdl():
    v = Variant(prefetch=2)
    assert make_spec(SHAPE, "sm_90", "tc", CFG, v, pdl=True).param("PREFETCH") == 2
    assert make_spec(SHAPE, "sm_90", "tc", CFG, v, pdl=False).param("PREFETCH") == 0
    assert make_spec(SHAPE, "sm_80", "tc", CFG, v, pdl=False).variant.prefetch == 0


@pytest.mark.parametrize("N,K,cfg,blocks", [(28672, 4096, LaunchConfig(128, 4), 7),   # 896 blocks on 132 SMs
                                            (28672, 4096, LaunchConfig(128, 8), 4),   # 448
                                            (2048, 4096, LaunchConfig(512, 2), 1)])   # 128
def test_one_wave_caps_registers_for_a_one_wave_grid(N, K, cfg, blocks):
    s = make_spec(GemvShape(N, K, 32, False), "sm_90", "tc", cfg, Variant(one_wave=True), sm_count=132)
    assert s.param("KERNEL_ATTRS") == f"__launch_bounds__({cfg.BS}, {blocks})"
    plain = make_spec(GemvShape(N, K, 32, False), "sm_90", "tc", cfg, Variant(), sm_count=132)
    assert plain.param("KERNEL_ATTRS") == f"__launch_bounds__({cfg.BS})"


@pytest.mark.parametrize("N,K,group,streams,xsmem,raw", [
    (28672, 4096, 128, True, True, True), (4096, 14336, 256, True, True, True),
    (4096, 28672, 128, True, False, True),  # x (56 KB) does not fit static shared memory: streams without it
    (4096, 4096, 128, True, True, False),   # under TC_RAW_MIN_WEIGHTS: streams, A through the scales
    (4096, 1024, 128, False, False, False),  # K under TC_STREAM_MIN_K
    (28672, 4096, 64, False, False, False)])  # groups under 128: the plain kernel measured faster
def test_default_variant_streams_large_g128_shapes(N, K, group, streams, xsmem, raw):
    shape = GemvShape(N, K, group, False)
    s = make_spec(shape, "sm_90", "tc", LaunchConfig(512, 2))
    assert s.variant.streaming is streams and s.param("STREAMING") == ("true" if streams else "false")
    assert s.param("XSMEM") == ("true" if xsmem else "false")
    assert not s.variant.raw_a  # one tile a warp (TN=2): raw_a does not pay
    assert make_spec(shape, "sm_90", "tc", LaunchConfig(128, 4)).variant.raw_a is raw


@pytest.mark.parametrize("N,K,cfg", [(1, 16, LaunchConfig(32, 2)), (7, 48, LaunchConfig(64, 16)),
                                     (4097, 4096, LaunchConfig(256, 4)), (11008, 14336, LaunchConfig(512, 8))])
def test_simt_geometry_covers_every_row_and_chunk(N, K, cfg):
    s = make_spec(GemvShape(N, K, 16, False), "gfx90a", "simt", cfg)
    vec, kt = s.param("VEC"), s.param("KT")
    assert vec == (16 if K % 32 == 0 else 8)
    assert cfg.BS % kt == 0 and kt & (kt - 1) == 0 and s.block == cfg.BS
    assert s.grid * s.rows_per_block >= N > (s.grid - 1) * s.rows_per_block
    assert kt < 2 * (K // (2 * vec)) or kt == 1  # no more than half the K lanes idle
    assert s.variant == SIMT_VARIANT


def test_simt_refuses_variant_fields():
    shape = GemvShape(4096, 4096, 128, False)
    for v in (Variant(streaming=True), Variant(kcluster=2), Variant(loads=8), Variant(prefetch=2)):
        with pytest.raises(ValueError, match="simt kernel has no variant fields"):
            make_spec(shape, "sm_90", "simt", CFG, v)
    assert make_spec(shape, "sm_90", "simt", CFG, Variant()).variant == SIMT_VARIANT  # the defaults are fine
    with pytest.raises(ValueError, match="unknown kernel 'mma'"):
        make_spec(shape, "sm_90", "mma", CFG)


# -- the variant space -------------------------------------------------------------------
@pytest.mark.parametrize("shape", [SHAPE, GemvShape(4096, 4096, 32, True), GemvShape(4096, 128, 128, False)],
                         ids=lambda s: s.key())
@pytest.mark.parametrize("exhaustive", [False, True])
def test_variant_space_default_first_no_duplicates(shape, exhaustive):
    space = variant_space(shape, "tc", CFG, "sm_90", exhaustive)
    assert space[0] == default_variant(shape, "tc", CFG)
    assert len(set(space)) == len(space) >= 4
    specs = [make_spec(shape, "sm_90", "tc", CFG, v, pdl=True) for v in space]
    assert len({s.key() for s in specs}) == len(specs)  # each one a different build
    if exhaustive:
        assert set(variant_space(shape, "tc", CFG, "sm_90", False)) <= set(space)
        assert any(v.prefetch == 2 for v in space)
        assert any(v.kcluster == 2 for v in space) == (shape.K >= 256)


def test_variant_space_of_simt_is_its_one_variant():
    assert variant_space(SHAPE, "simt", CFG, "sm_90", True) == [SIMT_VARIANT]


def test_variant_space_on_sm_80_lists_each_build_once():
    space = variant_space(SHAPE, "tc", CFG, "sm_80", False)
    built = [normalise_variant(SHAPE, CFG, "sm_80", v) for v in space]
    assert len(set(built)) == len(built)


# -- the override grammar ----------------------------------------------------------------
def test_override_forms():
    o = tuner.parse_override("128,4", "INT4JIT_CONFIG")
    assert o == tuner.Override(LaunchConfig(128, 4))
    table = tuner.parse_override("4096:4096=128,4;*=256,2", "INT4JIT_CONFIG")
    assert table == {(4096, 4096): tuner.Override(LaunchConfig(128, 4)), "*": tuner.Override(LaunchConfig(256, 2))}
    o = tuner.parse_override("128,4,streaming=1,kcluster=2", "INT4JIT_CONFIG")
    assert o.config == LaunchConfig(128, 4) and dict(o.fields) == {"streaming": True, "kcluster": 2}
    v = o.variant(Variant(loads=8))  # the fields given replace the default's, the rest stay
    assert v == Variant(streaming=True, kcluster=2, loads=8)


@pytest.mark.parametrize("value,says", [("128", "'128'"), ("128,4,bogus=1", "bogus"),
                                        ("128,4,kcluster=3", "kcluster=3"), ("１２８,4", "１２８"),
                                        ("128,4;oops", "'128,4'"), ("128,4,streaming", "streaming"),
                                        ("128,4,loads=6", "loads=6"), ("100,4,loads=8", "(100, 4)")])
def test_malformed_override_names_the_variable(value, says, monkeypatch):
    with pytest.raises(ValueError) as info:
        tuner.parse_override(value, "INT4JIT_CONFIG")
    assert str(info.value).startswith("INT4JIT_CONFIG") and says in str(info.value)
    monkeypatch.setenv("MIGRAPHX_INT4_GEMV_CONFIG", value)  # the alias, read when planning
    with pytest.raises(ValueError, match="MIGRAPHX_INT4_GEMV_CONFIG"):
        plan.read_env()


@pytest.mark.parametrize("arch,kcluster", [("sm_90", 2), ("sm_80", 1)])
def test_override_variant_reaches_the_spec(arch, kcluster, monkeypatch):
    monkeypatch.setenv("INT4JIT_CONFIG", "4096:4096=256,2;*=128,4,streaming=1,kcluster=2")
    p = plan.plan(SHAPE, arch)
    assert p.tier == "override" and "entry *" in p.reason
    assert p.spec.config == CFG and p.spec.variant.streaming and p.spec.variant.kcluster == kcluster
    assert p.spec.label().startswith("128,4,streaming=1")
    p = plan.plan(GemvShape(4096, 4096, 128, False), arch)
    assert (p.tier, p.spec.config, p.spec.variant.kcluster) == ("override", LaunchConfig(256, 2), 1)
    p = plan.plan(SHAPE, arch, config="64,8,loads=8")  # gemv's config= beats the variable
    assert p.spec.config == LaunchConfig(64, 8) and p.spec.variant.loads == 8 and p.reason == "config= argument"


def test_prefetch_without_pdl_is_one_build_one_key():
    v = default_variant(SHAPE, "tc", CFG)
    a, b = _spec(pdl=False, variant=replace(v, prefetch=0)), _spec(pdl=False, variant=replace(v, prefetch=1))
    from int4jit import compiler
    assert compiler.render(a) == compiler.render(b)  # the same source ...
    assert a.key() == b.key()                         # ... so the same key


@pytest.mark.parametrize("shape,kernel", [
    (GemvShape(4096, 4096, 128, False), "tc"),
    (GemvShape(1024, 4096, 128, False), "simt"),                                  # few rows: simt
    (GemvShape(1024, 4096, 128, False, 1, "bfloat16"), "simt"),                   # one bf16 token: as fp16
    (GemvShape(4096, 4096, 32, False, 1, "float16", "bfloat16"), "tc"),           # bf16 scales
    (GemvShape(4096, 4096, 128, True, 8, "bfloat16"), "tc"),                      # D columns are tokens
    (GemvShape(4096, 4096, 256, False, 2), "tc"),
    (GemvShape(4096, 4096, 64, False, 2), "tc"),                                  # A scaled: no diagonal
    (GemvShape(4096, 4096, 128, False, 9), "tc_batch"),                           # past TC_MAX_TOKENS
])
def test_kernel_choice_by_tokens_dtype_and_group(shape, kernel):
    assert choose_kernel(shape, True) == kernel
    if shape.M > 1:
        with pytest.raises(NotImplementedError, match="sm_80"):
            choose_kernel(shape, False)
    else:  # one token, fp16 or bf16, runs everywhere (AMD included)
        assert choose_kernel(shape, False) == "simt"


@pytest.mark.parametrize("shape", [GemvShape(28672, 4096, 128, False, 1, "bfloat16"), GemvShape(28672, 4096, 128, False, 4)])
def test_raw_a_and_x_staging_are_one_tokens(shape):
    """raw_a's offsets and x in shared memory hold one token (fp16 or bf16): normalised away for
    several, so the build, its key and its x staging follow. The cluster K split serves any
    token count (block 0's shared memory holds every block's M x rows sums)."""
    s = make_spec(shape, "sm_90", "tc", CFG, Variant(streaming=True, raw_a=True, kcluster=2), pdl=True, sm_count=132)
    one = shape.M == 1
    assert (s.variant.raw_a, s.param("RAW_A")) == ((True, "true") if one else (False, "false"))
    assert s.param("XSMEM") == ("true" if one else "false")
    assert (s.variant.kcluster, s.param("KCLUSTER"), s.grid) == (2, 2, 2 * 28672 // s.rows_per_block)
    assert s.param("M") == shape.M and s.param("BF16") == ("true" if shape.dtype == "bfloat16" else "false")
    plain = make_spec(replace(shape, M=1, dtype="float16"), "sm_90", "tc", CFG, Variant(streaming=True, raw_a=True))
    assert plain.variant.raw_a and plain.key() != s.key()


@pytest.mark.parametrize("M,TN", [(1, 4), (8, 8), (8, 16)])
def test_cluster_sums_fit_shared_memory(M, TN):
    """With a cluster, block 0 keeps every block's M x rows sums beside its warps' partial sums:
    the K split leaves room for both under the static shared-memory limit."""
    from int4jit.spec import STATIC_SMEM_LIMIT
    s = make_spec(GemvShape(4096, 14336, 128, False, M), "sm_90", "tc", LaunchConfig(512, TN), Variant(kcluster=2))
    rows = s.rows_per_block
    assert 4 * M * rows * (s.param("KSPLIT") + 2) <= STATIC_SMEM_LIMIT
    assert s.param("KSPLIT") == min(16, STATIC_SMEM_LIMIT // (4 * M * rows) - 2)


@pytest.mark.parametrize("M", [1, 2, 8])
def test_xahead_is_several_tokens_and_searched_only_there(M):
    """Loading x a step ahead serves several tokens (one token stages x or reads it per step):
    for one token it normalises away (same build, same key) and the search does not list it."""
    shape = GemvShape(16384, 2048, 128, False, M)
    s = make_spec(shape, "sm_90", "tc", CFG, Variant(streaming=True, xahead=True))
    plain = make_spec(shape, "sm_90", "tc", CFG, Variant(streaming=True))
    assert (s.variant.xahead, s.param("XAHEAD")) == ((False, "false") if M == 1 else (True, "true"))
    assert (s.key() == plain.key()) == (M == 1)
    searched = {v.xahead for v in variant_space(shape, "tc", CFG, "sm_90", False)}
    assert searched == ({False} if M == 1 else {False, True})


def test_several_tokens_fit_their_sums_in_shared_memory():
    """KSPLIT x M x rows fp32 sums within the static limit: fewer warps split K at 8 tokens, TN=16."""
    s = make_spec(GemvShape(4096, 4096, 128, False, 8), "sm_90", "tc", LaunchConfig(512, 16))
    assert s.param("KSPLIT") * 8 * s.rows_per_block * 4 <= 48 << 10 and s.block == 32 * s.param("KSPLIT")
    assert make_spec(GemvShape(4096, 4096, 128, False), "sm_90", "tc", LaunchConfig(512, 16)).param("KSPLIT") == 16


@pytest.mark.parametrize("shape", [GemvShape(4096, 4096, 128, False), GemvShape(896, 4864, 32, True, 8, "bfloat16"),
                                   GemvShape(3001, 2080, 16, True, 16, "float16", "bfloat16"),
                                   GemvShape(128256, 4096, 256, False, 1, "bfloat16", "bfloat16")])
def test_a_shape_key_names_its_shape(shape):
    assert GemvShape.from_key(shape.key()) == shape


@pytest.mark.parametrize("key", ["4096x4096/g128", "4096x4096/g128/asym/m1", "4096x4096/g128/asym/float16",
                                 "4096x4096/g128/asym/bfloat16/m8", "4096x4096/g128/asym/fp8", "4096/g128/asym",
                                 "4096x4096/g128/asym/m8/m8", "4096x4096/128/asym", "4096x4096/g128/symmetric"])
def test_a_malformed_or_unwritten_key_is_refused(key):
    with pytest.raises(ValueError, match="bad shape key"):
        GemvShape.from_key(key)


def test_a_key_of_an_impossible_shape_says_why():
    with pytest.raises(ValueError, match="multiple of the group size"):
        GemvShape.from_key("4096x4000/g128/asym")


def test_gemm_rows_takes_192_row_tiles_where_they_make_a_wave():
    """192-row tiles (three warpgroups) where they divide N and make at least 3/4 of a wave of
    tiles, else 128; the only height that divides N either way; 0 where none does."""
    from int4jit.spec import gemm_row_tiles, gemm_rows, make_gemm_spec
    assert gemm_rows(6144, 512, 132) == 192 and gemm_rows(6144, 128, 132) == 128  # 128 tiles / 32
    assert gemm_rows(6144, 385, 132) == 192 and gemm_rows(6144, 384, 132) == 128  # 128 / 96: 3/4 of 132 is 99
    assert gemm_rows(128256, 1, 132) == 192 and gemm_rows(4096, 4096, 132) == 128  # 4096 % 192 != 0
    assert gemm_rows(576, 1, 132) == 192 and gemm_row_tiles(576) == (192,) and gemm_rows(200, 512, 132) == 0
    spec = make_gemm_spec(GemvShape(6144, 4096, 128, False), "sm_90", 132, 192)
    assert (spec.block, spec.rows_per_block, spec.param("WGS")) == (384, 192, 3) and "bs384" in spec.name
    assert spec.key() != make_gemm_spec(GemvShape(6144, 4096, 128, False), "sm_90", 132, 128).key()


def test_gemm_specs_say_what_they_cannot_serve():
    """The prefill GEMM is Hopper's and takes whole 128- or 192-row tiles, K % 128 and groups of 32 or
    more; anything else is a NotImplementedError naming the limit (Int4Linear then dequantises)."""
    from int4jit.spec import gemm_unsupported, make_gemm_spec, make_xperm_spec
    ok = GemvShape(14336, 4096, 128, False, dtype="bfloat16")
    assert gemm_unsupported(ok, "sm_90") is None
    g, x = make_gemm_spec(ok, "sm_90", 132, 128), make_xperm_spec(ok, "sm_90", 132)
    assert g.arch == x.arch == "sm_90a" and g.grid == 132 and g.block == 256
    assert g.smem > 48 * 1024 and g.canonical()["smem"] == g.smem and "smem" not in x.canonical()
    assert g.param("BF16") == "true" and g.shape.M == 1
    assert make_gemm_spec(replace(ok, dtype="float16"), "sm_90", 132, 128).key() != g.key()
    with pytest.raises(ValueError, match="tiles of 192 rows for N=14336: expected one of \\(128,\\)"):
        make_gemm_spec(ok, "sm_90", 132, 192)
    for shape, arch, said in ((ok, "sm_80", "needs Hopper"), (GemvShape(200, 4096, 128, False), "sm_90", "N=200"),
                              (GemvShape(256, 4160, 32, False), "sm_90", "K=4160"),
                              (GemvShape(256, 4096, 16, False), "sm_90", "group=16"), (ok, "gfx90a", "needs Hopper")):
        assert said in gemm_unsupported(shape, arch)
        for make in (partial(make_gemm_spec, rows=128), make_xperm_spec):
            with pytest.raises(NotImplementedError, match=said):
                make(shape, arch, 132)
