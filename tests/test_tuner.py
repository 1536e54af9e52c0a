"""Selection tiers, env parsing, the tuning DB (locking, corruption, staleness), export/import."""
import json
import multiprocessing
import os

import numpy as np
import pytest

from int4jit import archive, cache, compiler, env, tuner
from int4jit.shapes import GemvShape, LaunchConfig, candidate_grid
from int4jit.tuning_db import TuningDB, TuningRecord

SHAPE = GemvShape(4096, 4096, 128, False)


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
        tuner.exhaustive_enabled()


def test_flag_aliases_and_read_at_call_time(monkeypatch):
    assert tuner.exhaustive_enabled() is False
    monkeypatch.setenv("INT4JIT_EXHAUSTIVE_TUNE", "1")
    assert tuner.exhaustive_enabled() is True
    monkeypatch.setenv("ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "0")  # the ORT name is read first
    assert tuner.exhaustive_enabled() is False
    assert tuner.exhaustive_enabled(True) is True  # an explicit argument wins


def test_backend_choice(monkeypatch):
    monkeypatch.setenv("INT4JIT_BACKEND", "rocm")
    with pytest.raises(ValueError, match="INT4JIT_BACKEND='rocm'.*cuda, hip"):
        env.env_choice("INT4JIT_BACKEND", ("cuda", "hip"))


@pytest.mark.parametrize("value,shape,expected", [
    ("256,4", SHAPE, (LaunchConfig(256, 4), "global")),
    (" 64 , 2 ", SHAPE, (LaunchConfig(64, 2), "global")),
    ("4096:4096=128,8", SHAPE, (LaunchConfig(128, 8), "entry 4096:4096")),
    ("3072:8192=256,16;4096:4096=64,4;*=128,8", SHAPE, (LaunchConfig(64, 4), "entry 4096:4096")),
    ("3072:8192=256,16;*=128,8", SHAPE, (LaunchConfig(128, 8), "entry *")),
    ("3072:8192=256,16;", SHAPE, None),
])
def test_override_forms(monkeypatch, value, shape, expected):
    monkeypatch.setenv("INT4JIT_CONFIG", value)
    got = tuner.override_for(shape)
    if expected is None:
        assert got is None
    else:
        assert got[0] == expected[0] and expected[1] in got[1]


@pytest.mark.parametrize("value,token", [("256", "256"), ("256,4,2", "256,4,2"), ("abc,4", "abc,4"),
                                         ("300,4", "300,4"), ("256,5", "256,5"), ("4096:4096=256", "4096:4096=256"),
                                         ("4096=256,4", "4096"), ("a:b=256,4", "a:b"), ("4096:4096", "4096:4096"),
                                         ("1:2=64,2;3:4", "3:4")])
def test_override_malformed_names_variable_and_token(monkeypatch, value, token):
    monkeypatch.setenv("MIGRAPHX_INT4_GEMV_CONFIG", value)
    with pytest.raises(ValueError) as info:
        tuner.override_for(SHAPE)
    assert "MIGRAPHX_INT4_GEMV_CONFIG" in str(info.value) and token in str(info.value)


# -- tier order ----------------------------------------------------------------------------
def _record(cfg, us=5.0, template=None, date="2026-12-01T00:00:00+00:00", exhaustive=False):
    return TuningRecord(cfg.BS, cfg.TN, us, {str(cfg): us}, template or compiler.template_hash(),
                        "test", "nvrtc-x", date, exhaustive)


@pytest.fixture
def table(monkeypatch, tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"sm_90": {SHAPE.key(): {"config": [512, 16], "us": 1.0}}}))
    tuner.shipped_table.cache_clear()
    monkeypatch.setattr(tuner, "TABLE_PATH", path)
    monkeypatch.setattr(tuner, "shipped_table", lambda path=path: json.loads(path.read_text()))
    yield path


class FakeDevice:
    arch, name, sm_count, max_threads_per_sm, regs_per_sm, warp_size, l2_bytes = "sm_90", "fake", 132, 2048, 65536, 32, 60 << 20


