"""Cache location and atomic, private file writes shared by the code-object store and
the tuning DB. Files are written to a temp name and os.replace()d into place, so a
reader never sees half a file, and a process killed mid-write leaves only a temp file."""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path

import platformdirs

from .env import env_str

log = logging.getLogger("int4jit")
_fallback_lock = threading.Lock()
_fallback_dir: Path | None = None


def cache_dir() -> Path:
    """INT4JIT_CACHE_DIR, else the user cache dir; a temporary one (with one warning)
    when neither can be created or written."""
    global _fallback_dir
    root = Path(env_str("INT4JIT_CACHE_DIR") or platformdirs.user_cache_dir("int4jit"))
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.access(root, os.W_OK | os.X_OK):
            return root
        reason = "it is not writable"
    except OSError as e:
        reason = str(e)
    with _fallback_lock:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="int4jit-cache-"))
            log.warning("int4jit: cache dir %s is unusable (%s); using %s for this process",
                        root, reason, _fallback_dir)
        return _fallback_dir


def code_dir() -> Path:
    return cache_dir() / "code"


def db_dir() -> Path:
    return cache_dir() / "tuning"


def atomic_write(path: Path, data: bytes):
    """Write `data` to `path` via a private temp file in the same folder + os.replace."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp makes the file 0600
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Code objects: file = 64 hex chars of sha256(payload) + payload, so truncation or garbage is
# caught before the driver sees the bytes.
def read_code_object(path: Path) -> bytes | None:
    """The payload at `path`, or None when it is missing or fails its content hash
    (the bad file is then removed so it is rebuilt)."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    digest, payload = blob[:64], blob[64:]
    if len(blob) > 64 and digest.decode("ascii", "replace") == sha256(payload):
        return payload
    log.warning("int4jit: cached code object %s is corrupt (content hash mismatch); rebuilding", path)
    discard(path)
    return None


_write_warned: set = set()


def warn_write_failure(what: Path, error: OSError):
    """A cache that cannot be written (full disk, read-only) costs speed, never a result:
    warn once per cache dir and carry on."""
    key = str(cache_dir())
    if key not in _write_warned:
        _write_warned.add(key)
        log.warning("int4jit: could not write %s (%s); continuing without caching it", what, error)


def write_code_object(path: Path, payload: bytes) -> bool:
    try:
        atomic_write(path, sha256(payload).encode() + payload)
        return True
    except OSError as e:
        warn_write_failure(path, e)
        return False


def discard(path: Path):
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def dir_size(path: Path) -> tuple[int, int]:
    """(files, bytes) under path."""
    files = size = 0
    if path.exists():
        for p in path.rglob("*"):
            if p.is_file():
                files += 1
                size += p.stat().st_size
    return files, size
