"""Pieces both backends share: the checked-call helper and event timing."""
from __future__ import annotations

import statistics

from ..errors import DriverError


def status_name(err) -> str:
    return getattr(err, "name", None) or str(err)


def make_check(backend: str):
    """A checked-call helper: unwrap a binding's `(status, *values)` tuple (or a bare status),
    raise DriverError naming the call and the status on failure."""
    def check(result, call: str):
        if not isinstance(result, tuple):
            result = (result,)
        err, *values = result
        if int(err) != 0:
            raise DriverError(backend, call, status_name(err))
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)
    return check


def median_event_ms(events, run, repeats: int) -> float:
    """Median of `repeats` timings of run() between two device events, in ms.
    `events` gives create() -> event, record(event), wait(event), elapsed(a, b), destroy(event)."""
    start, stop = events.create(), events.create()
    try:
        times = []
        for _ in range(repeats):
            events.record(start)
            run()
            events.record(stop)
            events.wait(stop)
            times.append(events.elapsed(start, stop))
        return statistics.median(times)
    finally:
        events.destroy(start)
        events.destroy(stop)