def test_tier_order(monkeypatch, table):
    tuned = []
    monkeypatch.setattr(tuner, "autotune", lambda shape, device, exhaustive=False: tuned.append(exhaustive) or _record(LaunchConfig(32, 2), exhaustive=exhaustive))
    dev = FakeDevice()
    # tier 3: the table, while the DB is empty
    assert tuner.select_config(SHAPE, "sm_90", dev).tier == "table"
    # tier 2 beats tier 3
    TuningDB("sm_90").put(SHAPE, _record(LaunchConfig(128, 2)))
    sel = tuner.select_config(SHAPE, "sm_90", dev)
    assert (sel.tier, sel.config) == ("db", LaunchConfig(128, 2))
    # tier 1 beats everything
    monkeypatch.setenv("INT4JIT_CONFIG", "64,8")
    assert tuner.select_config(SHAPE, "sm_90", dev).config == LaunchConfig(64, 8)
    monkeypatch.delenv("INT4JIT_CONFIG")
    # exhaustive searches even over the DB and table rows, then stores an exhaustive winner
    monkeypatch.setenv("ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "1")
    sel = tuner.select_config(SHAPE, "sm_90", dev)
    assert (sel.tier, sel.config, tuned) == ("tuned", LaunchConfig(32, 2), [True])
    assert tuner.select_config(SHAPE, "sm_90", dev).tier == "db"  # the exhaustive record now serves
    assert tuned == [True]
    # a shape in neither: tier 4 autotunes; with INT4JIT_TUNE=0 the heuristic decides
    monkeypatch.delenv("ORT_MIGRAPHX_EXHAUSTIVE_TUNE")
    other = GemvShape(1000, 2048, 64, True)
    monkeypatch.setenv("INT4JIT_TUNE", "0")
    sel = tuner.select_config(other, "sm_90", dev)
    assert sel.tier == "heuristic" and sel.config == tuner.heuristic(other, "sm_90", dev)
    monkeypatch.setenv("INT4JIT_TUNE", "1")
    assert tuner.select_config(other, "sm_90", dev).tier == "tuned" and tuned == [True, False]
    # no device: heuristic, never a benchmark
    assert tuner.select_config(GemvShape(8, 64, 32, True), "sm_90", None).tier == "heuristic"


def test_stale_db_entry_is_retuned(monkeypatch, table):
    monkeypatch.setattr(tuner, "autotune", lambda shape, device, exhaustive=False: _record(LaunchConfig(256, 2)))
    TuningDB("sm_90").put(GemvShape(8, 64, 32, True), _record(LaunchConfig(64, 4), template="0" * 16))
    sel = tuner.select_config(GemvShape(8, 64, 32, True), "sm_90", FakeDevice())
    assert sel.tier == "tuned" and sel.config == LaunchConfig(256, 2)
    assert TuningDB("sm_90").get(GemvShape(8, 64, 32, True), compiler.template_hash()).config == LaunchConfig(256, 2)


@pytest.mark.parametrize("exhaustive", [False, True])
def test_heuristic_stays_inside_the_searched_grid(exhaustive):
    grid = set(candidate_grid(exhaustive))
    for N in (1, 7, 896, 4096, 28672, 128256):
        for K in (16, 896, 4096, 14336):
            for arch in ("sm_90", "gfx90a", "gfx1030"):
                assert tuner.heuristic(GemvShape(N, K, 16, False), arch, exhaustive=exhaustive) in grid


def test_heuristic_responds_to_the_hardware():
    """A model, not a constant: different shapes and machines get different picks."""
    picks = {tuner.heuristic(GemvShape(N, K, 128, False), "sm_90") for N, K in
             [(896, 896), (4096, 4096), (128256, 4096), (1, 14336), (4096, 14336)]}
    assert len(picks) >= 2
    small = tuner.DeviceModel(8, 1024, 65536, 32)
    big = tuner.DeviceModel(304, 2048, 65536, 64)
    s = GemvShape(2048, 2048, 128, False)
    effs = lambda m: [tuner.estimate_efficiency(s, c, m, "sm_90") for c in candidate_grid(True)]
    assert effs(small) != effs(big)
    assert all(0 < e <= 1 for e in effs(big))


# -- the DB ----------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"{not json", b"", b"[]", b'{"entries": 3}', b"\x00\xff" * 10,
                                     json.dumps({"schema": 99, "entries": {}}).encode()])
def test_corrupt_or_future_db_is_set_aside_with_a_warning(caplog, content):
    db = TuningDB("sm_90")
    db.path.parent.mkdir(parents=True, exist_ok=True)
    db.path.write_bytes(content)
    assert db.get(SHAPE, compiler.template_hash()) is None
    assert "unusable" in caplog.text
    assert not db.path.exists() and list(db.path.parent.glob("sm_90.json.corrupt-*"))
    db.put(SHAPE, _record(LaunchConfig(64, 2)))
    assert db.get(SHAPE, compiler.template_hash()).config == LaunchConfig(64, 2)


def test_db_keeps_every_candidate_and_metadata():
    rec = _record(LaunchConfig(64, 2))
    rec.candidates = {str(c): float(i) for i, c in enumerate(candidate_grid(False))}
    TuningDB("sm_90").put(SHAPE, rec)
    doc = json.loads(TuningDB("sm_90").path.read_text())
    entry = doc["entries"][SHAPE.key()]
    assert len(entry["candidates"]) == 9 and entry["template"] == compiler.template_hash()
    assert doc["arch"] == "sm_90" and entry["device"] == "test" and entry["compiler"] == "nvrtc-x"


