"""Issue 20, classes 2, 3, 4 and 8 (CPU): the cache dir is this user's alone, `cache clear`
removes only int4jit's files, corrupt state is set aside and rebuilt, variables are checked."""
import json
import logging
import os
import stat

import pytest

from int4jit import archive, cache, cli, compiler, env, plan
from int4jit.backends import hip
from int4jit.errors import BackendUnavailable
from int4jit.shapes import GemvShape
from int4jit.tuning_db import DB_SCHEMA, TuningDB, TuningRecord

from conftest import require_compiler

SHAPE = GemvShape(256, 512, 32, False)
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
OTHER_UID = 12345


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    compiler._memo.clear()
    cache._warned.clear()
    cache._write_warned.clear()
    monkeypatch.setattr(cache, "_fallback_dir", None)
    monkeypatch.setattr(cache, "fallback_base", lambda: tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()


def build():
    return compiler.build(plan.plan(SHAPE, "sm_90", config=(64, 2)).spec)


def record(bs=64, tn=2, us=1.0, date="2026-01-01", **context):
    return TuningRecord({"BS": bs, "TN": tn}, us, {f"{bs},{tn}": us}, context, date)


# -- class 2: no code or data from another user --------------------------------------------
def _foreign(path):
    if not ROOT:
        pytest.skip("making a folder another user owns needs root (os.chown)")
    os.chown(path, OTHER_UID, OTHER_UID)


@pytest.mark.parametrize("how", ["other user", "other user via symlink", "group-writable", "world-writable"])
def test_cache_dir_not_private_is_refused(tmp_path, monkeypatch, caplog, how):
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    if how.startswith("other user"):
        _foreign(planted)
    else:
        planted.chmod(0o770 if how == "group-writable" else 0o777)
    target = planted
    if how.endswith("symlink"):
        target = tmp_path / "link"
        target.symlink_to(planted)
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(target))
    root = cache.cache_dir()
    assert root == tmp_path / "tmp" / f"int4jit-cache-{os.getuid()}"
    assert "owned by uid" in caplog.text or "writable by group or others" in caplog.text
    assert str(planted) in caplog.text


def test_objects_planted_in_a_foreign_cache_are_not_loaded(tmp_path, monkeypatch):
    require_compiler("cuda")
    planted = tmp_path / "planted"
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(planted))
    ck = build()  # compute the key in a private dir, then plant a different payload at it
    path = compiler.code_object_path(ck.key)
    evil = b"\x7fELF planted"
    path.write_bytes(cache.sha256(evil).encode() + evil)
    planted.chmod(0o777)
    compiler._memo.clear()
    assert build().binary != evil


def test_fallback_dir_is_one_private_dir_reused_across_runs(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(blocker / "cache"))
    first = cache.cache_dir()
    monkeypatch.setattr(cache, "_fallback_dir", None)  # a new process
    assert cache.cache_dir() == first == tmp_path / "tmp" / f"int4jit-cache-{os.getuid()}"
    assert stat.S_IMODE(first.stat().st_mode) == 0o700
    assert [p.name for p in (tmp_path / "tmp").iterdir()] == [first.name]


def test_fallback_dir_planted_by_another_user_is_not_used(tmp_path, monkeypatch, caplog):
    planted = tmp_path / "tmp" / f"int4jit-cache-{os.getuid()}"
    planted.mkdir(mode=0o700)
    _foreign(planted)
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path / "file" / "x"))
    (tmp_path / "file").write_text("")
    root = cache.cache_dir()
    assert root != planted and stat.S_IMODE(root.stat().st_mode) == 0o700


def test_cache_dirs_are_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path / "a" / "b"))
    TuningDB("sm_90").put("k", record())
    cache.write_code_object(cache.code_dir() / "ab" / ("ab" * 32 + ".bin"), b"\x7fELF x")
    for p in (tmp_path / "a" / "b", cache.code_dir(), cache.code_dir() / "ab", cache.db_dir()):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p


