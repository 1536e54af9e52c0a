"""Selection tiers, env parsing, the DB key and context, the search, the tuning DB (locking,
corruption, staleness), export/import, the benchmark buffers."""
import dataclasses
import json
import logging
import multiprocessing
import os

import numpy as np
import pytest

from int4jit import archive, benchmark, cache, compiler, env, plan, tuner
from int4jit.backends import cuda
from int4jit.errors import Int4JitError
from int4jit.shapes import GemvShape, LaunchConfig, candidate_grid
from int4jit.spec import Variant, default_variant, make_spec, template_hash, variant_space
from int4jit.tuning_db import TuningDB, TuningRecord

SHAPE = GemvShape(4096, 4096, 128, False)   # the tc kernel on sm_90 by default
TC_KEY = tuner.db_key(SHAPE, "tc")


@pytest.fixture(autouse=True)
def _known_compiler(monkeypatch):
    """The DB context names the compiler version; pinned, so selection tests need no NVRTC."""
    monkeypatch.setattr(cuda, "compiler_version", lambda: "nvrtc-test")


class FakeDevice:
    arch, name, sm_count, max_threads_per_sm, regs_per_sm, warp_size = "sm_90", "Fake H200", 132, 2048, 65536, 32
    l2_bytes, supports_overlap, max_grid_x = 60 << 20, True, 2**31 - 1


class FakeBench:
    """Stands in for benchmark.measure: `best` (and, if given, `variant` at it) is fastest; specs
    in `failing` fail (None). Records every call."""

    def __init__(self, best=LaunchConfig(64, 2), variant=None, failing=()):
        self.best, self.variant, self.failing, self.calls = best, variant, failing, []

    def __call__(self, device, specs, repeats=7):
        self.calls.append(list(specs))
        out = {}
        for i, s in enumerate(specs):
            if s.config in self.failing:
                out[s] = None
            elif s.config == self.best:
                out[s] = 0.5 if self.variant is not None and s.variant == self.variant else 1.0
            else:
                out[s] = 3.0 + i
        return out

    def measured(self):
        return [s for call in self.calls for s in call]


@pytest.fixture
def bench(monkeypatch):
    b = FakeBench()
    monkeypatch.setattr(benchmark, "measure", b)
    return b


@pytest.fixture
def no_table(monkeypatch):
    """An empty shipped table: a shape the DB cannot answer goes to tier 4."""
    monkeypatch.setattr(tuner, "shipped_table", lambda path=None: {})


def _record(cfg, us=5.0, context=None, date="2026-12-01T00:00:00+00:00", exhaustive=False, kernel="tc", **variant):
    ctx = tuner.db_context(kernel, "sm_90", FakeDevice()) if context is None else context
    return TuningRecord({"BS": cfg.BS, "TN": cfg.TN, **variant}, us, {str(cfg): us}, ctx, date, exhaustive)


# -- env parsing ---------------------------------------------------------------------------
@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("YES", True), (" on ", True),
                                            ("0", False), ("false", False), ("No", False), ("off", False), ("", False)])
def test_env_flag_forms(monkeypatch, value, expected):
    monkeypatch.setenv("INT4JIT_TUNE", value)
    assert env.env_flag("INT4JIT_TUNE", default=not expected) is expected


@pytest.mark.parametrize("value", ["2", "y", "enable", "truee", "-1", "__import__('os')"])
def test_env_flag_rejects_other_values_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("ORT_MIGRAPHX_EXHAUSTIVE_TUNE", value)
    with pytest.raises(ValueError, match="ORT_MIGRAPHX_EXHAUSTIVE_TUNE"):
        plan.read_env()


def test_flag_aliases_and_read_at_call_time(monkeypatch):
    assert plan.read_env().exhaustive is False
    monkeypatch.setenv("INT4JIT_EXHAUSTIVE_TUNE", "1")
    assert plan.read_env().exhaustive is True
    monkeypatch.setenv("ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "0")  # the ORT name is read first
    assert plan.read_env().exhaustive is False
    monkeypatch.setenv("INT4JIT_PDL", "off")
    assert plan.read_env().pdl is False and plan.target(SHAPE, "sm_90", FakeDevice())[2] is False


def test_backend_choice(monkeypatch):
    monkeypatch.setenv("INT4JIT_BACKEND", "rocm")
    with pytest.raises(ValueError, match="INT4JIT_BACKEND='rocm'.*cuda, hip"):
        env.env_choice("INT4JIT_BACKEND", ("cuda", "hip"))


def test_startup_check_refuses_the_removed_mma_kernel(monkeypatch):
    monkeypatch.setenv("INT4JIT_KERNEL", "mma")
    with pytest.raises(ValueError, match="INT4JIT_KERNEL"):
        plan.read_env()
    with pytest.raises(ValueError, match="INT4JIT_KERNEL"):
        env.check_all()


@pytest.mark.parametrize("value,expected", [
    ("256,4", (LaunchConfig(256, 4), "global")),
    (" 64 , 2 ", (LaunchConfig(64, 2), "global")),
    ("4096:4096=128,8", (LaunchConfig(128, 8), "entry 4096:4096")),
    ("3072:8192=256,16;4096:4096=64,4;*=128,8", (LaunchConfig(64, 4), "entry 4096:4096")),
    ("3072:8192=256,16;*=128,8", (LaunchConfig(128, 8), "entry *")),
    ("3072:8192=256,16;", None),
    ("", None),
])
def test_override_forms(value, expected):
    got = tuner.override_for(SHAPE, ("INT4JIT_CONFIG", value))
    if expected is None:
        assert got is None
    else:
        assert got[0].config == expected[0] and expected[1] in got[1] and "INT4JIT_CONFIG" in got[1]


@pytest.mark.parametrize("value,token", [("256", "256"), ("256,4,2", "256,4,2"), ("abc,4", "abc,4"),
                                         ("300,4", "(300, 4)"), ("256,5", "(256, 5)"), ("4096:4096=256", "4096:4096=256"),
                                         ("4096=256,4", "4096"), ("a:b=256,4", "a:b"), ("4096:4096", "4096:4096"),
                                         ("1:2=64,2;3:4", "3:4"), ("256,4,loads=x", "x")])
def test_override_malformed_names_variable_and_token(value, token):
    with pytest.raises(ValueError) as info:
        tuner.override_for(SHAPE, ("MIGRAPHX_INT4_GEMV_CONFIG", value))
    assert "MIGRAPHX_INT4_GEMV_CONFIG" in str(info.value) and token in str(info.value)


# -- tier order ----------------------------------------------------------------------------
@pytest.fixture
def table(monkeypatch, tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"sm_90": {SHAPE.key(): {"config": [512, 16], "variant": {"loads": 8}, "us": 1.0}}}))
    monkeypatch.setattr(tuner, "shipped_table", lambda path=path: json.loads(path.read_text()))
    yield path


