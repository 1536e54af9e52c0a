"""Manage the cache as a whole: clear what int4jit wrote, and move a cache between machines as
one archive (code objects + tuning DBs).

Import reads the archive as a stream with its own small tar reader (regular files only,
ustar headers, checksums checked), so memory and time are bounded whatever the headers say:
one member in memory at most (MAX_MEMBER), MAX_TOTAL decompressed bytes in all, MAX_MEMBERS
members. Members are staged in a private folder inside the cache dir and every one is
validated (manifest hash, the cache's own code-object check, the tuning DB schema) before
anything moves into the cache, so a rejected archive leaves the cache as it was. Tuning
entries merge; newer-dated entries win."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

from . import cache
from .tuning_db import DB_SCHEMA, InvalidTuningDB, TuningDB, is_db_name, parse_db

MANIFEST = "manifest.json"
_CODE = re.compile(r"^code/([0-9a-f]{2})/([0-9a-f]{64})\.bin$")
_DB = re.compile(r"^tuning/(sm_[0-9]{2,3}[af]?|gfx[0-9]{1,2}[0-9a-f]{2})\.json$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
MAX_MEMBER = 64 << 20          # bytes of one member
MAX_TOTAL = 512 << 20          # decompressed bytes of the whole archive, headers included
MAX_MEMBERS = 100_000
MAX_MANIFEST = 16 << 20
CHUNK = 1 << 20
BLOCK = 512


class ArchiveError(ValueError):
    """The archive is not one int4jit wrote, or was tampered with; nothing was imported."""


# -- export --------------------------------------------------------------------------------
def export_cache(path) -> int:
    """Write every valid code object and tuning DB into a .tar.gz (written to a temp file and
    renamed, so a failed export leaves no partial archive); returns the members written."""
    path = Path(path)
    code = [p for p in cache.list_code_objects() if p.valid]
    dbs = {}
    db_root = cache.db_dir()
    if db_root.is_dir():
        for p in sorted(db_root.glob("*.json")):
            if _DB.match(f"tuning/{p.name}"):
                entries = TuningDB(p.stem).entries()
                if entries:
                    dbs[f"tuning/{p.name}"] = json.dumps({"schema": DB_SCHEMA, "arch": p.stem, "entries": entries},
                                                         sort_keys=True).encode()
    hashes = {}
    with cache.replaced_atomically(path) as raw, \
            tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.USTAR_FORMAT) as tar:
        def add(name: str, data: bytes):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
            hashes[name] = cache.sha256(data)
        for info in code:
            add(f"code/{info.key[:2]}/{info.key}.bin", info.path.read_bytes())
        for name, data in dbs.items():
            add(name, data)
        files = dict(hashes)
        add(MANIFEST, json.dumps({"int4jit_cache": 1, "files": files}, indent=1, sort_keys=True).encode())
    return len(files)


# -- import: a bounded stream reader -------------------------------------------------------
class _Budget:
    """Reads from the decompressed stream, never more than MAX_TOTAL bytes in all."""

    def __init__(self, stream, where: str):
        self.stream, self.where, self.used = stream, where, 0

    def read(self, n: int, what: str) -> bytes:
        if self.used + n > MAX_TOTAL:
            raise ArchiveError(f"{self.where}: archive unpacks to more than {MAX_TOTAL} bytes")
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self.stream.read(min(CHUNK, n - len(out)))
            except EOFError:
                raise ArchiveError(f"{self.where}: truncated (the compressed stream ends early, in {what})") from None
            except (OSError, zlib.error) as e:
                raise ArchiveError(f"{self.where}: corrupt compressed data ({e}) in {what}") from None
            if not chunk:
                raise ArchiveError(f"{self.where}: truncated: {what} claims {n} bytes, the archive has {len(out)}")
            out += chunk
        self.used += n
        return bytes(out)

    def drain(self):
        """Read to the end (so gzip checks its CRC and length); only zero padding may follow."""
        while True:
            try:
                chunk = self.stream.read(CHUNK)
            except EOFError:
                raise ArchiveError(f"{self.where}: truncated (the compressed stream ends early)") from None
            except (OSError, zlib.error) as e:
                raise ArchiveError(f"{self.where}: corrupt compressed data ({e})") from None
            if not chunk:
                return
            self.used += len(chunk)
            if self.used > MAX_TOTAL:
                raise ArchiveError(f"{self.where}: archive unpacks to more than {MAX_TOTAL} bytes")
            if chunk.count(0) != len(chunk):
                raise ArchiveError(f"{self.where}: data after the end of the archive")


def _octal(field: bytes, what: str, where: str) -> int:
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    if not re.fullmatch(rb"[0-7]+", text):
        raise ArchiveError(f"{where}: corrupt tar header ({what} {field!r})")
    return int(text, 8)


_KIND = {b"1": "link", b"2": "link", b"3": "device/special file", b"4": "device/special file",
         b"6": "device/special file", b"5": "directory", b"x": "pax extended header",
         b"g": "pax global header", b"L": "GNU long name", b"K": "GNU long link name"}


def _members(budget: _Budget, where: str):
    """(name, size) of each member in turn; the caller reads the data through budget."""
    count = 0
    while True:
        header = budget.read(BLOCK, "a member header")
        if header.count(0) == BLOCK:
            return
        stored = _octal(header[148:156], "checksum", where)
        if stored != sum(header[:148]) + 8 * 32 + sum(header[156:]):
            raise ArchiveError(f"{where}: corrupt tar header (checksum mismatch)")
        count += 1
        if count > MAX_MEMBERS:
            raise ArchiveError(f"{where}: more than {MAX_MEMBERS} members")
        raw_name = header[:100].split(b"\0", 1)[0]
        if header[257:262] == b"ustar" and header[345:500].strip(b"\0"):
            raw_name = header[345:500].split(b"\0", 1)[0] + b"/" + raw_name
        try:
            name = raw_name.decode("ascii")
        except UnicodeDecodeError:
            raise ArchiveError(f"{where}: member name {raw_name[:60]!r} is not ASCII") from None
        if name.startswith("/") or ".." in name.split("/") or "\\" in name:
            raise ArchiveError(f"{where}: member {name!r} escapes the cache dir (absolute path or '..')")
        kind = header[156:157]
        if kind not in (b"0", b"\0"):
            raise ArchiveError(f"{where}: member {name!r} is a {_KIND.get(kind, f'type {kind!r} member')}; "
                               f"only regular files are accepted")
        if name != MANIFEST and not (_CODE.match(name) or _DB.match(name)):
            raise ArchiveError(f"{where}: unexpected member {name!r}")
        if header[124] & 0x80:
            raise ArchiveError(f"{where}: member {name!r} is over the {MAX_MEMBER} limit")
        size = _octal(header[124:136], "size", where)
        limit = MAX_MANIFEST if name == MANIFEST else MAX_MEMBER
        if size > limit:
            raise ArchiveError(f"{where}: member {name!r} is {size} bytes, over the {limit} limit")
        yield name, size


def _open_stream(path: Path):
    f = open(path, "rb")
    if f.read(2) == b"\x1f\x8b":
        f.seek(0)
        return f, gzip.GzipFile(fileobj=f, mode="rb")
    f.seek(0)
    return f, f


def _stage(path: Path, staging: Path) -> dict[str, tuple[Path, str]]:
    """Stream the archive's members into `staging`: {name: (file, sha256)}."""
    where = str(path)
    try:
        raw, stream = _open_stream(path)
    except OSError as e:
        raise ArchiveError(f"{where}: cannot read it ({e.strerror or e})") from None
    out = {}
    with raw:
        budget = _Budget(stream, where)
        for name, size in _members(budget, where):
            if name in out:
                raise ArchiveError(f"{where}: member {name!r} appears twice")
            dest, h, left = staging / str(len(out)), hashlib.sha256(), size
            with open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                while left:
                    chunk = budget.read(min(CHUNK, left), f"member {name!r}")
                    h.update(chunk)
                    f.write(chunk)
                    left -= len(chunk)
            budget.read(-size % BLOCK, f"member {name!r}")
            out[name] = (dest, h.hexdigest())
        budget.drain()
    return out


