"""This machine's tuning results: one JSON file per arch under the cache dir.

File: {"schema": 2, "int4jit": version, "arch": arch, "entries": {key: record}}, a record being
TuningRecord's fields. Rewritten whole, atomically, under a file lock. Every file is validated
against the schema on load (types, ranges, the (BS, TN) grid, size and nesting) before any
number in it can reach a kernel; a corrupt or foreign file is set aside with one warning and
rebuilt, never fatal. A record carries the context it was measured in (template hash, device,
compiler, package version, ...); get() treats a record whose context differs as absent."""
from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock

from . import cache
from ._version import __version__
from .shapes import EXHAUSTIVE_GRID_BS, EXHAUSTIVE_GRID_TN
from .trace import trace

log = logging.getLogger("int4jit")
DB_SCHEMA = 2
MAX_DB_BYTES = 32 << 20       # a DB larger than this is not one int4jit wrote
MAX_ENTRIES = 100_000
MAX_CANDIDATES = 1024
MAX_STR = 512                 # keys, context values, dates
MAX_INT = 1 << 31             # config values are launch parameters, |v| < 2^31
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_ARCH = re.compile(r"^(sm_[0-9]{2,3}[af]?|gfx[0-9]{1,2}[0-9a-f]{2})$")


class InvalidTuningDB(ValueError):
    """A DB file or record that does not match the schema; the message says where."""


@dataclass
class TuningRecord:
    """The winner for one key on one arch.
    config: launch geometry and variant fields, str -> int | bool (BS, TN in the grid);
    us: its time; candidates: candidate label -> us, or None when it failed;
    context: what changes the answer (template hash, device, compiler, package version, ...);
    date: ISO time it was measured; exhaustive: measured over the 20-point grid."""
    config: dict
    us: float
    candidates: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)
    date: str = ""
    exhaustive: bool = False

    def __post_init__(self):
        check_record(asdict(self), "record")

    @property
    def BS(self) -> int:
        return self.config["BS"]

    @property
    def TN(self) -> int:
        return self.config["TN"]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d) -> "TuningRecord":
        """A record from its JSON form; InvalidTuningDB (a ValueError) naming the bad field."""
        d = check_record(d, "record")
        return cls(**d)


# -- validation --------------------------------------------------------------------------
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _check_str(v, where: str) -> str:
    if not isinstance(v, str) or len(v) > MAX_STR:
        raise InvalidTuningDB(f"{where} must be a string of at most {MAX_STR} characters; got {_kind(v)}")
    return v


def _kind(v) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def check_config(config, where: str = "config") -> dict:
    """config: {identifier: int | bool}, BS and TN ints in the exhaustive grid."""
    if not isinstance(config, dict) or not 2 <= len(config) <= 64:
        raise InvalidTuningDB(f"{where} must be an object of 2 to 64 fields; got {_kind(config)}")
    for k, v in config.items():
        if not isinstance(k, str) or not _IDENT.match(k):
            raise InvalidTuningDB(f"{where}: field name {_kind(k)} is not a short identifier")
        if not (isinstance(v, bool) or (_is_int(v) and -MAX_INT < v < MAX_INT)):
            raise InvalidTuningDB(f"{where}.{k} must be an integer or a boolean; got {_kind(v)}")
    for k, grid in (("BS", EXHAUSTIVE_GRID_BS), ("TN", EXHAUSTIVE_GRID_TN)):
        v = config.get(k)
        if not _is_int(v) or v not in grid:
            raise InvalidTuningDB(f"{where}.{k} must be an integer in {grid}; got {_kind(v)}")
    return config


