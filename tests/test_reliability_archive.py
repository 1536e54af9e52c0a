"""Issue 20, class 5 (CPU): cache import bounds memory and time whatever the headers say,
rejects malformed archives, manifests and DBs with ArchiveError, and leaves the cache as it
was. Property tests mutate valid archives and DB files."""
import gzip
import io
import json
import os
import tarfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from int4jit import archive, cache
from int4jit.tuning_db import DB_SCHEMA, TuningDB, TuningRecord

KEY = "ab" * 32
PAYLOAD = b"\x7fELF" + bytes(range(256)) * 2
ENTRY = {"config": {"BS": 64, "TN": 2, "streaming": True}, "us": 1.5, "candidates": {"64,2": 1.5, "128,4": None},
         "context": {"template": "t", "device": "d"}, "date": "2026-01-01", "exhaustive": False}


def snapshot():
    root = cache.cache_dir()
    return sorted((str(p.relative_to(root)), p.read_bytes() if p.is_file() else None) for p in root.rglob("*"))


def tar_bytes(members, fmt=tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def members(db_doc=None, manifest=None):
    code = cache.sha256(PAYLOAD).encode() + PAYLOAD
    db = json.dumps(db_doc or {"schema": DB_SCHEMA, "arch": "sm_90", "entries": {"k": ENTRY}}).encode()
    files = {f"code/{KEY[:2]}/{KEY}.bin": code, "tuning/sm_90.json": db}
    man = manifest if manifest is not None else {"int4jit_cache": 1, "files": {n: cache.sha256(d) for n, d in files.items()}}
    return [*files.items(), ("manifest.json", json.dumps(man).encode())]


def write(tmp_path, raw: bytes, name="a.tgz"):
    (tmp_path / name).write_bytes(raw)
    return tmp_path / name


def expect_rejected(path, match=None):
    before = snapshot()
    with pytest.raises(archive.ArchiveError, match=match):
        archive.import_cache(path)
    assert snapshot() == before
    assert not list(cache.cache_dir().glob(cache.IMPORT_STAGING + "*"))


def test_valid_archive_imports(tmp_path):
    s = archive.import_cache(write(tmp_path, gzip.compress(tar_bytes(members()))))
    assert s["code_objects_added"] == 1 and s["tuning_entries_merged"] == 1
    assert TuningDB("sm_90").get("k", {"device": "d"}).config["streaming"] is True


# -- bounded whatever the headers say -------------------------------------------------------
def test_huge_pax_header_is_refused_without_reading_it(tmp_path):
    """A pax header claiming 256 MB of zeros: a 250 kB archive that tarfile reads whole into memory."""
    hdr = tarfile.TarInfo("././@PaxHeader")
    hdr.type, hdr.size = tarfile.XHDTYPE, 256 << 20
    raw = hdr.tobuf(tarfile.USTAR_FORMAT) + bytes(256 << 20)
    t0 = time.perf_counter()
    expect_rejected(write(tmp_path, gzip.compress(raw, 1)), "pax extended header")
    assert time.perf_counter() - t0 < 5


def test_total_uncompressed_size_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_TOTAL", 20_000)
    big = [(f"code/{k[:2]}/{k}.bin", b"\0" * 6000) for k in ("c" * 64, "d" * 64, "e" * 64, "f" * 64)]
    expect_rejected(write(tmp_path, gzip.compress(tar_bytes(big))), "unpacks to more than 20000 bytes")


def test_zero_padding_after_the_end_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_TOTAL", 1 << 20)
    raw = tar_bytes(members()) + bytes(4 << 20)
    expect_rejected(write(tmp_path, gzip.compress(raw, 1)), "unpacks to more than")


def test_member_over_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBER", 100)
    expect_rejected(write(tmp_path, gzip.compress(tar_bytes(members()))), "over the 100 limit")


def test_truncated_gzip(tmp_path):
    raw = gzip.compress(tar_bytes(members()))
    expect_rejected(write(tmp_path, raw[: len(raw) - 6]), "truncated|corrupt")


def test_header_claiming_data_that_is_not_there(tmp_path):
    raw = tar_bytes(members())
    expect_rejected(write(tmp_path, gzip.compress(raw[:1024])), "truncated")
    expect_rejected(write(tmp_path, raw[:700], "plain.tar"), "truncated")


def test_data_after_the_end(tmp_path):
    expect_rejected(write(tmp_path, gzip.compress(tar_bytes(members()) + b"garbage")), "after the end")


def test_corrupt_header_checksum(tmp_path):
    raw = bytearray(tar_bytes(members()))
    raw[10] ^= 1  # inside the first member's name
    expect_rejected(write(tmp_path, gzip.compress(bytes(raw))), "checksum")


@pytest.mark.parametrize("manifest,match", [
    ("not json", "not valid JSON"), ([1, 2], "not an int4jit cache manifest"),
    ({"files": [1]}, "not an int4jit cache manifest"), ({"int4jit_cache": "1", "files": {}}, "not an int4jit"),
    ({"int4jit_cache": 1, "files": {f"code/{KEY[:2]}/{KEY}.bin": 5, "tuning/sm_90.json": "x"}}, "64 hex"),
    ({"int4jit_cache": 1, "files": {}}, "disagree"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
])
def test_malformed_manifest(tmp_path, manifest, match):
    m = members()
    data = manifest.encode() if isinstance(manifest, str) else json.dumps(manifest).encode()
    m[-1] = ("manifest.json", data)
    expect_rejected(write(tmp_path, gzip.compress(tar_bytes(m))), match)


@pytest.mark.parametrize("entry", [{**ENTRY, "us": "fast"}, {**ENTRY, "config": {"BS": 64.0, "TN": 2}},
                                   {**ENTRY, "config": {"BS": 64, "TN": True}}, [1, 2]])
def test_invalid_db_member(tmp_path, entry):
    doc = {"schema": DB_SCHEMA, "arch": "sm_90", "entries": {"k": entry}}
    expect_rejected(write(tmp_path, gzip.compress(tar_bytes(members(doc)))), "tuning DB")


def test_deeply_nested_db_member(tmp_path):
    m = members()
    deep = b"[" * 100_000 + b"]" * 100_000
    m[1] = ("tuning/sm_90.json", deep)
    m[-1] = ("manifest.json", json.dumps({"files": {m[0][0]: cache.sha256(m[0][1]),
                                                    m[1][0]: cache.sha256(deep)}}).encode())
    expect_rejected(write(tmp_path, gzip.compress(tar_bytes(m))), "nested too deeply")


def test_export_to_a_missing_folder_leaves_nothing(tmp_path):
    with pytest.raises(OSError):
        archive.export_cache(tmp_path / "missing" / "x.tgz")
    archive.export_cache(tmp_path / "x.tgz")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".x.tgz")] == []


