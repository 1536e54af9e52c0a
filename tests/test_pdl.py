"""Programmatic dependent launch (issue 17 item 4): every shipped template, as NVRTC compiles it
for sm_90, waits for the previous grid (griddepcontrol.wait) before any instruction that reads or
writes global memory; only L2 prefetches (which return no data) may come before the wait. Read
from the PTX of the same source compiler.render(spec) gives, so no GPU is needed."""
import re

import pytest

from int4jit import compiler
from int4jit.shapes import GemvShape, LaunchConfig
from int4jit.spec import TEMPLATE_OF, Variant, make_dequant_spec, make_spec

from conftest import require_compiler

OPTIONS = ("-std=c++17", "-default-device")


def ptx(spec, arch=None) -> str:
    """The PTX NVRTC makes of the spec's rendered source."""
    require_compiler("cuda")
    from cuda.bindings import nvrtc
    arch = arch or spec.arch
    name, source = compiler.render(spec)
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    assert int(err) == 0, err
    try:
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in OPTIONS)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            pytest.fail(f"{name} does not compile for {arch}: {log.decode(errors='replace')[:2000]}")
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        assert int(err) == 0, err
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(prog, buf)
        assert int(err) == 0, err
        return buf.rstrip(b"\0 ").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def instructions(text: str) -> list[str]:
    """The kernel's instructions in order (the mnemonic and operands, predicate dropped)."""
    body = text[text.index(".entry"):]
    out = []
    for line in body.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".", "$", "{", "}", ")", "(")):
            continue
        out.append(unpredicated(s))
    return out


def unpredicated(line: str) -> str:
    """A PTX instruction without its guard predicate (`@%p1 `, `@!%p1 `)."""
    return re.sub(r"^@!?%\w+\s+", "", line)


def before_wait(text: str) -> list[str]:
    """The instructions some path from the kernel's entry runs before a griddepcontrol.wait, as
    instructions() gives them: a walk over the PTX's basic blocks, since the compiler may lay a
    loop's last block (a store after the wait) out before the wait."""
    blocks, cur = {"": []}, ""
    for line in text[text.index(".entry"):].splitlines():
        s = line.strip()
        label = re.fullmatch(r"([\w$]+):", s)
        if label:
            cur = label.group(1)
            blocks[cur] = []
        elif s and not s.startswith(("//", ".", "{", "}", ")", "(")):
            blocks[cur].append(s)
    order = list(blocks)
    seen, todo, out = set(), [""], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for s in blocks[name]:
            op = unpredicated(s)
            if op.startswith("griddepcontrol.wait"):
                break
            out.append(op)
            mnemonic = op.split()[0]
            if mnemonic in ("bra", "bra.uni"):
                todo.append(op.split()[1].rstrip(";"))
            if s == op and mnemonic in ("bra", "bra.uni", "ret;", "ret", "exit;", "exit"):
                break  # unconditional: no fall-through
        else:
            if order.index(name) + 1 < len(order):
                todo.append(order[order.index(name) + 1])
    return out


def test_before_wait_follows_branches_not_the_layout():
    """A loop's store laid out before the wait but reached only after it is not counted; a load
    laid out after the wait but reached by a branch around it is."""
    text = """.entry k(
    )
    {
    	mov.u32 	%r1, 0;
    	bra.uni 	$L__BB0_2;
    $L__BB0_1:
    	st.global.u16 	[%rd1], %rs1;
    $L__BB0_2:
    	@%p1 bra 	$L__BB0_4;
    	griddepcontrol.wait;
    	bra.uni 	$L__BB0_1;
    $L__BB0_4:
    	ld.global.u32 	%r2, [%rd2];
    	ret;
    }"""
    assert before_wait(text) == ["mov.u32 \t%r1, 0;", "bra.uni \t$L__BB0_2;", "bra \t$L__BB0_4;",
                                 "ld.global.u32 \t%r2, [%rd2];", "ret;"]