def check_record(d, where: str) -> dict:
    """The record's fields, type-checked; InvalidTuningDB naming the first bad one."""
    if not isinstance(d, dict):
        raise InvalidTuningDB(f"{where} must be an object; got {_kind(d)}")
    fields = ("config", "us", "candidates", "context", "date", "exhaustive")
    unknown = sorted(set(d) - set(fields), key=str)
    if unknown:
        raise InvalidTuningDB(f"{where} has unknown field(s) {unknown[:3]}")
    for f in ("config", "us"):
        if f not in d:
            raise InvalidTuningDB(f"{where} has no '{f}'")
    check_config(d["config"], f"{where}.config")
    us = d["us"]
    if not _is_num(us) or us <= 0:
        raise InvalidTuningDB(f"{where}.us must be a positive finite number; got {_kind(us)}")
    cands = d.get("candidates", {})
    if not isinstance(cands, dict) or len(cands) > MAX_CANDIDATES:
        raise InvalidTuningDB(f"{where}.candidates must be an object of at most {MAX_CANDIDATES} entries")
    for k, v in cands.items():
        _check_str(k, f"{where}.candidates key")
        if v is not None and (not _is_num(v) or v < 0):
            raise InvalidTuningDB(f"{where}.candidates[{k[:40]!r}] must be a time in us or null; got {_kind(v)}")
    ctx = d.get("context", {})
    if not isinstance(ctx, dict) or len(ctx) > 64:
        raise InvalidTuningDB(f"{where}.context must be an object of at most 64 strings")
    for k, v in ctx.items():
        if not isinstance(k, str) or not _IDENT.match(k):
            raise InvalidTuningDB(f"{where}.context: field name {_kind(k)} is not a short identifier")
        _check_str(v, f"{where}.context.{k}")
    _check_str(d.get("date", ""), f"{where}.date")
    if not isinstance(d.get("exhaustive", False), bool):
        raise InvalidTuningDB(f"{where}.exhaustive must be true or false; got {_kind(d.get('exhaustive'))}")
    return {"config": dict(d["config"]), "us": float(us),
            "candidates": {k: (None if v is None else float(v)) for k, v in cands.items()},
            "context": dict(ctx), "date": d.get("date", ""), "exhaustive": d.get("exhaustive", False)}


def parse_db(raw: bytes, arch: str | None = None) -> tuple[int, dict]:
    """(schema, {key: validated entry}) from a DB file's bytes. InvalidTuningDB for anything
    that is not a DB of this or an older schema; a newer schema comes back with no entries."""
    if len(raw) > MAX_DB_BYTES:
        raise InvalidTuningDB(f"{len(raw)} bytes, over the {MAX_DB_BYTES} limit")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except RecursionError:  # the C decoder refuses deep nesting this way; every valid field is shallow
        raise InvalidTuningDB("JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidTuningDB(f"not JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict):
        raise InvalidTuningDB(f"the document must be an object; got {type(doc).__name__}")
    schema = doc.get("schema")
    if not _is_int(schema) or schema < 1:
        raise InvalidTuningDB(f"'schema' must be a positive integer; got {_kind(schema)}")
    if schema > DB_SCHEMA:
        return schema, {}
    if arch is not None and doc.get("arch", arch) != arch:
        raise InvalidTuningDB(f"it is the DB of {_kind(doc.get('arch'))}, not of {arch}")
    entries = doc.get("entries")
    if not isinstance(entries, dict):
        raise InvalidTuningDB(f"'entries' must be an object; got {_kind(entries)}")
    if schema < DB_SCHEMA:
        return schema, {}
    if len(entries) > MAX_ENTRIES:
        raise InvalidTuningDB(f"more than {MAX_ENTRIES} entries")
    out = {}
    for key, rec in entries.items():
        _check_str(key, "entry key")
        out[key] = check_record(rec, f"entry {key[:60]!r}")
    return schema, out


# -- files -------------------------------------------------------------------------------
def db_path(arch: str, root: Path | None = None) -> Path:
    return (root or cache.db_dir()) / f"{arch}.json"


def is_db_name(name: str) -> bool:
    """Whether a file name is one a tuning DB has (<arch>.json)."""
    return name.endswith(".json") and bool(_ARCH.match(name[:-5]))


def _lock(path: Path) -> FileLock:
    cache.make_private_dirs(path.parent)
    return FileLock(str(path) + ".lock", timeout=60, mode=0o600)