def _manifest(data: bytes, where: str) -> dict[str, str]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        raise ArchiveError(f"{where}: {MANIFEST} is not valid JSON") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or doc.get("int4jit_cache", 1) != 1 or isinstance(doc.get("int4jit_cache"), bool):
        raise ArchiveError(f"{where}: {MANIFEST} is not an int4jit cache manifest "
                           f"(expected {{\"int4jit_cache\": 1, \"files\": {{name: sha256}}}})")
    for name, digest in files.items():
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise ArchiveError(f"{where}: {MANIFEST} gives {name[:80]!r} a hash that is not 64 hex digits")
    return files


def import_cache(path) -> dict:
    """Validate then merge an archive into the cache. Raises ArchiveError, changing nothing,
    when any member is unsafe, malformed or does not match its hash."""
    path = Path(path)
    where = str(path)
    root = cache.cache_dir()
    staging = Path(tempfile.mkdtemp(prefix=cache.IMPORT_STAGING, dir=root))
    try:
        members = _stage(path, staging)
        if MANIFEST not in members:
            raise ArchiveError(f"{where}: missing {MANIFEST}")
        hashes = _manifest(members.pop(MANIFEST)[0].read_bytes(), where)
        if set(hashes) != set(members):
            odd = sorted(set(hashes) ^ set(members))
            raise ArchiveError(f"{where}: manifest and members disagree on {len(odd)} file(s), e.g. {odd[0][:80]!r}")
        code, dbs, skipped = [], {}, []
        for name, (file, digest) in members.items():
            if digest != hashes[name]:
                raise ArchiveError(f"{where}: member {name!r} does not match its hash")
            data = file.read_bytes()
            if _CODE.match(name):
                if cache.verify_code_object(data) is None:
                    raise ArchiveError(f"{where}: code object {name!r} fails its content hash")
                code.append((name, file))
                continue
            arch = _DB.match(name).group(1)
            try:
                schema, entries = parse_db(data, arch)
            except InvalidTuningDB as e:
                raise ArchiveError(f"{where}: tuning DB {name!r} is invalid ({e})") from None
            if schema != DB_SCHEMA:
                skipped.append(f"{name}: schema {schema}, this int4jit reads {DB_SCHEMA}")
            elif entries:
                dbs[arch] = entries
        added = 0
        code_root = cache.code_dir()
        for name, file in code:
            dest = code_root / name[len("code/"):]
            if cache.read_code_object(dest) is None:
                cache.make_private_dirs(dest.parent)
                os.replace(file, dest)
                added += 1
        merged = sum(TuningDB(arch).put_many(recs, overwrite=False) for arch, recs in dbs.items())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"code_objects_added": added, "code_objects_present": len(code) - added,
            "tuning_entries_merged": merged, "tuning_dbs": sorted(dbs), "skipped": skipped, "archive": where}


