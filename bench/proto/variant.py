"""gemv_tc.hip variants: keywords of compiler._tc_geometry, as the A/B and profiling tools take
them (KEY=VALUE on the command line) and hand them to the compiler."""
import contextlib
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from int4jit import compiler  # noqa: E402

PLAIN = compiler._tc_geometry


def parse(items) -> dict:
    """KEY=VALUE items as keywords, VALUE an integer: 0/1 for the switches (xwarp=1), a count
    for the others (kcluster=2, one_wave_sms=132)."""
    kw = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            kw[key] = int(value)
        except ValueError:
            raise SystemExit(f"variant {item!r}: expected KEY=<integer> (0/1 for a switch)") from None
    return kw


def use(**kw):
    """Every later build takes these keywords over the plain geometry; kernels built before
    are forgotten (the compiler's memo does not key on them)."""
    compiler._tc_geometry = functools.partial(PLAIN, **kw)
    compiler._memo.clear()


@contextlib.contextmanager
def adding(**kw):
    """These keywords on top of the variant in use, for the builds made inside the block."""
    current = compiler._tc_geometry
    compiler._tc_geometry = functools.partial(current, **kw)
    try:
        yield
    finally:
        compiler._tc_geometry = current
