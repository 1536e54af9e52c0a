"""Rendering: every grid point, every group, both vendors; derived geometry invariants."""
import re

import pytest

from int4jit import compiler
from int4jit.shapes import SUPPORTED_GROUPS, GemvShape, LaunchConfig, candidate_grid

ARCHS = ["sm_80", "sm_90", "gfx90a", "gfx1030", "gfx900", "gfx1151"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cfg", candidate_grid(True), ids=str)
@pytest.mark.parametrize("kernel", ["auto", "mma", "tc"])
def test_every_grid_point_renders_completely(arch, cfg, kernel, monkeypatch):
    monkeypatch.setenv("INT4JIT_KERNEL", kernel)
    shape = GemvShape(4096, 4096, 128, False)
    name, src = compiler.render_gemv_source(shape, cfg, arch)
    assert "${" not in src and "$" not in src
    template = compiler.template_for(shape, arch)
    assert template == (("gemv_tc.hip" if kernel != "mma" else "gemv_mma.hip") if arch.startswith("sm_") else "gemv.hip")
    if template == "gemv_mma.hip":
        assert f"constexpr int WARPS = {cfg.BS // 32};" in src and f"constexpr int TW = {cfg.TN // 2};" in src
    elif template == "gemv_tc.hip":  # 32 steps of 128 elements: every BS/32 fits
        assert f"constexpr int KSPLIT = {cfg.BS // 32};" in src and f"constexpr int TW = {cfg.TN // 2};" in src
    else:
        assert f"constexpr int BS = {cfg.BS};" in src and f"constexpr int TN = {cfg.TN};" in src
    assert f"{compiler.kernel_name(shape, cfg)}(" in src
    assert name.endswith(f"_{arch}.hip")


@pytest.mark.parametrize("arch,warp,dot2", [("sm_90", 32, None), ("gfx90a", 64, 1), ("gfx1030", 32, 1),
                                            ("gfx900", 64, 0), ("gfx1010", 32, 0), ("gfx942", 64, 1)])
def test_vendor_prelude(arch, warp, dot2):
    _, src = compiler.render_gemv_source(GemvShape(64, 256, 32, True), LaunchConfig(64, 2), arch)
    if arch.startswith("sm_"):
        assert "#define I4_WARP 32" in src and "asm(" in src and "__builtin_amdgcn" not in src
    else:
        assert f"#define I4_WARP {warp}" in src and f"#define I4_HAS_DOT2 {dot2}" in src


def test_specialisation_changes_source():
    base = GemvShape(4096, 4096, 128, False)
    srcs = {compiler.render_gemv_source(s, LaunchConfig(128, 4), "sm_90")[1]
            for s in [base, GemvShape(4096, 4096, 64, False), GemvShape(4096, 4096, 128, True),
                      GemvShape(4095, 4096, 128, False), GemvShape(4096, 4224, 128, False)]}
    assert len(srcs) == 5


@pytest.mark.parametrize("N", [1, 7, 896, 4097, 11008])
@pytest.mark.parametrize("K", [16, 48, 896, 4096, 14336])
@pytest.mark.parametrize("cfg", candidate_grid(True), ids=str)
def test_geometry_covers_every_row_and_chunk(N, K, cfg):
    shape = GemvShape(N, K, 16, False)
    geo = compiler.kernel_geometry(shape, cfg, "gfx90a")
    assert geo.template == "gemv.hip" and not geo.persistent
    vec, kt = geo.param("VEC"), geo.param("KT")
    assert vec == (16 if K % 32 == 0 else 8)
    assert cfg.BS % kt == 0 and kt & (kt - 1) == 0
    assert geo.grid * geo.rows_per_block >= N > (geo.grid - 1) * geo.rows_per_block
    chunks = K // (2 * vec)
    assert kt < 2 * chunks or kt == 1  # no more than half the K lanes idle
    assert geo.block == cfg.BS


@pytest.mark.parametrize("N", [1, 7, 896, 4097, 11008])
@pytest.mark.parametrize("K", [32, 96, 896, 4096, 14336])
@pytest.mark.parametrize("cfg", candidate_grid(True), ids=str)
def test_tensor_core_geometry_covers_every_row_and_step(N, K, cfg, monkeypatch):
    monkeypatch.setenv("INT4JIT_KERNEL", "mma")
    shape = GemvShape(N, K, 32, False)
    geo = compiler.kernel_geometry(shape, cfg, "sm_90")
    assert geo.template == "gemv_mma.hip" and geo.persistent and geo.block == cfg.BS
    warps, ksplit, tw = geo.param("WARPS"), geo.param("KSPLIT"), geo.param("TW")
    assert warps * 32 == cfg.BS and warps % ksplit == 0 and 2 * tw == cfg.TN
    assert geo.rows_per_block == (warps // ksplit) * 16 * tw
    assert geo.grid * geo.rows_per_block >= N > (geo.grid - 1) * geo.rows_per_block
    steps = -(-K // 128)
    assert ksplit & (ksplit - 1) == 0 and ksplit <= steps  # every warp has a step
    tiles = -(-N // (16 * tw))
    # K is split only while the launch is short of warps, and as far as the block allows
    assert ksplit == 1 or tiles * ksplit // 2 < compiler.MMA_TARGET_WARPS
    assert tiles * ksplit >= compiler.MMA_TARGET_WARPS or 2 * ksplit > min(warps, steps)
    assert 1 <= geo.param("UNROLL") <= max(1, 4 // tw)
    assert 0.25 <= geo.k_efficiency <= 1


@pytest.mark.parametrize("arch,K,group,template", [
    ("sm_90", 4096, 128, "gemv_mma.hip"), ("sm_80", 896, 32, "gemv_mma.hip"),
    ("sm_75", 4096, 128, "gemv.hip"),          # no m16n8k16 f16 step before sm_80
    ("sm_90", 4112, 16, "gemv.hip"),           # K % 32 != 0: 8-byte loads
    ("sm_90", 65536, 128, "gemv.hip"),         # x does not fit in shared memory
    ("gfx90a", 4096, 128, "gemv.hip")])
def test_template_choice(arch, K, group, template, monkeypatch):
    assert compiler.kernel_geometry(GemvShape(64, K, group, False), LaunchConfig(128, 4), arch).template == "gemv.hip"
    monkeypatch.setenv("INT4JIT_KERNEL", "mma")  # the default is gemv.hip; where can mma run?
    geo = compiler.kernel_geometry(GemvShape(64, K, group, False), LaunchConfig(128, 4), arch)
    assert geo.template == template
    _, src = compiler.render_gemv_source(GemvShape(64, K, group, False), LaunchConfig(128, 4), arch)
    body = src.split("__global__", 1)[1]
    assert ("mma_16816(d," in body) == (template == "gemv_mma.hip")


def test_every_group_renders():
    for g in SUPPORTED_GROUPS:
        _, src = compiler.render_gemv_source(GemvShape(32, 512, g, False), LaunchConfig(64, 4), "gfx90a")
        assert re.search(rf"constexpr int GROUP = {g};", src)


def test_template_hash_is_stable_and_short():
    assert compiler.template_hash() == compiler.template_hash()
    assert re.fullmatch(r"[0-9a-f]{16}", compiler.template_hash())


def test_kernel_choice_from_the_environment(monkeypatch):
    shape, cfg = GemvShape(4096, 4096, 128, False), LaunchConfig(256, 2)
    monkeypatch.setenv("INT4JIT_KERNEL", "simt")
    assert compiler.kernel_geometry(shape, cfg, "sm_90").template == "gemv.hip"
    monkeypatch.setenv("INT4JIT_KERNEL", "MMA")
    assert compiler.kernel_geometry(shape, cfg, "sm_90").template == "gemv_mma.hip"
    assert compiler.kernel_geometry(shape, cfg, "gfx90a").template == "gemv.hip"  # where it cannot run
    monkeypatch.setenv("INT4JIT_KERNEL", "tc")
    assert compiler.kernel_geometry(shape, cfg, "sm_90").template == "gemv_tc.hip"
    assert compiler.kernel_geometry(GemvShape(4096, 4112, 16, False), cfg, "sm_90").template == "gemv.hip"  # K % 32
    monkeypatch.setenv("INT4JIT_KERNEL", "tensor")
    with pytest.raises(ValueError, match="INT4JIT_KERNEL='tensor': expected one of auto, tc, mma, simt"):
        compiler.kernel_geometry(shape, cfg, "sm_90")


@pytest.mark.parametrize("N,K,arch,template", [
    (4096, 4096, "sm_90", "gemv_tc.hip"), (2048, 896, "sm_80", "gemv_tc.hip"),
    (2047, 4096, "sm_90", "gemv.hip"),    # fewer rows than TC_MIN_ROWS: gemv.hip keeps the SMs busy
    (4096, 4112, "sm_90", "gemv.hip"),    # K % 32 != 0
    (4096, 4096, "sm_75", "gemv.hip"),    # no m16n8k16 f16 step
    (4096, 4096, "gfx90a", "gemv.hip")])
def test_default_kernel_choice(N, K, arch, template, monkeypatch):
    monkeypatch.delenv("INT4JIT_KERNEL", raising=False)
    assert compiler.template_for(GemvShape(N, K, 16, False), arch) == template


@pytest.mark.parametrize("group,contiguous", [(16, True), (32, True), (64, True), (128, False), (256, False)])
def test_tc_geometry(group, contiguous):
    """Warps never outnumber the 128-element steps; groups under 128 walk K in contiguous ranges."""
    shape = GemvShape(4096, 1792 if group == 256 else 896, group, False)  # 14 or 7 steps
    geo = compiler._tc_geometry(shape, LaunchConfig(512, 4))
    steps = shape.K // 128
    assert geo.template == "gemv_tc.hip" and geo.param("KSPLIT") == min(16, steps) and geo.block == 32 * min(16, steps)
    assert geo.param("TW") == 2 and geo.rows_per_block == 32 and geo.grid == 128
    assert geo.param("CONTIG") == ("true" if contiguous else "false")
    assert geo.param("UNROLL") * 2 * geo.param("TW") == compiler.TC_LOADS_IN_FLIGHT


@pytest.mark.parametrize("N,K,group,streams,xsmem", [
    (28672, 4096, 128, True, True), (4096, 14336, 256, True, True),
    (4096, 28672, 128, True, False),   # x (56 KB) does not fit static shared memory: streams without it
    (4096, 4096, 128, False, False),   # under TC_STREAM_MIN_WEIGHTS
    (28672, 4096, 64, False, False)])  # groups under 128: the plain kernel measured faster
def test_tc_streaming_rule(N, K, group, streams, xsmem):
    """Large g >= 128 shapes stream (ROLL + L2HINT), with x in shared memory where it fits."""
    shape = GemvShape(N, K, group, False)
    geo = compiler._tc_geometry(shape, LaunchConfig(512, 2))
    assert compiler.tc_streams(shape) is streams
    assert geo.param("ROLL") == ("true" if streams else "false") and geo.param("L2HINT") == int(streams)
    assert geo.param("XSMEM") == ("true" if xsmem else "false")
    if xsmem:  # x and the K-split partial sums fit the static limit
        assert 2 * K + 4 * geo.param("KSPLIT") * geo.rows_per_block <= compiler.STATIC_SMEM_LIMIT


def _variant_build(monkeypatch, shape, cfg, arch="sm_90", **variant):
    """(geometry, source name, source) of gemv_tc.hip with _tc_geometry keywords (an A/B
    variant), as compiler.render_gemv_source makes it; NVRTC must be there."""
    import functools
    from conftest import require_compiler
    require_compiler("cuda")
    real = getattr(compiler._tc_geometry, "func", compiler._tc_geometry)
    monkeypatch.setattr(compiler, "_tc_geometry", functools.partial(real, **variant))
    return (compiler.kernel_geometry(shape, cfg, arch), *compiler.render_gemv_source(shape, cfg, arch))


def _nvrtc(name, source, arch="sm_90") -> bytes:
    from int4jit.backends import cuda
    return cuda.compile_source(source, name, arch, compiler.COMPILE_OPTIONS["cuda"])


@pytest.mark.parametrize("N,K,group,stream", [(8200, 4224, 128, True), (4100, 4160, 32, False)])
def test_tc_streaming_source_compiles(N, K, group, stream):
    """Both schedules of gemv_tc.hip render as the rule says and compile with NVRTC, on a
    partial last row block (and K % 128 != 0 for the plain one)."""
    from conftest import require_compiler
    require_compiler("cuda")
    shape, cfg = GemvShape(N, K, group, False), LaunchConfig(256, 4)
    assert compiler.tc_streams(shape) is stream
    name, source = compiler.render_gemv_source(shape, cfg, "sm_90")
    flag = "true" if stream else "false"
    assert f"constexpr bool ROLL = {flag};" in source and f"constexpr bool XSMEM = {flag};" in source
    assert _nvrtc(name, source)[:4] == b"\x7fELF"


@pytest.mark.parametrize("N,K,group,cfg,raw,xwarp", [
    (28672, 4096, 128, LaunchConfig(128, 4), True, False),    # streamed, two tiles a warp
    (28672, 4096, 128, LaunchConfig(128, 8), True, False),
    (4096, 14336, 128, LaunchConfig(512, 2), False, True),    # one tile a warp: x staged per warp
    (5120, 17920, 128, LaunchConfig(256, 2), False, True),
    (4096, 4096, 128, LaunchConfig(128, 4), False, False),    # not streamed
    (28672, 4096, 32, LaunchConfig(128, 4), False, False)])   # g < 128: measured slower
def test_tc_raw_a_and_xwarp_rule(N, K, group, cfg, raw, xwarp):
    """Streamed builds with two or more tiles a warp take RAW_A (offsets after the mma) with
    pre-paired x; streamed one-tile builds stage x per warp (XWARP), pre-paired too; neither is
    on elsewhere. The source says so."""
    shape = GemvShape(N, K, group, False)
    geo = compiler._tc_geometry(shape, cfg)
    b = lambda v: "true" if v else "false"
    assert (geo.param("RAW_A"), geo.param("XWARP"), geo.param("XPERM")) == (b(raw), b(xwarp), b(raw or xwarp))
    _, source = compiler.render_gemv_source(shape, cfg, "sm_90")
    assert f"constexpr bool RAW_A = {b(raw)};" in source
    assert f"constexpr bool XWARP = XSMEM && {b(xwarp)};" in source
    assert f"constexpr bool XPERM = XSMEM && {b(raw or xwarp)};" in source


@pytest.mark.parametrize("N,K,group,sym", [(8200, 4224, 128, False), (8200, 4096, 128, True), (1000, 2080, 16, False),
                                           (1001, 4160, 32, True), (333, 4864, 64, False)])
def test_tc_raw_a_compiles_for_every_group(N, K, group, sym, monkeypatch):
    """RAW_A forced on (with and without pre-paired x) compiles for every group class, tails and
    partial steps included: the switch is correct C++ wherever the A/B may turn it on."""
    monkeypatch.setenv("INT4JIT_KERNEL", "tc")
    shape, cfg = GemvShape(N, K, group, sym), LaunchConfig(256, 4)
    for xperm in (False, True):
        _, name, source = _variant_build(monkeypatch, shape, cfg, raw_a=True, xperm=xperm, stream=True)
        assert "constexpr bool RAW_A = true;" in source
        assert _nvrtc(name, source)[:4] == b"\x7fELF"


def test_tc_xwarp_needs_paired_streamed_x():
    """XWARP stages x through registers already paired, on streamed builds only: asking for it
    otherwise is refused by the geometry, not compiled into a kernel that would not stage x."""
    shape = GemvShape(4096, 14336, 128, False)
    with pytest.raises(ValueError, match="xwarp"):
        compiler._tc_geometry(shape, LaunchConfig(512, 2), xwarp=True, xperm=False)
    with pytest.raises(ValueError, match="xwarp"):
        compiler._tc_geometry(shape, LaunchConfig(512, 2), xwarp=True, stream=False)


@pytest.mark.parametrize("group", [16, 32, 64])
def test_tc_wide_scales_compile_and_change_the_build(group, monkeypatch):
    """On the diagonal with whole steps a lane's two chunks' scales of a row come in one load
    (8 bytes at g16, 4 at g32, one value for both at g64): each form compiles with NVRTC and
    the build differs from the per-chunk loads it replaces."""
    shape, cfg = GemvShape(4096, 4096, group, False), LaunchConfig(128, 4)
    binaries = []
    for wide in (True, False):
        geo, name, source = _variant_build(monkeypatch, shape, cfg, wide_scales=wide)
        assert geo.param("WIDE_SCALES") == ("true" if wide else "false")
        binaries.append(_nvrtc(name, source))
    assert all(b[:4] == b"\x7fELF" for b in binaries) and binaries[0] != binaries[1]


@pytest.mark.parametrize("N,K,cfg,ksplit,grid", [
    (5120, 17920, LaunchConfig(256, 2), 8, 640),   # 8 warps a block, two blocks a row block
    (4097, 4096, LaunchConfig(32, 2), 1, 2 * 257),  # one warp a block: the cluster still splits K
    (2048, 256, LaunchConfig(512, 2), 1, 256),      # two steps: one each
    (2048, 128, LaunchConfig(512, 2), 1, 128)])     # one step: no split (KCLUSTER 1)
def test_tc_kcluster_geometry(N, K, cfg, ksplit, grid):
    """kcluster=2 (opt-in): two blocks of a cluster share a row block's K, so the grid doubles
    and together the blocks' warps are no more than K's steps."""
    geo = compiler._tc_geometry(GemvShape(N, K, 128, False), cfg, kcluster=2)
    kc = 2 if K >= 256 else 1
    assert geo.param("KCLUSTER") == kc and geo.param("KSPLIT") == ksplit and geo.grid == grid
    assert geo.block == 32 * ksplit and ksplit * kc <= -(-K // 128)


def test_tc_kcluster_compiles_for_sm_90_only(monkeypatch):
    """The cluster build compiles with NVRTC for sm_90 (cluster dims in the binary's kernel);
    for sm_80 the template refuses it with a message that says why."""
    from int4jit.errors import CompileError
    shape, cfg = GemvShape(4097, 17920, 32, False), LaunchConfig(128, 4)
    _, name, source = _variant_build(monkeypatch, shape, cfg, kcluster=2)
    assert "constexpr int KC = 2;" in source and "__cluster_dims__" in source
    assert _nvrtc(name, source)[:4] == b"\x7fELF"
    _, name, source = _variant_build(monkeypatch, shape, cfg, "sm_80", kcluster=2)
    with pytest.raises(CompileError, match="cluster needs sm_90"):
        _nvrtc(name, source, "sm_80")


@pytest.mark.parametrize("N,cfg,blocks", [(28672, LaunchConfig(128, 4), 7),   # 896 blocks
                                          (28672, LaunchConfig(128, 8), 4),   # 448
                                          (2048, LaunchConfig(512, 2), 1)])   # 128
def test_tc_one_wave_register_cap(N, cfg, blocks, monkeypatch):
    """one_wave_sms=132 (opt-in) asks ptxas for as many blocks a SM as a one-wave grid on 132
    SMs needs: __launch_bounds__(BS, blocks) in the source, which compiles."""
    geo, name, source = _variant_build(monkeypatch, GemvShape(N, 4096, 32, False), cfg, one_wave_sms=132)
    assert geo.param("MIN_BLOCKS") == blocks and f"__launch_bounds__(BS, {blocks})" in source
    assert _nvrtc(name, source)[:4] == b"\x7fELF"
