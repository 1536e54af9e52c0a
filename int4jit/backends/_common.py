"""Pieces both backends share: the checked-call helper, event timing, a bounded memo, switching
the calling thread's current device."""
from __future__ import annotations

import contextlib
import statistics

from ..errors import DriverError


class MadeOnMiss(dict):
    """key -> make(key), made on first use; cleared when `limit` entries are held (a bound on
    what long-running processes keep: launch callables, per-stream launch values)."""

    def __init__(self, make, limit: int):
        super().__init__()
        self.make, self.limit = make, limit

    def __missing__(self, key):
        if len(self) >= self.limit:
            self.clear()
        value = self[key] = self.make(key)
        return value


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


class ThreadCurrent:
    """make_current, active and a launch made in this device's context, for a device that is made
    current per thread (a CUDA context, a HIP device ordinal). The backend's Device gives `_mine`
    (its own), `_current()` (the calling thread's) and `_set_current(which)`."""

    def make_current(self):
        """Make this device the calling thread's current one, and leave it so."""
        if self._current() != self._mine:
            self._set_current(self._mine)

    @contextlib.contextmanager
    def active(self):
        """This device current for the block; the thread's previous one restored after."""
        prev = self._current()
        if prev == self._mine:
            yield self
            return
        self._set_current(self._mine)
        try:
            yield self
        finally:
            self._set_current(prev)

    def _in_context(self, launch_here, args, stream: int, prev):
        """A launch made while another device (`prev`, or none) is current: ours around it."""
        self._set_current(self._mine)
        try:
            launch_here(args, stream)
        finally:
            self._set_current(prev)
