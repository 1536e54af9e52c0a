"""Move a cache between machines as one archive: code objects + tuning DBs.
Import validates every member before it touches the cache, so a rejected archive
leaves the cache as it was; tuning entries merge, newer-dated entries win."""
from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

from . import cache
from .tuning_db import TuningDB, TuningRecord

MANIFEST = "manifest.json"
_CODE = re.compile(r"^code/[0-9a-f]{2}/[0-9a-f]{64}\.bin$")
_DB = re.compile(r"^tuning/(sm_[0-9]{2,3}[af]?|gfx[0-9a-f]{3,4})\.json$")
MAX_MEMBER = 64 << 20
MAX_TOTAL = 1 << 30
MAX_MEMBERS = 100_000


class ArchiveError(ValueError):
    """The archive is not one int4jit wrote, or was tampered with; nothing was imported."""


def export_cache(path) -> int:
    """Write every valid code object and tuning DB into a .tar.gz; returns members written."""
    root = cache.cache_dir()
    files = {}
    for p in sorted((root / "code").glob("*/*.bin")):
        rel = p.relative_to(root).as_posix()
        if _CODE.match(rel) and cache.read_code_object(p) is not None:
            files[rel] = p.read_bytes()
    for p in sorted((root / "tuning").glob("*.json")):
        rel = p.relative_to(root).as_posix()
        if _DB.match(rel):
            entries = TuningDB(p.stem).entries()
            files[rel] = json.dumps({"schema": 1, "arch": p.stem, "entries": entries}, sort_keys=True).encode()
    manifest = {"int4jit_cache": 1, "files": {k: cache.sha256(v) for k, v in files.items()}}
    with tarfile.open(path, "w:gz") as tar:
        for name, data in [(MANIFEST, json.dumps(manifest, indent=1).encode()), *files.items()]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return len(files)


def _read_members(path) -> dict[str, bytes]:
    try:
        tar = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise ArchiveError(f"{path}: not a readable tar archive ({e})") from None
    out, total = {}, 0
    with tar:
        for n, m in enumerate(tar):
            if n >= MAX_MEMBERS:
                raise ArchiveError(f"{path}: more than {MAX_MEMBERS} members")
            name = m.name
            if name.startswith("/") or ".." in Path(name).parts or "\\" in name:
                raise ArchiveError(f"{path}: member {name!r} escapes the cache dir (absolute path or '..')")
            if not m.isfile():
                kind = "link" if (m.issym() or m.islnk()) else "device/special file" if (m.isdev() or m.isfifo()) else "directory"
                raise ArchiveError(f"{path}: member {name!r} is a {kind}; only regular files are accepted")
            if name != MANIFEST and not (_CODE.match(name) or _DB.match(name)):
                raise ArchiveError(f"{path}: unexpected member {name!r}")
            if m.size > MAX_MEMBER:
                raise ArchiveError(f"{path}: member {name!r} is {m.size} bytes, over the {MAX_MEMBER} limit")
            total += m.size
            if total > MAX_TOTAL:
                raise ArchiveError(f"{path}: archive unpacks to more than {MAX_TOTAL} bytes")
            if name in out:
                raise ArchiveError(f"{path}: member {name!r} appears twice")
            out[name] = tar.extractfile(m).read()
    return out


def import_cache(path) -> dict:
    """Validate then merge an archive into the cache. Raises ArchiveError, changing nothing,
    when any member is unsafe or does not match its hash."""
    members = _read_members(path)
    try:
        manifest = json.loads(members.pop(MANIFEST))
        hashes = manifest["files"]
    except (KeyError, ValueError, TypeError):
        raise ArchiveError(f"{path}: missing or invalid {MANIFEST}") from None
    if set(hashes) != set(members):
        raise ArchiveError(f"{path}: manifest lists {sorted(set(hashes) ^ set(members))[:3]} inconsistently")
    dbs = {}
    for name, data in members.items():
        if cache.sha256(data) != hashes[name]:
            raise ArchiveError(f"{path}: member {name!r} does not match its hash")
        if _CODE.match(name):
            digest, payload = data[:64], data[64:]
            if digest.decode("ascii", "replace") != cache.sha256(payload):
                raise ArchiveError(f"{path}: code object {name!r} fails its content hash")
        else:
            try:
                entries = json.loads(data)["entries"]
                records = {k: TuningRecord.from_json(v) for k, v in entries.items()}
            except (KeyError, ValueError, TypeError) as e:
                raise ArchiveError(f"{path}: tuning DB {name!r} is invalid ({e})") from None
            dbs[_DB.match(name).group(1)] = records
    root = cache.cache_dir()
    written = 0
    for name, data in members.items():
        if _CODE.match(name) and cache.read_code_object(root / name) is None:
            cache.atomic_write(root / name, data)
            written += 1
    merged = sum(TuningDB(arch).put_many(recs, overwrite=False) for arch, recs in dbs.items())
    return {"code_objects_added": written, "tuning_entries_merged": merged,
            "tuning_dbs": sorted(dbs), "archive": str(path)}