def test_tier_order(monkeypatch, table, bench):
    dev = FakeDevice()
    # tier 3: the table (its variant fields too), while the DB is empty
    p = plan.plan(SHAPE, "sm_90", dev)
    assert (p.tier, p.spec.config, p.spec.variant.loads) == ("table", LaunchConfig(512, 16), 8)
    # tier 2 beats tier 3
    TuningDB("sm_90").put(TC_KEY, _record(LaunchConfig(128, 2), one_wave=True))
    p = plan.plan(SHAPE, "sm_90", dev)
    assert (p.tier, p.spec.config, p.spec.variant.one_wave) == ("db", LaunchConfig(128, 2), True)
    # tier 1 beats everything
    monkeypatch.setenv("INT4JIT_CONFIG", "64,8")
    p = plan.plan(SHAPE, "sm_90", dev)
    assert (p.tier, p.spec.config, p.spec.variant) == ("override", LaunchConfig(64, 8),
                                                       default_variant(SHAPE, "tc", LaunchConfig(64, 8)))
    monkeypatch.delenv("INT4JIT_CONFIG")
    assert bench.calls == []
    # exhaustive searches even over the DB and table rows, then stores an exhaustive winner
    monkeypatch.setenv("ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "1")
    bench.best = LaunchConfig(32, 2)  # only in the exhaustive grid
    p = plan.plan(SHAPE, "sm_90", dev)
    assert (p.tier, p.spec.config) == ("tuned", LaunchConfig(32, 2))
    assert {s.config for s in bench.calls[0]} == set(candidate_grid(True))
    n = len(bench.calls)
    assert plan.plan(SHAPE, "sm_90", dev).tier == "db" and len(bench.calls) == n  # the exhaustive record serves
    # a shape in neither: tier 4 benchmarks; with INT4JIT_TUNE=0 the heuristic decides
    monkeypatch.delenv("ORT_MIGRAPHX_EXHAUSTIVE_TUNE")
    other = GemvShape(1000, 2048, 64, True)
    monkeypatch.setenv("INT4JIT_TUNE", "0")
    p = plan.plan(other, "sm_90", dev)
    assert p.tier == "heuristic" and p.spec.config == tuner.heuristic(other, "sm_90", "simt", dev)
    assert len(bench.calls) == n
    monkeypatch.setenv("INT4JIT_TUNE", "1")
    bench.best = LaunchConfig(64, 2)
    p = plan.plan(other, "sm_90", dev)
    assert (p.tier, p.spec.kernel, p.spec.config) == ("tuned", "simt", LaunchConfig(64, 2)) and len(bench.calls) == n + 1
    # no device (or tune=False, e.g. a stream being captured): the heuristic, never a benchmark
    assert plan.plan(GemvShape(8, 64, 32, True), "sm_90", None).tier == "heuristic"
    assert plan.plan(GemvShape(8, 64, 32, True), "sm_90", dev, tune=False).tier == "heuristic"
    assert len(bench.calls) == n + 1


def test_one_bf16_token_takes_the_fp16_table_row(table, bench):
    """One bf16 token runs the fp16 token's kernel, loads and steps: the fp16 row serves it, on tc
    (raw_a, an fp16 trick, normalised away) and on simt (few rows); several tokens do not."""
    from dataclasses import replace
    dev = FakeDevice()
    p = plan.plan(replace(SHAPE, dtype="bfloat16", scale_dtype="bfloat16"), "sm_90", dev, tune=False)
    assert (p.tier, p.spec.kernel, p.spec.config, p.spec.variant.loads) == ("table", "tc", LaunchConfig(512, 16), 8)
    assert SHAPE.key() in p.reason
    assert plan.plan(replace(SHAPE, M=2), "sm_90", dev, tune=False).tier == "heuristic"
    few = GemvShape(1024, 4096, 128, False)
    table.write_text(json.dumps({"sm_90": {few.key(): {"config": [512, 16], "us": 1.0}}}))
    p = plan.plan(replace(few, dtype="bfloat16"), "sm_90", dev, tune=False)
    assert (p.tier, p.spec.kernel, p.spec.config, p.spec.param("BF16")) == ("table", "simt", LaunchConfig(512, 16), "true")
    assert bench.calls == []


def test_a_bf16_row_serves_bf16_tokens_of_either_scale_type_before_the_fp16_row(table, bench):
    """Where the table has a row measured with bf16 activations (fp16 scales), bf16 tokens take it
    whatever their scales' type; fp16 tokens and several bf16 tokens do not."""
    from dataclasses import replace
    dev = FakeDevice()
    bf = replace(SHAPE, dtype="bfloat16")
    table.write_text(json.dumps({"sm_90": {SHAPE.key(): {"config": [512, 16], "us": 1.0},
                                           bf.key(): {"config": [128, 2], "variant": {"streaming": True}, "us": 1.0}}}))
    for scales in ("float16", "bfloat16"):
        p = plan.plan(replace(bf, scale_dtype=scales), "sm_90", dev, tune=False)
        assert (p.tier, p.spec.config, p.spec.variant.streaming) == ("table", LaunchConfig(128, 2), True)
        assert bf.key() in p.reason
    p = plan.plan(SHAPE, "sm_90", dev, tune=False)
    assert (p.tier, p.spec.config) == ("table", LaunchConfig(512, 16))
    assert plan.plan(replace(bf, M=2), "sm_90", dev, tune=False).tier == "heuristic"
    assert bench.calls == []


@pytest.mark.parametrize("differs", ["kernel", "template", "device", "compiler", "int4jit"])
def test_db_record_from_another_kernel_or_context_is_not_used(differs, monkeypatch, caplog, bench, no_table):
    """Issue 17 item 3. A record answers one problem on one kernel (its key) measured in one
    context (template hash, device name, compiler version, int4jit version). A record written
    under the tc kernel is not returned under INT4JIT_KERNEL=simt, and a record whose context
    differs from today's is not used: the shape is re-tuned (traced) and the record replaced."""
    monkeypatch.setenv("INT4JIT_TRACE", "1")
    caplog.set_level(logging.INFO, logger="int4jit")
    dev, db = FakeDevice(), TuningDB("sm_90")
    bench.best = LaunchConfig(256, 2)
    # the control: a record of this kernel in today's context is used, nothing is measured
    db.put(TC_KEY, _record(LaunchConfig(64, 8)))
    p = plan.plan(SHAPE, "sm_90", dev)
    assert (p.tier, p.spec.kernel, p.spec.config) == ("db", "tc", LaunchConfig(64, 8)) and bench.calls == []
    if differs == "kernel":
        monkeypatch.setenv("INT4JIT_KERNEL", "simt")
        key, kernel = tuner.db_key(SHAPE, "simt"), "simt"
        assert key != TC_KEY
    else:
        context = tuner.db_context("tc", "sm_90", dev)
        assert set(context) == {"template", "device", "compiler", "int4jit"}
        db.put(TC_KEY, _record(LaunchConfig(64, 8), context={**context, differs: "something else"}))
        key, kernel = TC_KEY, "tc"
    p = plan.plan(SHAPE, "sm_90", dev)
    assert (p.tier, p.spec.kernel, p.spec.config) == ("tuned", kernel, LaunchConfig(256, 2))
    assert bench.measured() and all(s.kernel == kernel for s in bench.measured())
    if differs != "kernel":
        assert f"is stale: {differs} differs" in caplog.text
    # the re-tuned record is stored in today's context and serves the next call
    rec = db.get(key, tuner.db_context(kernel, "sm_90", dev))
    assert (rec.BS, rec.TN) == (256, 2) and rec.context == tuner.db_context(kernel, "sm_90", dev)
    n = len(bench.calls)
    assert plan.plan(SHAPE, "sm_90", dev).tier == "db" and len(bench.calls) == n
    if differs == "kernel":  # the tc record is still there, untouched, under its own key
        assert db.get(TC_KEY, tuner.db_context("tc", "sm_90", dev)).config == {"BS": 64, "TN": 8}


def test_tuned_variant_round_trips_through_the_db(bench, no_table):
    """Stage 2 measures the variant space at the stage-1 winner; a winning variant is stored
    with its fields and built again from the DB."""
    dev = FakeDevice()
    from dataclasses import replace
    bench.best, bench.variant = LaunchConfig(128, 4), replace(default_variant(SHAPE, "tc", LaunchConfig(128, 4)), loads=8)
    p = plan.plan(SHAPE, "sm_90", dev)
    assert (p.tier, p.spec.config, p.spec.variant.loads, p.spec.pdl) == ("tuned", LaunchConfig(128, 4), 8, True)
    stage1, stage2 = bench.calls
    assert stage1[0].config == tuner.heuristic(SHAPE, "sm_90", "tc", dev)  # the heuristic pick first
    default = {s.config: default_variant(SHAPE, "tc", s.config) for s in stage1}
    assert all(s.variant.streaming == default[s.config].streaming for s in stage1[::2])  # both schedules
    assert all(s.variant.streaming != default[s.config].streaming for s in stage1[1::2])
    assert len(stage1) == 2 * len(candidate_grid(False))
    assert all(s.config == LaunchConfig(128, 4) for s in stage2)
    winner = next(s for s in stage1 if s.config == LaunchConfig(128, 4) and s.variant == default[s.config])
    space = variant_space(SHAPE, "tc", LaunchConfig(128, 4), "sm_90", base=winner.variant)
    assert len(stage2) == len([v for v in space if v not in {s.variant for s in stage1 if s.config == winner.config}])
    rec = TuningDB("sm_90").get(TC_KEY, tuner.db_context("tc", "sm_90", dev))
    assert rec.config == {"BS": 128, "TN": 4, **bench.variant.as_dict()} and rec.us == 0.5
    assert len(rec.candidates) == len(stage1) + len(stage2) and rec.candidates[f"128,4,{bench.variant.text()}"] == 0.5
    again = plan.plan(SHAPE, "sm_90", dev)
    assert again.tier == "db" and again.spec == p.spec and again.spec.key() == p.spec.key()


def test_autotune_scores_failed_candidates_and_refuses_when_all_fail(monkeypatch):
    dev = FakeDevice()
    failing = {LaunchConfig(64, 2), LaunchConfig(64, 4)}
    b = FakeBench(best=LaunchConfig(64, 2), failing=failing)
    monkeypatch.setattr(benchmark, "measure", b)
    rec, spec = tuner.autotune(SHAPE, "tc", dev)
    assert spec.config not in failing and rec.us > 1.0
    assert rec.candidates["64,2"] is None and rec.candidates["64,4"] is None  # stored as failed, not dropped
    monkeypatch.setattr(benchmark, "measure", FakeBench(failing=set(candidate_grid(True))))
    with pytest.raises(Int4JitError, match="every candidate failed"):
        tuner.autotune(SHAPE, "tc", dev)


def test_search_space_covers_every_spec_tier_4_may_measure():
    specs = plan.search_space(SHAPE, "sm_90")
    assert len(set(specs)) == len(specs) and all(s.kernel == "tc" and s.pdl for s in specs)
    grid = tuner.grid_specs(SHAPE, "sm_90", "tc", pdl=True)
    assert grid[0].config == tuner.heuristic(SHAPE, "sm_90", "tc")
    assert [s.config for s in grid[2::2]] == [c for c in candidate_grid(False) if c != grid[0].config]
    assert {s.variant.streaming for s in grid} == {False, True}  # both schedules of every (BS, TN)
    for g in grid:  # stage 2 flips one field around whichever stage-1 spec wins
        variants = tuner.variant_specs(SHAPE, "sm_90", "tc", g.config, pdl=True, base=g.variant)
        assert variants[0] == g and set(variants) <= set(specs)
    assert len(plan.search_space(SHAPE, "sm_90", exhaustive=True)) > len(specs)
    simt = plan.search_space(GemvShape(1000, 2048, 64, True), "sm_90")
    assert len(simt) == 9 and all(s.kernel == "simt" for s in simt)


@pytest.mark.parametrize("M", [1, 8])
def test_stage_one_adds_one_wave_and_cluster_twins_for_several_tokens(M):
    """Several tokens: each schedule's one_wave twin is measured in stage 1 where the register cap
    changes the build (a grid of at most 32 waves), and nowhere else, and its kcluster=2 twin
    everywhere (sm_90); one token: neither."""
    shape = GemvShape(28672, 4096, 128, False, M)
    grid = tuner.grid_specs(shape, "sm_90", "tc", pdl=True)
    clustered = [s for s in grid if s.variant.kcluster == 2]
    schedules = {(c, v) for c in candidate_grid(False) for v in tuner.schedules(shape, "tc", c, "sm_90", True)}
    assert {(s.config, dataclasses.replace(s.variant, kcluster=1)) for s in clustered
            if not s.variant.one_wave} == (schedules if M > 1 else set())
    assert any(s.variant.one_wave for s in clustered) == (M > 1)  # the cluster twins' one_wave twins
    assert all(s.grid == 2 * -(-shape.N // s.rows_per_block) for s in clustered)
    assert not any(s.variant.kcluster > 1 for s in tuner.grid_specs(shape, "sm_80", "tc", pdl=False))  # no clusters before sm_90
    grid = [s for s in grid if s.variant.kcluster == 1]
    plain = [s for s in grid if not s.variant.one_wave]
    capped = [s for s in grid if s.variant.one_wave]
    assert {(s.config, s.variant) for s in plain} == {(c, v) for c in candidate_grid(False)
                                                      for v in tuner.schedules(shape, "tc", c, "sm_90", True)}
    if M == 1:
        assert not capped
        return
    assert capped and all("__launch_bounds__(" in s.param("KERNEL_ATTRS") and ", " in s.param("KERNEL_ATTRS")
                          for s in capped)
    for s in capped:  # the twin of a plain spec of the same geometry and schedule
        assert dataclasses.replace(s.variant, one_wave=False) in {p.variant for p in plain if p.config == s.config}
    assert any(s.config == LaunchConfig(128, 4) for s in capped)  # 896 blocks: seven a multiprocessor
    lm_head = tuner.grid_specs(GemvShape(128256, 4096, 128, False, M), "sm_90", "tc", pdl=True)
    assert not any(s.config == LaunchConfig(64, 2) and s.variant.one_wave for s in lm_head)  # 8016 blocks: 61 waves
    assert set(grid) <= set(plan.search_space(shape, "sm_90"))  # pre-warming compiles them too


@pytest.mark.parametrize("exhaustive", [False, True])
def test_heuristic_stays_inside_the_searched_grid(exhaustive):
    grid = set(candidate_grid(exhaustive))
    for N in (1, 7, 896, 4096, 28672, 128256):
        for K in (32, 896, 4096, 14336):
            for arch, kernel in (("sm_90", "tc"), ("sm_90", "simt"), ("gfx90a", "simt"), ("gfx1030", "simt")):
                assert tuner.heuristic(GemvShape(N, K, 16, False), arch, kernel, exhaustive=exhaustive) in grid


def test_heuristic_responds_to_the_hardware():
    """A model, not a constant: different shapes and machines get different picks."""
    picks = {tuner.heuristic(GemvShape(N, K, 128, False), "sm_90", "simt") for N, K in
             [(896, 896), (4096, 4096), (128256, 4096), (1, 14336), (4096, 14336)]}
    assert len(picks) >= 2
    small = tuner.DeviceModel(8, 1024, 65536, 32)
    big = tuner.DeviceModel(304, 2048, 65536, 64)
    s = GemvShape(2048, 2048, 128, False)
    effs = lambda m: [tuner.estimate_efficiency(make_spec(s, "sm_90", "simt", c, sm_count=m.sm_count), m)
                      for c in candidate_grid(True)]
    assert effs(small) != effs(big)
    assert all(0 < e <= 1 for e in effs(big))


def test_heuristic_models_the_tc_kernel_too():
    """For the tc kernel the model reads that kernel's geometry: valid efficiencies, not those of
    the simt kernel, and a pick inside the grid for every shape."""
    shapes = [GemvShape(N, K, 128, False) for N, K in [(896, 896), (4096, 4096), (128256, 4096), (2048, 8192)]]
    model = tuner.device_model("sm_90")
    eff = lambda kernel: [tuner.estimate_efficiency(make_spec(s, "sm_90", kernel, c), model)
                          for s in shapes for c in candidate_grid(True)]
    simt, tc = eff("simt"), eff("tc")
    assert all(0 < e <= 1 for e in tc) and tc != simt
    for s in shapes:
        assert tuner.heuristic(s, "sm_90", "tc", exhaustive=True) in candidate_grid(True)


@pytest.mark.parametrize("kernel", ["tc", "simt"])
def test_modelled_time_grows_with_the_bytes_and_charges_a_partial_batch_for_its_share(kernel):
    """More K never models faster; efficiency stays in (0, 1]; a thread whose last batch of
    loads is partial costs less than one that fills it (the model charges the bytes it holds)."""
    model = tuner.device_model("sm_90")
    for N in (2048, 4096, 28672):
        for c in candidate_grid(True):
            times = []
            for K in range(512, 16385, 512):
                spec = make_spec(GemvShape(N, K, 128, False), "sm_90", kernel, c, sm_count=model.sm_count)
                ns, ideal = tuner.modelled_time(spec, model)
                assert 0 < ideal <= ns, (N, K, c)
                times.append(ns)
            assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:])), (N, c)
    model = dataclasses.replace(model, round_trip_ns=1.0)  # bandwidth-bound: every byte shows
    spec = lambda K: make_spec(GemvShape(4096, K, 128, False), "sm_90", kernel, LaunchConfig(64, 2),
                               sm_count=model.sm_count)
    batches = lambda K: spec(K).thread_bytes * spec(K).k_efficiency / spec(K).inflight_bytes
    full = next(K for K in range(4096, 65537, 128) if batches(K) == int(batches(K)) >= 2)
    partial = next(K for K in range(full - 128, 0, -128) if int(batches(K)) < batches(K) < batches(full))
    assert tuner.modelled_time(spec(partial), model)[0] < tuner.modelled_time(spec(full), model)[0]


