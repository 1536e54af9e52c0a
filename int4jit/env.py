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
# What each variable holds: check_all() parses every one of them this way.
FLAGS = ("INT4JIT_EXHAUSTIVE_TUNE", "INT4JIT_TRACE", "INT4JIT_TUNE", "INT4JIT_PDL")
CHOICES: dict[str, tuple[str, ...]] = {
    "INT4JIT_BACKEND": ("cuda", "hip"),
    "INT4JIT_KERNEL": ("auto", "simt", "tc"),
}
SHOWN_CHARS = 60  # an echoed value is cut to this many characters

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def shown(value: str) -> str:
    """repr() of a value for an error message, cut to SHOWN_CHARS characters."""
    if len(value) > SHOWN_CHARS:
        return repr(value[:SHOWN_CHARS]) + f"... ({len(value)} characters)"
    return repr(value)


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


def parse_flag(var: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"environment variable {var}={shown(value)} is not a boolean: "
                     f"expected one of 1/true/yes/on or 0/false/no/off or empty")


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean variable: 1/true/yes/on or 0/false/no/off/empty, case-insensitive."""
    found = env_lookup(name)
    return default if found is None else parse_flag(*found)


def parse_choice(var: str, value: str, choices: tuple[str, ...]) -> str | None:
    v = value.strip().lower()
    if v == "":
        return None
    if v not in choices:
        raise ValueError(f"environment variable {var}={shown(value)}: expected one of {', '.join(choices)}")
    return v


def env_choice(name: str, choices: tuple[str, ...]) -> str | None:
    found = env_lookup(name)
    return None if found is None else parse_choice(*found, choices)


def parse_int(var: str, text: str, what: str = "a number") -> int:
    """An integer written in ASCII digits (int() also takes '١٢٨' or '１２８'); a ValueError
    naming the variable otherwise."""
    t = text.strip()
    if not (t.isascii() and t.isdigit()):
        raise ValueError(f"environment variable {var}: {shown(text)} is not {what} (ASCII digits 0-9)")
    return int(t)


def env_path(name: str) -> str | None:
    """A path variable with '~' expanded; None when unset or empty."""
    value = env_str(name)
    if value is None or not value.strip():
        return None
    return os.path.expanduser(value.strip())


def check_all() -> None:
    """Parse every int4jit variable that is set (every alias, shadowed or not): a ValueError
    naming the first malformed one. Commands call it at startup so that a bad value is an
    error whichever command runs, not only in the commands that happen to read it."""
    for name, aliases in ALIASES.items():
        for var in aliases:
            value = os.environ.get(var)
            if value is None:
                continue
            if name in FLAGS:
                parse_flag(var, value)
            elif name in CHOICES:
                parse_choice(var, value, CHOICES[name])
            elif name == "INT4JIT_CONFIG" and not value.isascii():
                # the grammar itself is the tuner's (tuner.parse_override); digits must be ASCII
                raise ValueError(f"environment variable {var}={shown(value)}: only ASCII characters "
                                 f"are allowed (e.g. '256,4' or '4096:4096=256,4;*=128,8')")
            elif name == "INT4JIT_CACHE_DIR" and value.strip() and "\0" in value:
                raise ValueError(f"environment variable {var}={shown(value)} is not a path")