_SAFE_SPACES = ("param", "local", "shared", "const")
_TOUCHES_MEMORY = {"ldu", "atom", "red", "cp", "tex", "tld4", "suld", "sust", "sured", "call", "multimem",
                   "discard", "applypriority", "mbarrier", "cp.async", "bulk"}


def reaches_global_memory(instr: str) -> bool:
    """Whether an instruction may read or write memory another kernel writes or reads: global
    (or generic) loads, stores, atomics, async copies, calls. prefetch.global is a hint."""
    parts = instr.split()[0].rstrip(";").split(".")
    op = parts[0]
    if op in ("ld", "st"):
        return not any(p.startswith(_SAFE_SPACES) for p in parts[1:])
    return op in _TOUCHES_MEMORY


def check_waits_before_memory(spec):
    code = ptx(spec)
    ins = instructions(code)
    waits = [i for i, s in enumerate(ins) if s.startswith("griddepcontrol.wait")]
    assert waits, f"{spec.name}: no griddepcontrol.wait"
    before = before_wait(code)
    bad = [s for s in before if reaches_global_memory(s)]
    assert not bad, f"{spec.name} ({spec.label()}): before griddepcontrol.wait: {bad[:5]}"
    assert not [s for s in before if re.search(r"\bld\.global|cp\.async", s)]
    assert not [s for s in before if s.startswith("prefetch") and not s.startswith("prefetch.global")]
    launches = [i for i, s in enumerate(ins) if s.startswith("griddepcontrol.launch_dependents")]
    assert len(launches) == 1, f"{spec.name}: griddepcontrol.launch_dependents {len(launches)} times"
    return before


SHAPE = GemvShape(28672, 4096, 128, False)  # streams by default
SPECS = [
    ("simt", GemvShape(4096, 4096, 128, False), LaunchConfig(128, 4), None),
    ("simt", GemvShape(7, 48, 16, True), LaunchConfig(64, 8), None),               # 8-byte loads, one row block
    ("simt", GemvShape(4097, 4160, 64, False), LaunchConfig(256, 2), None),        # odd N tail
    ("tc", GemvShape(4096, 4096, 128, False), LaunchConfig(128, 4), None),         # the plain schedule
    ("tc", SHAPE, LaunchConfig(128, 4), Variant(streaming=True, raw_a=True, prefetch=0)),
    ("tc", SHAPE, LaunchConfig(128, 4), Variant(streaming=True, raw_a=True, prefetch=1)),
    ("tc", SHAPE, LaunchConfig(128, 4), Variant(streaming=True, raw_a=True, prefetch=2)),
    ("tc", GemvShape(4096, 14336, 128, True), LaunchConfig(512, 2), Variant(streaming=True)),  # x staged per warp
    ("tc", GemvShape(4096, 28672, 128, False), LaunchConfig(256, 4), Variant(streaming=True)),  # x not in smem
    ("tc", GemvShape(4097, 17920, 32, False), LaunchConfig(128, 4), Variant(kcluster=2, prefetch=2)),
    ("tc", GemvShape(4100, 4160, 32, True), LaunchConfig(256, 4), None),          # K % 128 != 0, g32 sym
    ("tc", GemvShape(2048, 4096, 16, False), LaunchConfig(64, 8), Variant(one_wave=True, loads=8)),
    ("tc", GemvShape(4096, 4096, 128, False, 8), LaunchConfig(128, 4), None),                       # 8 tokens
    ("tc", GemvShape(28672, 4096, 128, True, 3, "bfloat16"), LaunchConfig(256, 4), Variant(streaming=True, prefetch=1)),
    ("tc", GemvShape(4097, 4160, 32, False, 1, "bfloat16", "bfloat16"), LaunchConfig(128, 4), Variant(kcluster=2)),
    ("tc", GemvShape(4096, 4160, 32, False, 8), LaunchConfig(128, 4), None),                        # scaled A, partial step
    ("tc_batch", GemvShape(4096, 4096, 32, False, 12), LaunchConfig(128, 4), None),                 # 12 tokens
    ("tc_batch", GemvShape(4097, 4160, 16, True, 16, "bfloat16", "bfloat16"), LaunchConfig(512, 2), None),
]