def test_tilde_in_cache_dir_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("INT4JIT_CACHE_DIR", "~/int4jit-cache")
    assert cache.cache_dir() == tmp_path / "int4jit-cache"
    assert not (tmp_path / "~").exists()


def _fake_distro_rocm(tmp_path, monkeypatch):
    lib = tmp_path / "libamdhip64.so.5"
    lib.write_bytes(b"")
    for var in ("ROCM_PATH", "ROCM_HOME"):  # set, then removed: monkeypatch restores the variable after
        monkeypatch.setenv(var, "")            # the test, also where _locate_rocm sets it
        monkeypatch.delenv(var)
    monkeypatch.setattr(hip, "_DISTRO_HIP", (str(lib),))
    monkeypatch.setattr(hip.os.path, "isdir", lambda p: False if p == "/opt/rocm/lib" else os.path.isdir.__wrapped__(p)
                        if hasattr(os.path.isdir, "__wrapped__") else os.path.exists(p) and stat.S_ISDIR(os.stat(p).st_mode))
    monkeypatch.setattr(hip, "_rocm_links", None)
    return lib


def test_rocm_links_live_in_a_private_folder_of_the_cache(tmp_path, monkeypatch):
    lib = _fake_distro_rocm(tmp_path, monkeypatch)
    hip._locate_rocm()
    root = os.environ["ROCM_PATH"]
    assert root == str(cache.cache_dir() / "rocm")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert os.readlink(os.path.join(root, "lib", "libhiprtc.so")) == str(lib)


def test_rocm_links_folder_open_to_others_is_refused(tmp_path, monkeypatch):
    _fake_distro_rocm(tmp_path, monkeypatch)
    rocm = cache.cache_dir() / "rocm"
    (rocm / "lib").mkdir(parents=True)
    planted = rocm / "lib" / "libhiprtc.so"
    planted.write_bytes(b"planted")
    rocm.chmod(0o777)
    with pytest.raises(BackendUnavailable, match="refusing the ROCm library folder"):
        hip._locate_rocm()
    assert "ROCM_PATH" not in os.environ


# -- class 3: cache clear removes only what int4jit wrote ------------------------------------
def _general_folder(root):
    (root / "code" / "myproject").mkdir(parents=True)
    (root / "code" / "myproject" / "main.py").write_text("print('mine')\n")
    (root / "tuning").mkdir(parents=True)
    (root / "tuning" / "notes.txt").write_text("notes\n")
    (root / "tuning" / "gfx90a.json.bak").write_text('{"my": "settings"}')
    fake = root / "code" / "ab" / ("ab" * 32 + ".bin")                         # a code object's name only
    fake.parent.mkdir()
    fake.write_bytes(b"not written by int4jit")
    return [root / "code" / "myproject" / "main.py", root / "tuning" / "notes.txt",
            root / "tuning" / "gfx90a.json.bak", fake]


def test_cache_clear_leaves_what_int4jit_did_not_write(tmp_path, monkeypatch, capsys):
    root = tmp_path / "general"
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(root))
    root.mkdir(mode=0o700)
    theirs = _general_folder(root)
    ours = cache.code_dir() / "cd" / ("cd" * 32 + ".bin")
    cache.write_code_object(ours, b"\x7fELF ours")
    TuningDB("gfx90a").put("k", record())
    assert cli.main(["cache", "list"]) == 0
    listed = capsys.readouterr().out
    assert "code objects: 1 " in listed and "main.py" not in listed
    assert cli.main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert all(p.exists() for p in theirs)
    assert not ours.exists() and not TuningDB("gfx90a").path.exists()
    assert "left 4 file(s)" in out and "main.py" in out and "notes.txt" in out


def test_a_file_with_a_db_name_that_is_no_db_is_set_aside_not_deleted(caplog):
    path = TuningDB("sm_90").path
    path.parent.mkdir(parents=True)
    path.write_text('{"my": "settings"}')
    assert cli.main(["cache", "list"]) == 0 and cli.main(["cache", "clear"]) == 0
    kept = list(path.parent.glob("sm_90.json*"))
    assert [p.read_text() for p in kept] == ['{"my": "settings"}']


