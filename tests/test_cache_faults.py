"""Broken caches: every fault ends with a correct result and a rebuilt entry or one warning."""
import errno
import os
import stat

import pytest

from int4jit import cache, compiler, plan, tuner
from int4jit.shapes import GemvShape, LaunchConfig
from int4jit.tuning_db import TuningDB, TuningRecord

from conftest import require_compiler

SHAPE, CFG = GemvShape(256, 512, 32, False), LaunchConfig(64, 2)


def compile_gemv(shape, cfg, arch):
    return compiler.build(plan.plan(shape, arch, config=(cfg.BS, cfg.TN)).spec)


def record(bs=64, tn=2, us=1.0, **context):
    return TuningRecord({"BS": bs, "TN": tn}, us, {f"{bs},{tn}": us}, context, "2026")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    require_compiler("cuda")
    compiler._memo.clear()
    cache._write_warned.clear()
    monkeypatch.setattr(cache, "_fallback_dir", None)


def test_full_disk_during_write_still_compiles(monkeypatch, caplog):
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(cache, "atomic_write", full)
    ck = compile_gemv(SHAPE, CFG, "sm_90")
    assert ck.binary[:4] == b"\x7fELF"
    compiler._memo.clear()
    compile_gemv(GemvShape(256, 1024, 32, False), CFG, "sm_90")
    assert caplog.text.count("No space left") == 1  # one warning, not one per kernel


def test_tiny_disk_leaves_no_partial_file(tmp_path, monkeypatch, caplog):
    """A real short write: the file system accepts a few bytes then fails."""
    real_fdopen = os.fdopen

    class Short:
        def __init__(self, f):
            self.f = f
        def __enter__(self):
            return self
        def __exit__(self, *a):
            self.f.close()
        def write(self, data):
            self.f.write(data[:100])
            raise OSError(errno.ENOSPC, "No space left on device")
        def flush(self):
            pass
        def fileno(self):
            return self.f.fileno()

    monkeypatch.setattr(cache.os, "fdopen", lambda fd, mode: Short(real_fdopen(fd, mode)))
    ck = compile_gemv(SHAPE, CFG, "sm_90")
    assert ck.binary[:4] == b"\x7fELF"
    path = compiler.code_object_path(ck.key)
    assert not path.exists() and not list(path.parent.glob("*.tmp"))


@pytest.mark.skipif(os.geteuid() == 0 and not os.environ.get("INT4JIT_TEST_AS_ROOT_RO"),
                    reason="root ignores directory permissions; covered by the unwritable-path test")
def test_read_only_cache_dir(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(ro))
    assert cache.cache_dir() != ro


def test_cache_dir_that_cannot_be_created(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(blocker / "cache"))
    root = cache.cache_dir()
    assert root != blocker / "cache" and root.is_dir()
    assert caplog.text.count("is unusable") == 1
    ck = compile_gemv(SHAPE, CFG, "sm_90")
    assert compiler.code_object_path(ck.key).is_file()
    assert str(compiler.code_object_path(ck.key)).startswith(str(root))
    cache.cache_dir()
    assert caplog.text.count("is unusable") == 1  # warned once


def test_files_are_private(tmp_path):
    ck = compile_gemv(SHAPE, CFG, "sm_90")
    path = compiler.code_object_path(ck.key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o077 == 0
    db = TuningDB("sm_90")
    db.put(SHAPE.key(), record(template="t"))
    assert stat.S_IMODE(db.path.stat().st_mode) == 0o600


def test_db_write_failure_does_not_fail_selection(monkeypatch, caplog):
    class Dev:
        arch, name, sm_count, max_threads_per_sm, regs_per_sm, warp_size = "sm_90", "x", 132, 2048, 65536, 32
        supports_overlap = True

    def fake_autotune(shape, kernel, device, exhaustive=False, pdl=False):
        specs = tuner.grid_specs(shape, "sm_90", kernel, device, exhaustive, pdl)
        win = next(s for s in specs if s.config == LaunchConfig(128, 4))
        return TuningRecord({"BS": 128, "TN": 4}, 2.0, {win.label(): 2.0}, {}, "2026"), win
    monkeypatch.setattr(tuner, "autotune", fake_autotune)

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(TuningDB, "put", full)
    p = plan.plan(GemvShape(1000, 2048, 64, True), "sm_90", Dev())
    assert p.spec.config == LaunchConfig(128, 4) and "No space left" in caplog.text


def test_unreadable_db_is_ignored_with_a_warning(monkeypatch, caplog):
    from int4jit import tuning_db
    db = TuningDB("sm_90")
    db.put(SHAPE.key(), record(template="t"))

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(tuning_db, "open", denied, raising=False)
    assert db.get(SHAPE.key(), {"template": "t"}) is None
    assert "cannot read tuning DB" in caplog.text