DEQUANT = [(GemvShape(4096, 4096, 128, False), "float16"), (GemvShape(4097, 4160, 32, True), "bfloat16")]


# The prefill GEMM and its x layout kernel: tested below as a pair.
PREFILL = ("gemm", "xperm")


def test_every_shipped_template_is_covered():
    assert {k for k, *_ in SPECS} | {"dequant", *PREFILL} == set(TEMPLATE_OF)


def gemm_reads_before_wait(spec) -> set:
    """What the GEMM reads or writes in global memory, other than its weights (16-byte no_allocate
    loads), scales and zero points (narrower), on some path before griddepcontrol.wait."""
    before = [s.split()[0] for s in before_wait(ptx(spec)) if reaches_global_memory(s)]
    assert any(op.startswith("ld.global.nc.L1::no_allocate") and op.endswith(".v4.u32") for op in before), \
        "no weight load before the wait"
    return {op for op in before if not re.fullmatch(r"ld\.global\.nc(\.L1::no_allocate\.v4\.u32|\.u8|\.u16)", op)
            and not op.startswith("mbarrier.init.shared")}


@pytest.mark.parametrize("dtype,symmetric", [("float16", False), ("bfloat16", True)])
def test_the_prefill_gemm_loads_only_weights_before_waiting_for_the_x_layout(dtype, symmetric):
    """The x layout kernel runs stream-ordered and lets the GEMM launch at its start; the GEMM
    (PDL) reads only its fixed weights, scales and zero points before griddepcontrol.wait: x' and
    the flags (the layout kernel's writes), the partial sums and every store come after it."""
    from int4jit.spec import make_gemm_spec, make_xperm_spec
    shape = GemvShape(14336, 4096, 128, symmetric, dtype=dtype)
    gemm, xperm = make_gemm_spec(shape, "sm_90", 132, 128), make_xperm_spec(shape, "sm_90", 132)
    assert gemm.pdl and not xperm.pdl
    assert not make_gemm_spec(shape, "sm_90", 132, 128, pdl=False).pdl
    lay = instructions(ptx(xperm))
    first_memory = next(i for i, s in enumerate(lay) if reaches_global_memory(s))
    launches = [i for i, s in enumerate(lay) if s.startswith("griddepcontrol.launch_dependents")]
    assert launches == [launches[0]] and launches[0] < first_memory
    ins = instructions(ptx(gemm))
    waits = [i for i, s in enumerate(ins) if s.startswith("griddepcontrol.wait")]
    assert len(waits) == 1, f"griddepcontrol.wait {len(waits)} times"
    assert not gemm_reads_before_wait(gemm)
    assert any(s.startswith("cp.async.bulk") for s in ins) and any(s.startswith("st.global") for s in ins)


def test_the_check_catches_a_bulk_copy_of_x_before_the_gemm_waits(monkeypatch):
    from int4jit.spec import make_gemm_spec
    real = compiler.render

    def early_copy(s):
        name, src = real(s)
        assert src.count("I4_GRID_WAIT();") == 1
        return name, src.replace("I4_GRID_WAIT();", "if (tid == 0) fill(sb); I4_GRID_WAIT();")
    monkeypatch.setattr(compiler, "render", early_copy)
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in \
        gemm_reads_before_wait(make_gemm_spec(GemvShape(4096, 4096, 128, False), "sm_90", 132, 128))


@pytest.mark.parametrize("shape,out", DEQUANT, ids=[f"{s.key()}-{o}" for s, o in DEQUANT])
def test_dequant_waits_for_the_previous_grid_before_touching_memory(shape, out):
    before = check_waits_before_memory(make_dequant_spec(shape, "sm_90", out))
    assert not [s for s in before if s.startswith("prefetch")]


@pytest.mark.parametrize("kernel,shape,cfg,variant", SPECS,
                         ids=[f"{k}-{s.key()}-{c}" + (f"-{v.text()}" if v else "") for k, s, c, v in SPECS])