@pytest.mark.parametrize("var,value,shown", [
    ("INT4JIT_TUNE", "sometimes", "sometimes"), ("INT4JIT_TRACE", "verbose", "verbose"),
    ("MIGRAPHX_INT4_GEMV_TRACE", "2", "'2'"), ("INT4JIT_EXHAUSTIVE_TUNE", "all", "all"),
    ("INT4JIT_CONFIG", "256;4", "'256'"), ("MIGRAPHX_INT4_GEMV_CONFIG", "os.system('x')", "os.system"),
    ("INT4JIT_CONFIG", "128,4,kcluster=3", "kcluster=3"), ("INT4JIT_KERNEL", "mma", "mma"),
    ("INT4JIT_PDL", "maybe", "maybe")])
def test_every_malformed_variable_is_one_clear_error(monkeypatch, var, value, shown, bench):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as info:
        plan.plan(GemvShape(1000, 2048, 64, True), "sm_90", FakeDevice())
    assert var in str(info.value) and shown in str(info.value)
    assert str(info.value).count(var) == 1
    if "TRACE" not in var:  # read when planning; INT4JIT_TRACE is read at the first trace
        assert bench.calls == []  # refused before anything was measured


# -- the DB ----------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"{not json", b"", b"[]", b'{"entries": 3}', b"\x00\xff" * 10,
                                     json.dumps({"schema": 2, "arch": "sm_90", "entries": {"k": {"us": 1}}}).encode()])