def _writer(args):
    root, worker, n = args
    os.environ["INT4JIT_CACHE_DIR"] = root
    db = TuningDB("sm_90")
    for i in range(n):
        db.put(GemvShape(16 * (worker * n + i + 1), 64, 32, False), _record(LaunchConfig(64, 2), us=float(i)))
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
    pytest.importorskip("cuda.bindings.nvrtc")
    shape, cfg = GemvShape(256, 512, 64, False), LaunchConfig(64, 4)
    ck = compiler.compile_gemv(shape, cfg, "sm_90")
    TuningDB("sm_90").put(shape, _record(cfg))
    n = archive.export_cache(tmp_path / "c.tgz")
    assert n == 2
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path / "other"))
    summary = archive.import_cache(tmp_path / "c.tgz")
    assert summary["code_objects_added"] == 1 and summary["tuning_entries_merged"] == 1
    assert cache.read_code_object(compiler.code_object_path(ck.key)) == ck.binary
    assert TuningDB("sm_90").get(shape, compiler.template_hash()).config == cfg
    # importing again merges nothing new; a newer local entry is not overwritten
    TuningDB("sm_90").put(shape, _record(LaunchConfig(128, 2), date="2027-01-01T00:00:00+00:00"))
    again = archive.import_cache(tmp_path / "c.tgz")
    assert again["code_objects_added"] == 0 and again["tuning_entries_merged"] == 0
    assert TuningDB("sm_90").get(shape, compiler.template_hash()).config == LaunchConfig(128, 2)


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
from int4jit.shapes import GemvShape, LaunchConfig
from int4jit.tuning_db import TuningDB, TuningRecord
db = TuningDB("sm_90")
i = 0
while True:
    i += 1
    big = {str(j): float(j) for j in range(2000)}  # large entries: writes take a while
    db.put(GemvShape(16 * i, 64, 32, False), TuningRecord(64, 2, 1.0, big, "t", "d", "c", "2026"))
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


@pytest.mark.parametrize("shape", [GemvShape(4096, 4096, 128, False), GemvShape(128256, 4096, 32, True),
                                   GemvShape(7, 48, 16, False)])
def test_bench_buffers_rotate_enough_distinct_copies(shape):
    dev = RecordingDevice()
    bufs = tuner.BenchBuffers(dev, shape, seed=1)
    per_copy = shape.N * shape.K // 2 + 2 * shape.N * (shape.K // shape.group) + (0 if shape.symmetric else shape.N * (shape.K // shape.group))
    assert bufs.copies == min(64, max(2, -(-3 * dev.l2_bytes // per_copy)))
    assert len(bufs.sets) == bufs.copies
    addrs = [p for st in bufs.sets for p in st if p]
    assert len(set(addrs)) == len(addrs)  # every copy has its own memory: L2 cannot serve them
    assert bufs.copies * per_copy >= min(3 * dev.l2_bytes, 64 * per_copy)
    x, w, s, z = bufs.host
    assert w.shape == (shape.N, shape.K // 2) and s.dtype == np.float16 and (z is None) == shape.symmetric
    assert len(np.unique(w)) > 100 or w.size < 500  # random bytes, not zeros
    bufs.free()
    assert sorted(dev.freed) == sorted(dev.allocs)  # nothing leaked, nothing freed twice


@pytest.mark.parametrize("var,value", [("INT4JIT_TUNE", "sometimes"), ("INT4JIT_TRACE", "verbose"),
                                       ("MIGRAPHX_INT4_GEMV_TRACE", "2"), ("INT4JIT_EXHAUSTIVE_TUNE", "all"),
                                       ("INT4JIT_CONFIG", "256;4"), ("MIGRAPHX_INT4_GEMV_CONFIG", "os.system('x')")])
def test_every_malformed_variable_is_one_clear_error(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as info:
        tuner.select_config(GemvShape(1000, 2048, 64, True), "sm_90", FakeDevice())
    assert var in str(info.value) and value in str(info.value)
    assert str(info.value).count(var) == 1


def test_heuristic_models_the_tensor_core_kernel_too(monkeypatch):
    """With INT4JIT_KERNEL=mma the model reads that kernel's geometry: a valid pick for every
    shape, and not the same efficiencies as for gemv.hip."""
    shapes = [GemvShape(N, K, 128, False) for N, K in [(896, 896), (4096, 4096), (128256, 4096), (2048, 8192)]]
    model = tuner.device_model("sm_90")
    simt = [tuner.estimate_efficiency(s, c, model, "sm_90") for s in shapes for c in candidate_grid(True)]
    monkeypatch.setenv("INT4JIT_KERNEL", "mma")
    mma = [tuner.estimate_efficiency(s, c, model, "sm_90") for s in shapes for c in candidate_grid(True)]
    assert all(0 < e <= 1 for e in mma) and mma != simt
    for s in shapes:
        assert tuner.heuristic(s, "sm_90", exhaustive=True) in candidate_grid(True)
