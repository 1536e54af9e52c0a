"""Exceptions int4jit raises. Validation errors are plain ValueError/TypeError."""
from __future__ import annotations


class Int4JitError(RuntimeError):
    """Base class for int4jit's runtime failures (compiler, driver, cache)."""


class BackendUnavailable(Int4JitError):
    """No usable GPU backend: the binding is missing, or no device is present."""


class DriverError(Int4JitError):
    """A driver or runtime call returned an error status."""

    def __init__(self, backend: str, call: str, status: str):
        self.backend, self.call, self.status = backend, call, status
        super().__init__(f"{backend}: {call} failed with {status}")


class CompileError(Int4JitError):
    """The runtime compiler rejected a kernel; carries the log and the source."""

    def __init__(self, backend: str, arch: str, options, log: str, source: str, name: str):
        self.backend, self.arch, self.options = backend, arch, list(options)
        self.log, self.source, self.name = log, source, name
        super().__init__(self._message())

    def _message(self) -> str:
        head = (f"{self.backend} could not compile {self.name} for {self.arch} "
                f"(options: {' '.join(self.options)})")
        return f"{head}\n--- compiler log ---\n{self.log.strip()}\n{self._context()}"

    def _context(self, around: int = 3) -> str:
        """The source lines around the first line the log points at."""
        import re
        # NVRTC names the source; hiprtc (comgr) calls it CompileSource.
        m = re.search("(?:" + re.escape(self.name) + r"|CompileSource)[:(](\d+)", self.log)
        if not m:
            return ""
        lines = self.source.splitlines()
        at = int(m.group(1))
        lo, hi = max(1, at - around), min(len(lines), at + around)
        body = "\n".join(f"{'>' if i == at else ' '}{i:5d} | {lines[i - 1]}" for i in range(lo, hi + 1))
        return f"--- {self.name} around line {at} ---\n{body}"