def test_waits_for_the_previous_grid_before_touching_memory(kernel, shape, cfg, variant):
    spec = make_spec(shape, "sm_90", kernel, cfg, variant, pdl=True, sm_count=132)
    before = check_waits_before_memory(spec)
    prefetches = [s for s in before if s.startswith("prefetch.global")]
    if kernel == "tc" and spec.variant.prefetch:  # the weights asked into L2 while the previous kernel drains
        assert prefetches, f"{spec.label()}: PREFETCH={spec.param('PREFETCH')} but no prefetch before the wait"
    else:
        assert not prefetches


def test_the_check_catches_a_load_before_the_wait(monkeypatch):
    """The negative case: a template that reads x before waiting fails the check."""
    spec = make_spec(GemvShape(4096, 4096, 128, False), "sm_90", "simt", LaunchConfig(128, 4), pdl=True)
    real = compiler.render

    def early_read(s):
        name, src = real(s)
        src = src.replace("I4_GRID_WAIT();", "y[0] = x[threadIdx.x]; I4_GRID_WAIT();", 1)
        return name, src
    monkeypatch.setattr(compiler, "render", early_read)
    with pytest.raises(AssertionError, match="before griddepcontrol.wait"):
        check_waits_before_memory(spec)


@pytest.mark.parametrize("kernel", ["simt", "tc"])
def test_no_grid_dependency_control_before_sm_90(kernel):
    spec = make_spec(GemvShape(4096, 4096, 128, False), "sm_80", kernel, LaunchConfig(128, 4), pdl=False)
    assert not spec.pdl and "griddepcontrol" not in ptx(spec)


EARLY = [(GemvShape(4096, 4096, 128, False), LaunchConfig(512, 2)),          # x staged per warp
         (GemvShape(4096, 14336, 32, True), LaunchConfig(512, 4)),           # the diagonal, paired scales
         (GemvShape(4096, 28672, 128, False), LaunchConfig(256, 4)),         # x read per step
         (GemvShape(28672, 4096, 128, False, 4, "bfloat16"), LaunchConfig(128, 4))]


@pytest.mark.parametrize("shape,cfg", EARLY, ids=[f"{s.key()}-{c}" for s, c in EARLY])
def test_early_variant_reads_only_weights_before_the_wait(shape, cfg):
    """early=1: the next kernel may launch at the start, and before the wait the kernel reads only
    what no predecessor in a chain writes -- weights (16-byte no_allocate loads), scales and zero
    points (narrower loads); x (16-byte loads from L2, never the non-coherent path) and every
    store come after it."""
    spec = make_spec(shape, "sm_90", "tc", cfg, Variant(early=True), pdl=True, sm_count=132)
    assert spec.variant.streaming and spec.param("EARLY") == "true"
    ins = instructions(ptx(spec))
    wait = next(i for i, s in enumerate(ins) if s.startswith("griddepcontrol.wait"))
    launches = [i for i, s in enumerate(ins) if s.startswith("griddepcontrol.launch_dependents")]
    assert len(launches) == 1 and launches[0] < wait
    before = [s.split()[0] for s in ins[:wait] if reaches_global_memory(s)]
    weights = [op for op in before if op.startswith("ld.global.nc.L1::no_allocate") and op.endswith(".v4.u32")]
    assert weights, "no weight load before the wait"
    others = [op for op in before if op not in weights]
    assert all(re.fullmatch(r"ld\.global\.nc\.(u8|u16|u32|v2\.u32)", op) for op in others), others
    assert any(s.split()[0] == "ld.global.cg.v4.u32" for s in ins[wait:]), "x is read coherently after the wait"
    # x never through the read-only path: an older kernel's lines of the buffer may be in L1
    assert not any(s.split()[0] == "ld.global.nc.v4.u32" for s in ins), "x read through the non-coherent path"


def test_early_is_built_only_with_pdl_on_sm_90():
    shape = GemvShape(4096, 4096, 128, False)
    assert make_spec(shape, "sm_90", "tc", LaunchConfig(512, 2), Variant(early=True), pdl=False).param("EARLY") == "false"
    assert make_spec(shape, "sm_80", "tc", LaunchConfig(512, 2), Variant(early=True)).variant == Variant()