def test_corrupt_db_is_set_aside_with_a_warning(caplog, content):
    db = TuningDB("sm_90")
    db.path.parent.mkdir(parents=True, exist_ok=True)
    db.path.write_bytes(content)
    ctx = tuner.db_context("tc", "sm_90")
    assert db.get(TC_KEY, ctx) is None
    assert "unusable" in caplog.text
    assert not db.path.exists() and list(db.path.parent.glob("sm_90.json.corrupt-*"))
    db.put(TC_KEY, _record(LaunchConfig(64, 2), context=ctx))
    assert db.get(TC_KEY, ctx).config == {"BS": 64, "TN": 2}


def test_future_db_is_not_used_nor_moved():
    db = TuningDB("sm_90")
    db.path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": 99, "arch": "sm_90", "entries": {TC_KEY: {"anything": 1}}}
    db.path.write_text(json.dumps(doc))
    assert db.get(TC_KEY, {}) is None and db.path.exists()


def test_db_keeps_every_candidate_and_the_context():
    rec = _record(LaunchConfig(64, 2), streaming=True)
    rec.candidates = {str(c): float(i) for i, c in enumerate(candidate_grid(False))}
    TuningDB("sm_90").put(TC_KEY, rec)
    doc = json.loads(TuningDB("sm_90").path.read_text())
    entry = doc["entries"][TC_KEY]
    assert TC_KEY == f"{SHAPE.key()}/tc"
    assert len(entry["candidates"]) == 9 and entry["config"] == {"BS": 64, "TN": 2, "streaming": True}
    assert entry["context"] == {"template": template_hash("tc"), "device": "Fake H200",
                                "compiler": "nvrtc-test", "int4jit": tuner.__version__}
    assert doc["arch"] == "sm_90" and doc["schema"] == 2


