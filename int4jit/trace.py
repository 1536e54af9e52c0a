"""INT4JIT_TRACE: route int4jit's decisions to logging at INFO, read at call time."""
from __future__ import annotations

import logging

from .env import env_flag

log = logging.getLogger("int4jit")


def tracing() -> bool:
    return env_flag("INT4JIT_TRACE")


def trace(msg: str, *args):
    """Log a decision (tier chosen, cache hit/miss, compile and tune times) when tracing is on."""
    if tracing():
        if not log.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[int4jit] %(message)s"))
            log.addHandler(handler)
        if log.level == logging.NOTSET or log.level > logging.INFO:
            log.setLevel(logging.INFO)
        log.info(msg, *args)
