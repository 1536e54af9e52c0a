"""Every environment variable int4jit reads, parsed at call time (never frozen)."""
from __future__ import annotations

import os

# canonical name -> aliases, read in order; the first one set wins.
ALIASES: dict[str, tuple[str, ...]] = {
    "INT4JIT_CONFIG": ("INT4JIT_CONFIG", "MIGRAPHX_INT4_GEMV_CONFIG"),
    "INT4JIT_EXHAUSTIVE_TUNE": ("ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "INT4JIT_EXHAUSTIVE_TUNE"),
    "INT4JIT_TRACE": ("INT4JIT_TRACE", "MIGRAPHX_INT4_GEMV_TRACE"),
    "INT4JIT_TUNE": ("INT4JIT_TUNE",),
    "INT4JIT_BACKEND": ("INT4JIT_BACKEND",),
    "INT4JIT_CACHE_DIR": ("INT4JIT_CACHE_DIR",),
    "INT4JIT_KERNEL": ("INT4JIT_KERNEL",),
    "INT4JIT_PDL": ("INT4JIT_PDL",),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_lookup(name: str) -> tuple[str, str] | None:
    """(the variable actually set, its value) among `name`'s aliases, or None."""
    for var in ALIASES.get(name, (name,)):
        value = os.environ.get(var)
        if value is not None:
            return var, value
    return None


def env_str(name: str, default: str | None = None) -> str | None:
    found = env_lookup(name)
    return default if found is None else found[1]


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean variable: 1/true/yes/on or 0/false/no/off/empty, case-insensitive."""
    found = env_lookup(name)
    if found is None:
        return default
    var, value = found
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"environment variable {var}={value!r} is not a boolean: "
                     f"expected one of 1/true/yes/on or 0/false/no/off or empty")


def env_choice(name: str, choices: tuple[str, ...]) -> str | None:
    found = env_lookup(name)
    if found is None or found[1].strip() == "":
        return None
    var, value = found
    v = value.strip().lower()
    if v not in choices:
        raise ValueError(f"environment variable {var}={value!r}: expected one of {', '.join(choices)}")
    return v
