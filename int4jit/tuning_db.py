"""This machine's tuning results: one JSON file per arch under the cache dir.
Rewritten whole, atomically, under a file lock; a corrupt file is set aside, never fatal."""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock

from . import cache
from ._version import __version__
from .shapes import GemvShape, LaunchConfig

log = logging.getLogger("int4jit")
DB_SCHEMA = 1


@dataclass
class TuningRecord:
    """The winner for one shape on one arch, with every candidate's time (None = failed)."""
    BS: int
    TN: int
    us: float
    candidates: dict = field(default_factory=dict)   # "BS,TN" -> us or None
    template: str = ""
    device: str = ""
    compiler: str = ""
    date: str = ""
    exhaustive: bool = False

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig(self.BS, self.TN)

    @classmethod
    def from_json(cls, d: dict) -> "TuningRecord":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        rec = cls(**known)
        LaunchConfig(rec.BS, rec.TN)  # validates
        return rec


def db_path(arch: str, root: Path | None = None) -> Path:
    return (root or cache.db_dir()) / f"{arch}.json"


def _set_aside(path: Path, why: str):
    dest = path.with_name(f"{path.name}.corrupt-{int(time.time())}-{os.getpid()}")
    try:
        os.replace(path, dest)
    except FileNotFoundError:
        return
    log.warning("int4jit: tuning DB %s is unusable (%s); moved it to %s and starting afresh", path, why, dest)


def read_db(path: Path) -> dict:
    """{shape key: raw entry} from one DB file; {} when missing; set aside when corrupt."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:  # unreadable (permissions, I/O error): run without it, never fail a call
        log.warning("int4jit: cannot read tuning DB %s (%s); ignoring it", path, e)
        return {}
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
            raise ValueError("no 'entries' object")
        if doc.get("schema", 0) > DB_SCHEMA:
            raise ValueError(f"written by a newer int4jit (schema {doc.get('schema')}, this one reads {DB_SCHEMA})")
        return doc["entries"]
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        _set_aside(path, str(e))
        return {}


class TuningDB:
    """Per-arch tuning DB. Reads are lock-free (files are replaced atomically)."""

    def __init__(self, arch: str, root: Path | None = None):
        self.arch = arch
        self.path = db_path(arch, root)

    def _lock(self) -> FileLock:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return FileLock(str(self.path) + ".lock", timeout=60)

    def entries(self) -> dict:
        return read_db(self.path)

    def get(self, shape: GemvShape, template: str) -> TuningRecord | None:
        """The stored record, or None when absent, malformed or tuned for another template."""
        raw = self.entries().get(shape.key())
        if raw is None:
            return None
        try:
            rec = TuningRecord.from_json(raw)
        except (TypeError, ValueError) as e:
            log.warning("int4jit: ignoring malformed tuning entry %s in %s: %s", shape.key(), self.path, e)
            return None
        return rec if rec.template == template else None

    def put_many(self, records: dict[str, TuningRecord | dict], overwrite: bool = True) -> int:
        """Merge records in one locked read-modify-write. With overwrite=False an existing
        entry is kept unless the new one is newer (by date). Returns how many were written."""
        with self._lock():
            entries = read_db(self.path)
            written = 0
            for key, rec in records.items():
                new = asdict(rec) if isinstance(rec, TuningRecord) else dict(rec)
                old = entries.get(key)
                if old is not None and not overwrite and str(old.get("date", "")) >= str(new.get("date", "")):
                    continue
                entries[key] = new
                written += 1
            doc = {"schema": DB_SCHEMA, "int4jit": __version__, "arch": self.arch, "entries": entries}
            cache.atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
            return written

    def put(self, shape: GemvShape, rec: TuningRecord):
        self.put_many({shape.key(): rec})