def _writer(args):
    root, worker, n = args
    os.environ["INT4JIT_CACHE_DIR"] = root
    db = TuningDB("sm_90")
    for i in range(n):
        key = tuner.db_key(GemvShape(16 * (worker * n + i + 1), 64, 32, False), "simt")
        db.put(key, TuningRecord({"BS": 64, "TN": 2}, float(i + 1), {}, {"device": "d"}, "2026"))
    return worker


def test_concurrent_writers_lose_nothing(tmp_path):
    root = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        pool.map(_writer, [(root, w, 25) for w in range(4)])
    os.environ["INT4JIT_CACHE_DIR"] = root
    entries = TuningDB("sm_90").entries()
    assert len(entries) == 100
    assert not list((tmp_path / "shared" / "tuning").glob("*.tmp"))


# -- export / import ------------------------------------------------------------------------
def test_export_import_round_trip(tmp_path, monkeypatch):
    from conftest import require_compiler
    monkeypatch.undo()  # the real compiler version: the code cache key holds it
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path / "cache"))
    require_compiler("cuda")
    compiler._memo.clear()
    shape, cfg = GemvShape(256, 512, 64, False), LaunchConfig(64, 4)
    ck = compiler.build(make_spec(shape, "sm_90", "simt", cfg))
    key, ctx = tuner.db_key(shape, "simt"), tuner.db_context("simt", "sm_90")
    TuningDB("sm_90").put(key, _record(cfg, context=ctx))
    n = archive.export_cache(tmp_path / "c.tgz")
    assert n == 2
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path / "other"))
    summary = archive.import_cache(tmp_path / "c.tgz")
    assert summary["code_objects_added"] == 1 and summary["tuning_entries_merged"] == 1
    assert cache.read_code_object(compiler.code_object_path(ck.key)) == ck.binary
    assert TuningDB("sm_90").get(key, ctx).config == {"BS": 64, "TN": 4}
    # importing again merges nothing new; a newer local entry is not overwritten
    TuningDB("sm_90").put(key, _record(LaunchConfig(128, 2), context=ctx, date="2027-01-01T00:00:00+00:00"))
    again = archive.import_cache(tmp_path / "c.tgz")
    assert again["code_objects_added"] == 0 and again["tuning_entries_merged"] == 0
    assert TuningDB("sm_90").get(key, ctx).config == {"BS": 128, "TN": 2}