# -- properties ---------------------------------------------------------------------------
VALID_TAR = tar_bytes(members())
VALID_GZ = gzip.compress(VALID_TAR)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def mutate(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for kind, pos, value in edits:
        if not b:
            break
        i = pos % len(b)
        if kind == 0:
            b[i] = value
        elif kind == 1:
            del b[i:i + 1 + value % 64]
        elif kind == 2:
            b[i:i] = bytes([value]) * (1 + value % 8)
        else:
            b = b[:i]
    return bytes(b)


edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=4)


def check_import(raw: bytes, where):
    path = where / "m.tgz"
    path.write_bytes(raw)
    before = snapshot()
    t0 = time.perf_counter()
    try:
        archive.import_cache(path)
    except archive.ArchiveError:
        assert snapshot() == before
    assert time.perf_counter() - t0 < 10
    assert not list(cache.cache_dir().glob(cache.IMPORT_STAGING + "*"))
    for p in cache.code_dir().rglob("*.bin"):  # whatever was imported is whole
        assert cache.verify_code_object(p.read_bytes()) is not None
    for k, e in TuningDB("sm_90").entries().items():
        TuningRecord(**e)


@FAST
@given(edits=edits, compressed=st.booleans())
def test_mutated_archives_import_or_are_rejected(tmp_path_factory, edits, compressed):
    where = tmp_path_factory.mktemp("a")
    raw = mutate(VALID_GZ, edits) if compressed else gzip.compress(mutate(VALID_TAR, edits))
    check_import(raw, where)


def _valid_db() -> bytes:
    return json.dumps({"schema": DB_SCHEMA, "arch": "sm_90", "entries": {"k": ENTRY, "k2": ENTRY}}, indent=1).encode()


@FAST
@given(edits=edits)
def test_mutated_db_files_are_used_or_set_aside(edits):
    db = TuningDB("sm_90")
    db.path.parent.mkdir(parents=True, exist_ok=True)
    for p in db.path.parent.glob("sm_90.json*"):
        p.unlink()
    db.path.write_bytes(mutate(_valid_db(), edits))
    rec = db.get("k", {})
    assert rec is None or isinstance(rec, TuningRecord)
    for e in db.entries().values():
        TuningRecord(**e)
    db.put("k3", TuningRecord({"BS": 128, "TN": 4}, 2.0, {}, {}, "2026"))  # never stays broken
    assert db.get("k3", {}).us == 2.0


@FAST
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                        max_leaves=20))
def test_arbitrary_json_in_an_archive_db_member(tmp_path_factory, doc):
    where = tmp_path_factory.mktemp("j")
    m = members()
    data = json.dumps({"schema": DB_SCHEMA, "entries": {"k": doc}}).encode()
    m[1] = ("tuning/sm_90.json", data)
    m[-1] = ("manifest.json", json.dumps({"files": {m[0][0]: cache.sha256(m[0][1]), m[1][0]: cache.sha256(data)}}).encode())
    check_import(gzip.compress(tar_bytes(m)), where)
