"""Issue 23: every AMD code object int4jit builds, read with no GPU (docs/amd.md states the rules).

For each default target x every point of the 20-point grid x asym/sym x groups 32 and 128, on
one shape (4096 x 4096), the code object must show:
  - weights by 16-byte loads only: every non-temporal (weight-stream) load is 16 bytes, there are
    TN per load step, 4 more 16-byte loads per step carry x, and the only other loads are 2-byte
    scales and (asym) 1-byte zero points;
  - v_dot2_f32_f16, 16 per 16-byte weight load, where the target has dot2; none elsewhere (the fp32
    path: 32 FMAs per weight load);
  - no scratch, no spills, no scratch instructions;
  - residency (blocks a CU from VGPRs, SGPRs, LDS, wave slots) at least what the tuner's model
    counted on for that (BS, TN).
A broken property fails with the instruction counts in the message. KNOWN_BROKEN lists the points
that break today, strictly: fixing one fails the test too, until its line is removed.
"""
from __future__ import annotations

import os
import time

import pytest

from int4jit import inspection
from int4jit.shapes import candidate_grid

TARGETS = inspection.DEFAULT_AMD_TARGETS
SHAPE = (4096, 4096)
GROUPS = (32, 128)
GRID = [(c.BS, c.TN) for c in candidate_grid(exhaustive=True)]
CASES = [(arch, g, sym, cfg) for arch in TARGETS for g in GROUPS for sym in (False, True) for cfg in GRID]

# Points that break a rule with Debian's hiprtc 5.2 (measured on this suite; "@g32": that group
# only). Causes (docs/amd.md): BS=32 on wave64 is a half-empty wave the tuner's model counts as
# 32 threads' registers; TN=16 at KT <= 64 and the fp32 (no-dot2) path of gfx900 hold TN x UNROLL
# 16-byte loads plus their unpacked pieces live, past 256 VGPRs (spills) or to 1 wave a SIMD.
KNOWN_BROKEN = """
gfx90a   asym  32,4 32,8 32,16
gfx90a   sym   32,8
gfx908   asym  32,2 32,4 32,8 32,16 64,8
gfx908   sym   32,2 32,4 32,8 32,16
gfx1030  asym  32,2@g32 32,8 32,16 512,16
gfx900   asym  32,2 32,4 32,8 32,16 64,8 64,16 512,16
gfx900   sym   32,2 32,4 32,8 32,16 64,8 64,16 512,16
"""


def _known_broken() -> set:
    out = set()
    for line in KNOWN_BROKEN.strip().splitlines():
        arch, sym, *points = line.split()
        for p in points:
            cfg, _, group = p.partition("@g")
            bs, tn = (int(v) for v in cfg.split(","))
            for g in ([int(group)] if group else GROUPS):
                out.add((arch, g, sym == "sym", (bs, tn)))
    return out


BROKEN = _known_broken()


def _hiprtc_reason():
    from int4jit.backends import hip
    from int4jit.errors import BackendUnavailable
    try:
        hip.compiler_version()
    except (BackendUnavailable, RuntimeError, OSError) as e:
        return f"no hiprtc here ({str(e).splitlines()[0]}); Debian: apt-get install libamdhip64-5"
    return None


