"""Cache location and atomic, private file writes shared by the code-object store and
the tuning DB. Files are written to a temp name and os.replace()d into place, so a
reader never sees half a file, and a process killed mid-write leaves only a temp file.

The cache dir holds code that gets loaded into the process, so it must be this user's
alone: it is created 0700, and a dir owned by another user or writable by group or others
is refused (as ssh and git's safe.directory do), with one warning, in favour of one private
fallback dir per user that every later run reuses."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from .env import env_path

log = logging.getLogger("int4jit")
_fallback_lock = threading.Lock()
_fallback_dir: Path | None = None
_warned: set = set()

CODE_NAME = re.compile(r"^[0-9a-f]{64}\.bin$")
_HEX64 = re.compile(rb"^[0-9a-f]{64}$")
SET_ASIDE = ".bad"           # a code object that failed its check: <key>.bin.bad
IMPORT_STAGING = ".int4jit-import-"


class UnsafeCacheDir(OSError):
    """A cache dir that another user could write to."""


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else -1


def check_private(path: Path, strict: bool = False) -> None:
    """UnsafeCacheDir unless `path` is a real directory (not a symlink) owned by this user
    and not writable by group or others (strict: no access for them at all)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDir(f"{path} is not a directory")
    if _uid() >= 0 and st.st_uid != _uid():
        raise UnsafeCacheDir(f"{path} is owned by uid {st.st_uid}, not by this user (uid {_uid()}); "
                             f"int4jit loads code from its cache, so it uses only a dir you own")
    bad = 0o077 if strict else 0o022
    if st.st_mode & bad:
        raise UnsafeCacheDir(f"{path} is {'accessible' if strict else 'writable'} by group or others "
                             f"(mode {stat.S_IMODE(st.st_mode):o}); int4jit loads code from its cache, so "
                             f"it needs a private dir (chmod go-w {path}, or chmod 700)")


def _usable(root: Path) -> None:
    """Create `root` (0700) if missing, then check it is private and writable; OSError if not."""
    make_private_dirs(root)
    check_private(root)
    if not os.access(root, os.W_OK | os.X_OK):
        raise PermissionError(f"{root} is not writable")


def configured_cache_dir() -> Path:
    """INT4JIT_CACHE_DIR (with ~ expanded and symlinks resolved), else the user cache dir."""
    value = env_path("INT4JIT_CACHE_DIR")
    return Path(value).resolve() if value else Path(platformdirs.user_cache_dir("int4jit"))


def fallback_base() -> Path:
    return Path(tempfile.gettempdir())


def _fallback() -> Path:
    """One private fallback dir per user, reused by every run; a fresh temporary dir only
    when even that one is unsafe."""
    global _fallback_dir
    with _fallback_lock:
        if _fallback_dir is None:
            path = fallback_base() / f"int4jit-cache-{_uid()}"
            try:
                try:
                    os.mkdir(path, 0o700)
                except FileExistsError:
                    pass
                check_private(path, strict=True)
                _fallback_dir = path
            except OSError as e:
                _fallback_dir = Path(tempfile.mkdtemp(prefix="int4jit-cache-"))
                log.warning("int4jit: the fallback cache dir is unusable too (%s); using %s for this process",
                            e, _fallback_dir)
        return _fallback_dir


def cache_dir() -> Path:
    """INT4JIT_CACHE_DIR, else the user cache dir, when it is private and writable; else the
    per-user fallback dir (one warning per refused dir and process)."""
    root = configured_cache_dir()
    try:
        _usable(root)
        return root
    except OSError as e:
        reason = str(e) if isinstance(e, UnsafeCacheDir) else (e.strerror or str(e))
    fallback = _fallback()
    if str(root) not in _warned:
        _warned.add(str(root))
        log.warning("int4jit: cache dir %s is unusable (%s); using %s instead", root, reason, fallback)
    return fallback


def _subdir(name: str) -> Path:
    """cache_dir()/name; anything but a directory there (a file, a link) is set aside."""
    path = cache_dir() / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISDIR(st.st_mode):
        set_aside(path, "it is not a directory")
    return path


def code_dir() -> Path:
    return _subdir("code")


def db_dir() -> Path:
    return _subdir("tuning")