def _tar_with(path, name, data=b"x", kind="file"):
    import io
    import tarfile
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        elif kind == "device":
            info.type = tarfile.CHRTYPE
            tar.addfile(info)
        else:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("name,kind,pattern", [("../evil", "file", "escapes"), ("/etc/evil", "file", "escapes"),
                                               ("code/ab/" + "a" * 64 + ".bin", "symlink", "link"),
                                               ("tuning/sm_90.json", "device", "device"),
                                               ("notes.txt", "file", "unexpected")])
def test_import_rejects_unsafe_members(tmp_path, name, kind, pattern):
    _tar_with(tmp_path / "bad.tgz", name, kind=kind)
    before = sorted(p for p in cache.cache_dir().rglob("*"))
    with pytest.raises(archive.ArchiveError, match=pattern):
        archive.import_cache(tmp_path / "bad.tgz")
    assert sorted(p for p in cache.cache_dir().rglob("*")) == before


def test_import_rejects_tampered_code_object(tmp_path):
    import io
    import tarfile
    payload = b"\x7fELF fake code"
    blob = cache.sha256(payload).encode() + payload
    name = "code/ab/" + "b" * 64 + ".bin"
    tampered = blob[:-1] + b"X"
    manifest = json.dumps({"files": {name: cache.sha256(blob)}}).encode()
    with tarfile.open(tmp_path / "t.tgz", "w:gz") as tar:
        for n, d in (("manifest.json", manifest), (name, tampered)):
            info = tarfile.TarInfo(n)
            info.size = len(d)
            tar.addfile(info, io.BytesIO(d))
    with pytest.raises(archive.ArchiveError, match="does not match its hash"):
        archive.import_cache(tmp_path / "t.tgz")
    assert not (cache.code_dir() / "ab").exists()


_KILL_WRITER = """
import os, sys
os.environ["INT4JIT_CACHE_DIR"] = sys.argv[1]
from int4jit.tuning_db import TuningDB, TuningRecord
db = TuningDB("sm_90")
i = 0
while True:
    i += 1
    big = {str(j): float(j) for j in range(1000)}  # large entries: writes take a while
    db.put(f"{16 * i}x64/g32/asym/simt", TuningRecord({"BS": 64, "TN": 2}, 1.0, big, {"device": "d"}, "2026"))
    print(i, flush=True)
"""