def test_cache_clear_removes_temp_and_lock_files_and_leaves_set_aside_ones(monkeypatch):
    TuningDB("sm_90").put("k", record())
    key = "ef" * 32
    d = cache.code_dir() / key[:2]
    cache.write_code_object(d / f"{key}.bin", b"\x7fELF x")
    (d / f".{key}.bin.abc123.tmp").write_bytes(b"half")
    (d / f"{key}.bin.bad").write_bytes(b"bad")
    (cache.db_dir() / "sm_90.json.corrupt-1-2").write_bytes(b"{")
    removed, left = archive.clear_cache()
    assert len(removed) == 4  # code object, its temp file, the DB, its lock
    assert sorted(p.name for p in left) == sorted([f"{key}.bin.bad", "sm_90.json.corrupt-1-2"])


# -- class 4: no state breaks every later run ------------------------------------------------
def _doc(entry):
    return json.dumps({"schema": DB_SCHEMA, "arch": "sm_90", "entries": {"k": entry}}).encode()


GOOD = {"config": {"BS": 64, "TN": 2}, "us": 1.0, "candidates": {}, "context": {}, "date": "2026", "exhaustive": False}
CORRUPT_DBS = {
    "schema as a string": b'{"schema": "1", "entries": {}}',
    "entries a list": json.dumps({"schema": DB_SCHEMA, "entries": []}).encode(),
    "entry a list": _doc([64, 2]),
    "us a string": _doc({**GOOD, "us": "fast"}),
    "BS a float": _doc({**GOOD, "config": {"BS": 64.0, "TN": 2}}),
    "BS a bool": _doc({**GOOD, "config": {"BS": True, "TN": 2}}),
    "BS off the grid": _doc({**GOOD, "config": {"BS": 96, "TN": 2}}),
    "TN missing": _doc({**GOOD, "config": {"BS": 64}}),
    "variant a string": _doc({**GOOD, "config": {"BS": 64, "TN": 2, "streaming": "yes"}}),
    "us NaN": _doc({**GOOD, "us": float("nan")}),
    "us negative": _doc({**GOOD, "us": -1}),
    "candidate a string": _doc({**GOOD, "candidates": {"64,2": "fast"}}),
    "context a number": _doc({**GOOD, "context": {"device": 5}}),
    "exhaustive a string": _doc({**GOOD, "exhaustive": "no"}),
    "deep nesting": b"[" * 200_000 + b"]" * 200_000,
    "deep nesting in an entry": b'{"schema": 2, "entries": {"k": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
    "not JSON": b"\x00\xff garbage",
    "a JSON string": b'"sm_90"',
    "another arch's DB": json.dumps({"schema": DB_SCHEMA, "arch": "gfx90a", "entries": {}}).encode(),
}


@pytest.mark.parametrize("what", sorted(CORRUPT_DBS))
def test_corrupt_db_is_set_aside_once_and_rebuilt(what, caplog):
    db = TuningDB("sm_90")
    db.path.parent.mkdir(parents=True, exist_ok=True)
    db.path.write_bytes(CORRUPT_DBS[what])
    with caplog.at_level(logging.WARNING, logger="int4jit"):
        assert db.get("k", {}) is None
        assert db.entries() == {}
    assert caplog.text.count("is unusable") == 1
    assert len(list(db.path.parent.glob("sm_90.json.corrupt-*"))) == 1
    db.put("k", record(128, 4))
    assert db.get("k", {}).config == {"BS": 128, "TN": 4}


def test_schema_1_db_is_set_aside_quietly(caplog):
    db = TuningDB("sm_90")
    db.path.parent.mkdir(parents=True, exist_ok=True)
    db.path.write_text(json.dumps({"schema": 1, "entries": {"256x512/g32/asym": {"BS": 64, "TN": 2, "us": 1.0}}}))
    with caplog.at_level(logging.INFO, logger="int4jit"):
        assert db.entries() == {}
    assert "WARNING" not in caplog.text and "schema 1" in caplog.text
    assert not db.path.exists()