@pytest.fixture(scope="session")
def amd_facts(tmp_path_factory):
    """Every case's KernelFacts, compiled once into one session cache (parallel processes)."""
    reason = _hiprtc_reason()
    if reason:
        pytest.skip(reason)
    saved = os.environ.get("INT4JIT_CACHE_DIR")
    os.environ["INT4JIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("inspect_amd_cache"))
    try:
        t0 = time.perf_counter()
        reqs = [(*SHAPE, g, sym, arch, cfg) for arch, g, sym, cfg in CASES]
        facts = inspection.inspect_many(reqs, processes=os.cpu_count() or 1)
        print(f"\ninspect_amd: {len(reqs)} code objects built and read in {time.perf_counter() - t0:.0f} s")
    finally:
        if saved is None:
            os.environ.pop("INT4JIT_CACHE_DIR", None)
        else:
            os.environ["INT4JIT_CACHE_DIR"] = saved
    return dict(zip(CASES, facts))


def test_disassembler_present(amd_facts):
    """CI installs llvm (scripts/test.sh): the load and dot2 checks must run there, not skip."""
    missing = {f.code.counts_note for f in amd_facts.values() if f.code.counts is None}
    assert not missing, f"instruction counts skipped: {missing}"


@pytest.mark.parametrize("arch,group,symmetric,cfg", CASES,
                         ids=[f"{a}-g{g}-{'sym' if s else 'asym'}-{c[0]}x{c[1]}" for a, g, s, c in CASES])
def test_code_object_is_efficient(amd_facts, arch, group, symmetric, cfg):
    facts = amd_facts[(arch, group, symmetric, cfg)]
    problems = inspection.efficiency_problems(facts)
    detail = (f"{facts.plan.shape.key()} ({cfg[0]},{cfg[1]}) on {arch}: " + "; ".join(problems)
              + f"\n  {facts.code.vgprs} VGPRs, {facts.code.sgprs} SGPRs, occupancy {facts.code.occupancy}, "
              f"params {facts.plan.params}\n  {facts.code.counts.summary() if facts.code.counts else facts.code.counts_note}")
    if (arch, group, symmetric, cfg) in BROKEN:
        assert problems, f"listed in KNOWN_BROKEN but every rule holds now: remove it\n{detail}"
        pytest.xfail("known: " + detail)
    assert not problems, detail


@pytest.mark.parametrize("arch", TARGETS)
def test_dot2_where_the_target_has_it(amd_facts, arch):
    """The headline fact per target, checked on one healthy point: (128,4) g128 asym."""
    from int4jit.backends import hip
    facts = amd_facts[(arch, 128, False, (128, 4))]
    counts = facts.code.counts
    if arch in hip.DOT2_TARGETS:
        assert counts.dot2 == 16 * counts.stream_wide > 0, counts.summary()
    else:
        assert counts.dot2 == 0 and counts.fma_f32 >= 32 * counts.stream_wide, counts.summary()


def test_the_issue_example(amd_facts):
    """Issue 23's reading of 4096x4096 g128 asym (64,2) on gfx90a: 12 global_load_dwordx4,
    64 v_dot2, 68 VGPRs, 16 SGPRs, no spills, no scratch."""
    f = amd_facts[("gfx90a", 128, False, (64, 2))]
    assert (f.wide_loads, f.dot2, f.registers, f.sgprs, f.spills, f.scratch_bytes) == (12, 64, 68, 16, 0, 0), \
        inspection.format_facts(f)


def test_a_broken_property_is_reported_with_counts(amd_facts):
    """Negative case: a spilling build (gfx900 (32,16) sym) is named, with its counts."""
    f = amd_facts[("gfx900", 128, True, (32, 16))]
    problems = inspection.efficiency_problems(f)
    assert any("scratch" in p for p in problems) and any("occupancy" in p for p in problems)
    assert "BROKEN" in inspection.format_facts(f) and "v_dot2" in inspection.format_facts(f)


# -- the readers and rules themselves, no compiler needed ---------------------------------
def test_msgpack_subset():
    from int4jit.codeobj import msgpack_decode
    # {"a": [1, -1, 300, "xy", true, null], "b": 1.5}
    data = bytes([0x82, 0xA1, 0x61, 0x96, 0x01, 0xFF, 0xCD, 0x01, 0x2C, 0xA2, 0x78, 0x79, 0xC3, 0xC0,
                  0xA1, 0x62, 0xCB]) + bytes.fromhex("3ff8000000000000")
    assert msgpack_decode(data) == {"a": [1, -1, 300, "xy", True, None], "b": 1.5}


@pytest.mark.parametrize("arch,block,vgprs,sgprs,lds,waves,blocks", [
    ("gfx90a", 64, 68, 16, 0, 7, 28),      # 512 / round8(68)=72 -> 7 waves a SIMD, 4 SIMDs
    ("gfx90a", 64, 128, 16, 0, 4, 16),
    ("gfx908", 64, 77, 16, 0, 3, 12),      # 256 / round4(77)=80 -> 3
    ("gfx900", 64, 24, 16, 0, 10, 40),     # the 10-wave cap
    ("gfx900", 64, 24, 96, 0, 8, 32),      # SGPRs: <= 100 -> 8 waves
    ("gfx1030", 64, 69, 16, 16, 12, 24),   # wave32, 1024 / round16(69)=80 -> 12; 2 waves a block
    ("gfx1100", 64, 69, 16, 0, 16, 32),    # 1536 / round24(69)=72 -> 21, capped at 16
    ("gfx90a", 256, 40, 16, 40 << 10, 8, 1),  # LDS: one 40 KB block in 64 KB
])
def test_amd_occupancy_rule(arch, block, vgprs, sgprs, lds, waves, blocks):
    from int4jit.codeobj import amd_occupancy
    occ = amd_occupancy(arch, block, vgprs, sgprs, lds)
    per_simd = min(v for k, v in occ.limits.items() if not k.startswith("blocks"))
    assert (per_simd, occ.blocks_per_cu) == (waves, blocks), occ


def test_count_amd_reads_only_the_kernel():
    from int4jit.codeobj import count_amd
    text = """
0000000000001700 <k>:
\tglobal_load_dwordx4 v[0:3], v[4:5], off glc slc  // 000000001700: DC5F8000
\tglobal_load_dwordx4 v[0:3], v[4:5], off offset:16  // 000000001708: DC5C8010
\tglobal_load_ushort v6, v[4:5], off  // 000000001710: DC488000
\tv_dot2c_f32_f16_e32 v1, v2, v3  // 000000001718: 6E2A5303
\tbuffer_store_dword v1, off, s[52:55], 0 offset:4  // 00000000171C: E0700004
0000000000002000 <__ockl_hostcall_internal>:
\tglobal_load_dwordx2 v[0:1], v[2:3], off  // 000000002000: DC548000
"""
    c = count_amd(text, "k")
    assert c.loads_by_bytes == {16: 2, 2: 1} and c.stream_loads_by_bytes == {16: 1}
    assert (c.dot2, c.scratch) == (1, 1)
    with pytest.raises(ValueError, match="not in the disassembly"):
        count_amd(text, "missing")


def test_inspect_subcommand(capsys):
    """add_arguments/run, as cli.py wires `int4jit inspect`: the heuristic's pick, one JSON line."""
    import argparse
    import json
    reason = _hiprtc_reason()
    if reason:
        pytest.skip(reason)
    parser = argparse.ArgumentParser()
    inspection.add_arguments(parser)
    assert inspection.run(parser.parse_args(["--shapes", "4096x4096", "--arch", "gfx90a", "--json"])) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["arch"], row["config"], row["spills"], row["problems"]) == ("gfx90a", "64,2", 0, [])
    assert inspection.run(parser.parse_args(["--shapes", "4096x4096", "--arch", "gfx900", "--config", "32,16"])) == 1
    assert "BROKEN" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["--shapes", "4096"])