def _set_aside(path: Path, raw: bytes, why: str, quiet: bool = False):
    """Move a DB that is unusable out of the way (under the lock, and only if it still holds
    what was judged, so a good file another process just wrote is never moved)."""
    suffix = "old-schema" if quiet else "corrupt"
    dest = path.with_name(f"{path.name}.{suffix}-{int(time.time())}-{os.getpid()}")
    try:
        with _lock(path):
            if path.read_bytes() != raw:
                return
            os.replace(path, dest)
    except (OSError, TimeoutError) as e:  # read-only dir, lock timeout: use nothing from it, say so
        log.warning("int4jit: tuning DB %s is unusable (%s) and could not be moved aside (%s); ignoring it",
                    path, why, e)
        return
    (log.info if quiet else log.warning)(
        "int4jit: tuning DB %s %s; moved it to %s and starting afresh", path,
        why if quiet else f"is unusable ({why})", dest)


def read_db(path: Path, arch: str | None = None) -> dict:
    """{key: validated entry} from one DB file; {} when missing, unreadable, of another
    schema or corrupt (a corrupt or old file is set aside)."""
    try:
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a directory")
        with open(path, "rb") as f:
            raw = f.read(MAX_DB_BYTES + 1)
    except FileNotFoundError:
        return {}
    except IsADirectoryError:
        log.warning("int4jit: tuning DB path %s is a directory, not a file; ignoring it", path)
        return {}
    except OSError as e:  # unreadable (permissions, I/O error): run without it, never fail a call
        log.warning("int4jit: cannot read tuning DB %s (%s); ignoring it", path, e)
        return {}
    try:
        schema, entries = parse_db(raw, arch)
    except InvalidTuningDB as e:
        _set_aside(path, raw, str(e))
        return {}
    if schema > DB_SCHEMA:
        trace("tuning DB %s has schema %d, newer than this int4jit's %d: not used", path, schema, DB_SCHEMA)
    elif schema < DB_SCHEMA:
        _set_aside(path, raw, f"has schema {schema}, whose records lack the context they were measured in",
                   quiet=True)
    return entries


def _key(key) -> str:
    # Transitional: tuner.py still passes a GemvShape (its .key() is the old key).
    return key if isinstance(key, str) else key.key()


class TuningDB:
    """Per-arch tuning DB. Reads are lock-free (files are replaced atomically)."""

    def __init__(self, arch: str, root: Path | None = None):
        self.arch = arch
        self.path = db_path(arch, root)

    def entries(self) -> dict[str, dict]:
        """{key: validated record as a dict}."""
        return read_db(self.path, self.arch)

    def get(self, key: str, context: dict[str, str]) -> TuningRecord | None:
        """The stored record for `key`, or None when absent or when any field of `context`
        differs from the record's (traced: a stale record is re-tuned, not used)."""
        key = _key(key)
        if isinstance(context, str):  # transitional: the old call passed the template hash
            context = {"template": context}
        raw = self.entries().get(key)
        if raw is None:
            return None
        stored = raw["context"]
        for field_name, now in context.items():
            if stored.get(field_name) != now:
                trace("tuning DB %s: %s is stale: %s differs (stored %r, now %r)", self.path.name, key,
                      field_name, stored.get(field_name), now)
                return None
        return TuningRecord(**raw)

    def put_many(self, records: dict[str, TuningRecord | dict], overwrite: bool = True) -> int:
        """Merge records in one locked read-modify-write. With overwrite=False an existing
        entry is kept unless the new one is newer (by date). Returns how many were written.
        Every record is validated first (InvalidTuningDB, nothing written)."""
        new = {}
        for key, rec in records.items():
            key = _check_str(_key(key), "key")
            new[key] = check_record(rec.to_json() if isinstance(rec, TuningRecord) else rec, f"record {key[:60]!r}")
        with _lock(self.path):
            entries = read_db(self.path, self.arch)
            written = 0
            for key, rec in new.items():
                old = entries.get(key)
                if old is not None and not overwrite and old["date"] >= rec["date"]:
                    continue
                entries[key] = rec
                written += 1
            if written:
                doc = {"schema": DB_SCHEMA, "int4jit": __version__, "arch": self.arch, "entries": entries}
                cache.atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
            return written

    def put(self, key: str, rec: TuningRecord | dict):
        self.put_many({key: rec})