def test_record_from_another_context_is_stale(monkeypatch, caplog):
    monkeypatch.setenv("INT4JIT_TRACE", "1")
    db = TuningDB("sm_90")
    db.put("k", record(device="NVIDIA H200", template="abc"))
    assert db.get("k", {"device": "NVIDIA H200", "template": "abc"}).us == 1.0
    with caplog.at_level(logging.INFO, logger="int4jit"):
        assert db.get("k", {"device": "NVIDIA A100", "template": "abc"}) is None
    assert "stale: device differs" in caplog.text


@pytest.mark.parametrize("bad", [{"config": {"BS": 64.0, "TN": 2}, "us": 1.0}, {"config": {"BS": 64, "TN": 2}, "us": "1"},
                                 {"config": {"BS": 64, "TN": 2, "x y": 1}, "us": 1.0}])
def test_put_refuses_an_invalid_record(bad):
    with pytest.raises(ValueError):
        TuningDB("sm_90").put("k", bad)
    assert not TuningDB("sm_90").path.exists()


def _set_up_bad_code_object(kind):
    require_compiler("cuda")
    key = build().key
    compiler._memo.clear()
    path = compiler.code_object_path(key)
    path.unlink()
    if kind == "a directory":
        path.mkdir()
        (path / "something").write_text("x")
    elif kind == "code/ a file":
        import shutil
        shutil.rmtree(cache.code_dir())
        cache.code_dir().write_text("x")
    elif kind == "code/xx a file":
        path.parent.rmdir()
        path.parent.write_text("x")
    elif kind == "hash ok, not a code object":
        junk = b"this will not load" * 10
        path.write_bytes(cache.sha256(junk).encode() + junk)
    return key


@pytest.mark.parametrize("kind", ["a directory", "code/ a file", "code/xx a file", "hash ok, not a code object"])
def test_bad_code_object_entry_is_set_aside_and_rebuilt(kind, caplog):
    key = _set_up_bad_code_object(kind)
    ck = build()
    assert ck.binary[:4] == b"\x7fELF"
    assert cache.read_code_object(compiler.code_object_path(key)) == ck.binary  # rebuilt on disk
    assert "moved it to" in caplog.text


# -- class 8: the environment ---------------------------------------------------------------
@pytest.mark.parametrize("var,value", [("INT4JIT_TUNE", "maybe"), ("INT4JIT_PDL", "2"), ("INT4JIT_TRACE", "verbose"),
                                       ("MIGRAPHX_INT4_GEMV_TRACE", "perhaps"), ("ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "2"),
                                       ("INT4JIT_BACKEND", "rocm"), ("INT4JIT_KERNEL", "fast"),
                                       ("INT4JIT_CONFIG", "１２８,4"), ("INT4JIT_CONFIG", "128;4;"),
                                       ("MIGRAPHX_INT4_GEMV_CONFIG", "256,4x")])
@pytest.mark.parametrize("command", [["cache", "path"], ["warm", "--compile-only", "--shapes", "896x896"], ["info"]])
def test_every_command_rejects_a_malformed_variable(monkeypatch, capsys, var, value, command):
    monkeypatch.setenv(var, value)
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert var in err and "Traceback" not in err


def test_echoed_values_are_truncated(monkeypatch):
    monkeypatch.setenv("INT4JIT_TUNE", "x" * 5000)
    with pytest.raises(ValueError) as e:
        env.check_all()
    assert "INT4JIT_TUNE" in str(e.value) and len(str(e.value)) < 300


def test_parse_int_names_the_variable_for_non_ascii_digits():
    with pytest.raises(ValueError, match="INT4JIT_CONFIG"):
        env.parse_int("INT4JIT_CONFIG", "١٢٨")
    assert env.parse_int("INT4JIT_CONFIG", " 128 ") == 128