# -- clear -------------------------------------------------------------------------------
_TMP = re.compile(r"^\..+\.[A-Za-z0-9_]+\.tmp$")      # cache.atomic_write's temp files
# Set-aside files (<db>.corrupt-*, <key>.bin.bad) hold content int4jit judged not its own: left.
_DB_LEFTOVER = re.compile(r"^(sm_[0-9]{2,3}[af]?|gfx[0-9]{1,2}[0-9a-f]{2})\.json\.lock$")


def _is_ours(path: Path, area: str) -> bool:
    name = path.name
    if path.is_symlink() or not path.is_file():
        return False
    if area == "code":
        if _TMP.match(name) and cache.CODE_NAME.match(name[1:].split(".bin.")[0] + ".bin"):
            return True
        return cache.is_code_object_file(path)
    if _DB_LEFTOVER.match(name):
        return True
    if _TMP.match(name) and is_db_name(name[1:].split(".json.")[0] + ".json"):
        return True
    if is_db_name(name):
        try:
            with open(path, "rb") as f:
                parse_db(f.read())
            return True
        except (InvalidTuningDB, OSError):
            return False
    return False


def clear_cache() -> tuple[list[Path], list[Path]]:
    """Remove what int4jit wrote (code objects, tuning DBs and their locks, temp files, import
    staging dirs); leave everything else, set-aside files included. Returns (removed, left)."""
    root = cache.cache_dir()
    removed, left = [], []
    for area in ("code", "tuning"):
        top = root / area
        if not top.is_dir() or top.is_symlink():
            if os.path.lexists(top):
                left.append(top)
            continue
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            here = Path(dirpath)
            for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
                p = here / name
                if _is_ours(p, area):
                    p.unlink()
                    removed.append(p)
                else:
                    left.append(p)
            try:
                here.rmdir()  # only when empty: a folder holding anything else stays
            except OSError:
                pass
    for p in root.glob(cache.IMPORT_STAGING + "*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed, left