def test_sigkill_mid_write_leaves_a_valid_db(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    root = tmp_path / "killed"
    p = subprocess.Popen([sys.executable, "-c", _KILL_WRITER, str(root)], stdout=subprocess.PIPE, text=True)
    for _ in range(5):
        p.stdout.readline()  # let it finish a few writes, then kill it in the middle of another
    time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    os.environ["INT4JIT_CACHE_DIR"] = str(root)
    path = TuningDB("sm_90").path
    doc = json.loads(path.read_text())  # whole and parseable: never a half-written file
    assert len(doc["entries"]) >= 5
    assert not list(path.parent.glob("sm_90.json.corrupt-*"))


def test_import_rejects_oversize_member(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBER", 1000)
    _tar_with(tmp_path / "big.tgz", "tuning/sm_90.json", data=b"{" + b" " * 2000 + b"}")
    with pytest.raises(archive.ArchiveError, match="over the 1000 limit"):
        archive.import_cache(tmp_path / "big.tgz")
    assert not (cache.cache_dir() / "tuning" / "sm_90.json").exists()


# -- the benchmark harness's buffers -----------------------------------------------------------
class RecordingDevice:
    """Stands in for a GPU: hands out fake addresses and records copies."""
    l2_bytes = 60 << 20

    def __init__(self):
        self.next, self.allocs, self.freed, self.htod, self.dtod = 0x1000, {}, [], [], []

    def alloc(self, n):
        p = self.next
        self.next += (n + 255) // 256 * 256
        self.allocs[p] = n
        return p

    def free(self, p):
        self.freed.append(p)

    def copy_htod(self, p, a, stream=0):
        assert a.nbytes <= self.allocs[p]
        self.htod.append((p, a.copy()))

    def copy_dtod(self, dst, src, n, stream=0):
        assert n <= self.allocs[dst] and n <= self.allocs[src]
        self.dtod.append((dst, src, n))

    def synchronize(self, stream=0):
        pass


@pytest.mark.parametrize("shape", [GemvShape(4096, 4096, 128, False), GemvShape(16384, 4096, 32, True),
                                   GemvShape(7, 48, 16, False), GemvShape(4096, 4096, 128, False, 8, "bfloat16")])
def test_bench_buffers_rotate_enough_distinct_copies(shape):
    dev = RecordingDevice()
    bufs = benchmark.BenchBuffers(dev, shape, seed=1)
    per_copy = shape.N * shape.K // 2 + 2 * shape.N * (shape.K // shape.group) + (0 if shape.symmetric else shape.N * (shape.K // shape.group))
    assert bufs.copies == min(64, max(2, -(-3 * dev.l2_bytes // per_copy)))
    assert len(bufs.sets) == bufs.copies
    addrs = [p for st in bufs.sets for p in st if p]
    assert len(set(addrs)) == len(addrs)  # every copy has its own memory: L2 cannot serve them
    assert bufs.copies * per_copy >= min(3 * dev.l2_bytes, 64 * per_copy)
    x, w, s, z = bufs.host
    assert w.shape == (shape.N, shape.K // 2) and s.dtype == np.float16 and (z is None) == shape.symmetric
    assert x.size == shape.M * shape.K and dev.allocs[bufs.x] == x.nbytes  # x [M, K] uploaded whole
    assert dev.allocs[bufs.y] == 2 * shape.M * shape.N                        # room for every token's y
    assert len(np.unique(w)) > 100 or w.size < 500  # random bytes, not zeros
    bufs.free()
    assert sorted(dev.freed) == sorted(dev.allocs)  # nothing leaked, nothing freed twice


def test_fixed_weights_without_a_measurement_launch_early_by_rule(monkeypatch):
    """GemvWeights / Int4Linear plan with fixed_weights: where nothing measured the early twin
    (no device: table or heuristic picks), the tc kernel loads its first weights before the
    grid-dependency wait (early, which streams) at g >= 128 with PDL, on builds of TN <= 4 and 4
    loads; a raw gemv call, g32, TN = 8, 8 loads, INT4JIT_PDL=0 and the simt kernel do not; an
    override decides for itself; pre-warming compiles the early twin of every candidate."""
    from dataclasses import replace
    g128, g32 = GemvShape(4096, 4096, 128, False), GemvShape(4096, 4096, 32, False)
    fixed = plan.plan(g128, "sm_90", None, fixed_weights=True)
    assert fixed.spec.variant.early and fixed.spec.variant.streaming and fixed.spec.param("EARLY") == "true"
    assert "by rule" in fixed.reason
    raw = plan.plan(g128, "sm_90", None)
    assert not raw.spec.variant.early and fixed.spec.config == raw.spec.config and fixed.spec.key() != raw.spec.key()
    assert not plan.plan(g32, "sm_90", None, fixed_weights=True).spec.variant.early
    assert not plan.plan(GemvShape(1024, 4096, 128, False), "sm_90", None, fixed_weights=True).spec.variant.early  # simt
    assert plan.plan(replace(g128, M=4, dtype="bfloat16"), "sm_90", None, fixed_weights=True).spec.variant.early
    assert plan.plan(g128, "sm_90", None, config="256,2,early=1").spec.variant.early
    assert not plan.plan(g128, "sm_90", None, config="256,2", fixed_weights=True).spec.variant.early
    monkeypatch.setenv("INT4JIT_PDL", "0")
    assert not plan.plan(g128, "sm_90", None, fixed_weights=True).spec.variant.early
    assert tuner.early_twin(g128, "sm_90", "tc", LaunchConfig(256, 2), Variant(), pdl=False) is None
    monkeypatch.delenv("INT4JIT_PDL")
    assert tuner.early_by_rule(g128, LaunchConfig(256, 4), Variant())
    assert not tuner.early_by_rule(g128, LaunchConfig(128, 8), Variant())
    assert not tuner.early_by_rule(g128, LaunchConfig(256, 2), Variant(loads=8))
    assert not tuner.early_by_rule(g32, LaunchConfig(256, 2), Variant())
    assert tuner.early_twin(g128, "sm_90", "simt", LaunchConfig(256, 2), Variant(), pdl=True) is None
    assert tuner.early_twin(g128, "sm_80", "tc", LaunchConfig(256, 2), Variant(), pdl=True) is None
    assert tuner.early_twin(g128, "sm_90", "tc", LaunchConfig(256, 2), Variant(), True) == Variant(streaming=True, early=True)
    for shape in (g128, g32):
        space = plan.search_space(shape, "sm_90")
        plain = [s for s in space if not s.variant.early]
        twins = {make_spec(shape, "sm_90", "tc", s.config, replace(s.variant, early=True), True) for s in plain}
        assert plain and twins <= set(space) and set(space) == set(plain) | twins
    assert not any(s.variant.early for s in plan.search_space(GemvShape(1024, 4096, 128, False), "sm_90"))


def test_fixed_weights_measure_the_early_twin_of_a_measured_pick(bench, no_table):
    """Where this machine measured the pick (tiers 2 and 4), a fixed-weights plan measures it
    against its early twin once, keeps the faster in the DB under its own key, and measures again
    only when the pick changes; the rule does not decide (here it would say the opposite)."""
    dev = FakeDevice()
    shape = GemvShape(12288, 4096, 128, False)
    db = TuningDB("sm_90")
    db.put(tuner.db_key(shape, "tc"), _record(LaunchConfig(128, 8), streaming=True))  # TN = 8: the rule says no
    bench.best, bench.variant = LaunchConfig(128, 8), Variant(streaming=True, early=True)
    p = plan.plan(shape, "sm_90", dev, fixed_weights=True)
    assert p.tier == "db" and p.spec.variant == Variant(streaming=True, early=True) and "measured" in p.reason
    assert [(s.config, s.variant) for s in bench.calls[-1]] == [(LaunchConfig(128, 8), Variant(streaming=True)),
                                                                (LaunchConfig(128, 8), Variant(streaming=True, early=True))]
    rec = db.get(f"{tuner.db_key(shape, 'tc')}/{tuner.FIXED_WEIGHTS_KEY}", tuner.db_context("tc", "sm_90", dev))
    assert rec.config["early"] is True and rec.us == 0.5 and len(rec.candidates) == 2
    n = len(bench.calls)
    assert plan.plan(shape, "sm_90", dev, fixed_weights=True).spec.variant.early and len(bench.calls) == n  # from the DB
    assert not plan.plan(shape, "sm_90", dev).spec.variant.early and len(bench.calls) == n  # a raw gemv call
    # the pick changes (re-tuned): the twin is measured against the new pick; slower here, so plain
    db.put(tuner.db_key(shape, "tc"), _record(LaunchConfig(256, 2)))  # TN <= 4, 4 loads: the rule says yes
    bench.best, bench.variant = LaunchConfig(256, 2), None
    p = plan.plan(shape, "sm_90", dev, fixed_weights=True)
    assert len(bench.calls) == n + 1 and not p.spec.variant.early and "slower" in p.reason
    # tier 4 then the twin, on a shape nothing has measured
    other = GemvShape(9216, 3072, 128, False)
    bench.best, bench.variant = LaunchConfig(64, 2), Variant(streaming=True, early=True)
    p = plan.plan(other, "sm_90", dev, fixed_weights=True)
    assert p.tier == "tuned" and p.spec.variant.early and bench.calls[-1][-1].variant.early
    # nothing is measured while a stream is captured (tune=False): the heuristic and the rule answer
    n = len(bench.calls)
    p = plan.plan(GemvShape(9000, 3072, 128, False), "sm_90", dev, fixed_weights=True, tune=False)
    assert p.tier == "heuristic" and len(bench.calls) == n


def test_heuristic_is_near_the_measured_best_on_the_table_suite():
    """The no-GPU pick against the H200's measured grid (bench/results/tuning-sm_90.json, the data
    the model's constants were fitted to): within 15% of the 9-point grid's best on >= 60 of 68."""
    from pathlib import Path
    doc = json.loads((Path(__file__).resolve().parents[1] / "bench/results/tuning-sm_90.json").read_text())
    near = 0
    for key, times in doc["records"].items():
        (n, k), g, sym = key.split("/")[0].split("x"), key.split("/")[1], key.split("/")[2]
        shape = GemvShape(int(n), int(k), int(g[1:]), sym == "sym")
        _, kernel, _ = plan.target(shape, "sm_90")
        best = min(times[str(c)] for c in candidate_grid(False))
        near += times[str(tuner.heuristic(shape, "sm_90", kernel))] <= 1.15 * best
    assert near >= 60, near


def test_every_tc_table_row_names_its_schedule():
    """A row holds the build it was measured as: streaming and raw_a are written out, so a change
    of default_variant cannot change what a row means."""
    for key, row in tuner.shipped_table()["sm_90"].items():
        shape = GemvShape(*(int(v) for v in key.split("/")[0].split("x")), int(key.split("/")[1][1:]),
                          key.endswith("/sym"))
        if plan.target(shape, "sm_90")[1] == "tc":
            assert {"streaming", "raw_a"} <= set(row.get("variant", {})), key