def make_private_dirs(path: Path):
    """mkdir -p with every folder it creates 0700 (os.makedirs gives the parents the umask's mode)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            if not p.is_dir():
                raise


@contextlib.contextmanager
def replaced_atomically(path: Path):
    """Yield an open private (0600) temp file beside `path`; on success it is renamed onto
    `path` (readers never see half a file), on any error it is removed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write(path: Path, data: bytes):
    """Write `data` to `path` via a private temp file in the same folder + os.replace."""
    make_private_dirs(path.parent)
    with replaced_atomically(path) as f:
        f.write(data)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def set_aside(path: Path, why: str):
    """Move something unusable that sits where int4jit wants to write out of the way, with one
    warning: `<name>.bad` (or a unique name when that is taken)."""
    dest = path.with_name(path.name + SET_ASIDE)
    try:
        if os.path.lexists(dest):
            dest = Path(tempfile.mkdtemp(prefix=path.name + SET_ASIDE + "-", dir=path.parent)) / path.name
        os.replace(path, dest)
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("int4jit: %s is unusable (%s) and could not be moved aside (%s)", path, why, e)
        return
    log.warning("int4jit: %s is unusable (%s); moved it to %s and rebuilding", path, why, dest)


# Code objects: file = 64 hex chars of sha256(payload) + payload (an ELF: a cubin or an AMD code
# object), so truncation, garbage and foreign files are caught before the driver sees the bytes.
def verify_code_object(blob: bytes) -> bytes | None:
    """The payload of a code-object file's bytes, or None when it fails its content hash or
    is not an ELF (cubin or AMD code object)."""
    digest, payload = blob[:64], blob[64:]
    if len(blob) > 64 and payload[:4] == b"\x7fELF" and digest.decode("ascii", "replace") == sha256(payload):
        return payload
    return None


def read_code_object(path: Path) -> bytes | None:
    """The payload at `path`, or None when it is missing or fails its check (the bad entry,
    file or directory, is then set aside so it is rebuilt)."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # code/<xx> is a file: move it so the entry can be written
        if os.path.lexists(path.parent) and not path.parent.is_dir():
            set_aside(path.parent, "it is not a directory")
        return None
    except IsADirectoryError:
        set_aside(path, "a directory where a code object belongs")
        return None
    except OSError as e:  # unreadable: rebuild it (the write replaces it)
        log.warning("int4jit: cannot read cached code object %s (%s); rebuilding it", path, e)
        return None
    payload = verify_code_object(blob)
    if payload is None:
        set_aside(path, "cached code object fails its content hash or is not a code object")
    return payload


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
        if path.is_dir() and not path.is_symlink():
            set_aside(path, "a directory where a code object belongs")
        atomic_write(path, sha256(payload).encode() + payload)
        return True
    except OSError as e:
        warn_write_failure(path, e)
        return False


def discard(path: Path):
    """Remove a code object that failed to load (it is rebuilt); a directory is set aside."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):
        if path.is_dir():
            set_aside(path, "a directory where a code object belongs")


def dir_size(path: Path) -> tuple[int, int]:
    """(files, bytes) under path."""
    files = size = 0
    if path.is_dir():
        for p in path.rglob("*"):
            if p.is_file() and not p.is_symlink():
                files += 1
                size += p.stat().st_size
    return files, size


# -- what int4jit wrote: listing and clearing ---------------------------------------------
def is_code_object_file(path: Path) -> bool:
    """A code object int4jit wrote: code/<2 hex>/<64 hex>.bin whose first 64 bytes are a
    lowercase hex digest (the header int4jit writes)."""
    if not (CODE_NAME.match(path.name) and path.parent.name == path.name[:2]
            and path.is_file() and not path.is_symlink()):
        return False
    try:
        with open(path, "rb") as f:
            return bool(_HEX64.match(f.read(64)))
    except OSError:
        return False


@dataclass(frozen=True)
class CodeObjectInfo:
    path: Path
    key: str
    size: int
    arch: str          # "?" when the binary does not say
    kernel: str        # the int4jit kernel's symbol, "?" when none is found
    valid: bool


_KERNEL = re.compile(rb"int4jit_[a-z0-9]+_n[0-9]+_k[0-9]+_g[0-9]+[as]_bs[0-9]+_tn[0-9]+")
_AMD_ARCH = re.compile(rb"amdgcn-amd-amdhsa--(gfx[0-9a-f]+)")
_NV_ARCH = re.compile(rb"(sm_[0-9]{2,3}[af]?)(?![0-9A-Za-z])")


def code_object_info(path: Path) -> CodeObjectInfo:
    blob = path.read_bytes()
    payload = verify_code_object(blob)
    kernel = _KERNEL.search(blob)
    arch = _AMD_ARCH.search(blob) or _NV_ARCH.search(blob)
    return CodeObjectInfo(path, path.name[:-4], len(blob), arch.group(1).decode() if arch else "?",
                          kernel.group(0).decode() if kernel else "?", payload is not None)


def list_code_objects() -> list[CodeObjectInfo]:
    root = code_dir()
    if not root.is_dir():
        return []
    return [code_object_info(p) for p in sorted(root.glob("*/*.bin")) if is_code_object_file(p)]
