"""The int4jit command: run a default workload, show the setup, warm and move caches."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time

import numpy as np

from . import backends, cache, compiler, plan, tuner
from ._version import __version__
from .errors import BackendUnavailable, CompileError, Int4JitError
from .reference import dequantize, random_problem, reference_gemv
from .shapes import GemvShape, candidate_grid

DEFAULT_SHAPES = [(896, 896), (4096, 4096), (28672, 4096), (4096, 14336)]
DEFAULT_TARGETS = ["sm_90", "gfx90a", "gfx1030"]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for tok in text.replace(";", ",").replace(" ", ",").split(","):
        tok = tok.strip()
        if not tok:
            continue
        n, sep, k = tok.lower().partition("x")
        if not sep or not n.isdigit() or not k.isdigit():
            raise argparse.ArgumentTypeError(f"bad shape {tok!r}: expected NxK, e.g. 4096x4096")
        shapes.append((int(n), int(k)))
    return shapes


def _shapes_from(args) -> list[tuple[int, int]]:
    shapes = list(args.shapes or [])
    if getattr(args, "shapes_file", None):
        with open(args.shapes_file) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    shapes += parse_shapes(line)
    return shapes


def _progress(items, desc):
    from tqdm import tqdm
    return tqdm(items, desc=desc, unit="shape", file=sys.stderr, disable=None)  # None: off when not a TTY


def _print_table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
    print(line(headers))
    print(line("-" * w for w in widths))
    for r in rows:
        print(line(r))


def _failure_line(e: Int4JitError) -> str:
    """The informative line of a failure: a compile error's log, else the message."""
    detail = e.log.strip() if isinstance(e, CompileError) and e.log.strip() else str(e)
    return detail.splitlines()[0]


def _rel_err(y, ref) -> float:
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


# -- int4jit (no subcommand): the default workload -------------------------------------
def cmd_run(args) -> int:
    from .api import gemv
    shapes = _shapes_from(args) or DEFAULT_SHAPES
    rng = np.random.default_rng()
    if not backends.gpu_available():
        print(f"int4jit {__version__}: no GPU here; compiling for {', '.join(args.arch or DEFAULT_TARGETS)} "
              f"and checking the reference")
        rows, worst, failures = [], 0.0, []
        for N, K in shapes:
            shape = GemvShape(N, K, args.group, args.symmetric)
            for arch in args.arch or DEFAULT_TARGETS:
                p = plan.plan(shape, arch)
                t0 = time.perf_counter()
                try:
                    ck = compiler.build(p.spec)
                except Int4JitError as e:  # e.g. no hiprtc here: report it, keep the other targets
                    failures.append(f"{shape.key()} on {arch}: {_failure_line(e)}")
                    rows.append((f"{N}x{K}", arch, p.spec.label(), "FAILED", "-", "-"))
                    continue
                rows.append((f"{N}x{K}", arch, p.spec.label(), p.tier, f"{len(ck.binary)}",
                             f"{1e3 * (time.perf_counter() - t0):.0f}"))
            x, w, s, z = random_problem(GemvShape(min(N, 256), K, args.group, args.symmetric), rng)
            err = _rel_err(dequantize(w, s, z).astype(np.float64) @ x.astype(np.float64), reference_gemv(x, w, s, z))
            worst = max(worst, err)
        _print_table(["shape", "arch", "BS,TN", "tier", "bytes", "ms"], rows)
        print(f"reference check (float64 reference vs dequantise+matmul): worst relative error {worst:.1e}")
        for f in failures:
            print(f"int4jit: {f}", file=sys.stderr)
        return 0 if worst < 1e-6 and not failures else 1
    dev = backends.device()
    print(f"int4jit {__version__} on {dev.name} ({dev.arch}); group {args.group}, "
          f"{'symmetric' if args.symmetric else 'asymmetric'}")
    rows, ok = [], True
    for N, K in shapes:
        shape = GemvShape(N, K, args.group, args.symmetric)
        t0 = time.perf_counter()
        p = plan.plan(shape, dev.arch, dev)
        setup = time.perf_counter() - t0
        x, w, s, z = random_problem(shape, rng)
        err = _rel_err(gemv(x, w, s, z, config=p.spec.label()), reference_gemv(x, w, s, z))
        ok &= err <= 2e-3
        from .benchmark import BenchBuffers, time_kernel
        from .launch import load
        bufs = BenchBuffers(dev, shape)
        stream = dev.create_stream()
        try:
            us = time_kernel(load(dev, p.spec), bufs, stream, repeats=15)
        finally:
            dev.destroy_stream(stream)
            bufs.free()
        rows.append((f"{N}x{K}", p.spec.label(), p.tier, f"{setup:.2f}", f"{us:.2f}",
                     f"{shape.weight_bytes / us / 1e3:.0f}", f"{err:.1e}"))
    _print_table(["shape", "BS,TN", "tier", "select s", "us", "GB/s", "rel err"], rows)
    return 0 if ok else 1


# -- info --------------------------------------------------------------------------------
def cmd_info(args) -> int:
    print(f"int4jit {__version__}")
    for name in backends.NAMES:
        mod = backends.module_for(name)
        try:
            cv = mod.compiler_version()
        except BackendUnavailable as e:
            cv = f"unavailable ({str(e).splitlines()[0]})"
        ok, why = mod.available()
        print(f"  {name}: compiler {cv}; device {'yes' if ok else 'no (' + why + ')'}")
        if ok:
            dev = backends.device(backend=name)
            print(f"    {dev.name}: arch {dev.arch}, {dev.sm_count} SMs/CUs, L2 {dev.l2_bytes >> 20} MB, "
                  f"warp {dev.warp_size}, dot2 {'yes' if dev.has_dot2 else 'no'}")
    root = cache.cache_dir()
    for label, path in (("code objects", cache.code_dir()), ("tuning DB", cache.db_dir())):
        files, size = cache.dir_size(path)
        print(f"  {label}: {path} ({files} files, {size / 1e6:.1f} MB)")
    print(f"  cache dir: {root}")
    return 0


# -- warm ----------------------------------------------------------------------------------
def cmd_warm(args) -> int:
    shapes = _shapes_from(args)
    if not shapes:
        print("int4jit warm: no shapes given (use --shapes 4096x4096,... or --shapes-file)", file=sys.stderr)
        return 2
    if args.compile_only:
        archs = args.arch or DEFAULT_TARGETS
        device = None
    else:
        device = backends.device()
        archs = [device.arch]
    rows, failures = [], []
    for N, K in _progress(shapes, "warm"):
        shape = GemvShape(N, K, args.group, args.symmetric)
        for arch in archs:
            t0 = time.perf_counter()
            try:
                p = plan.plan(shape, arch, device, exhaustive=args.exhaustive or None)
                ck = compiler.build(p.spec)
                if args.compile_only:  # pre-warm what tier 4 would compile at run time, too
                    space = [s for s in plan.search_space(shape, arch, exhaustive=args.exhaustive or None)
                             if not compiler.is_cached(s)]
                    for spec in _progress(space, f"{shape.key()} {arch} candidates"):
                        compiler.build(spec)
            except Int4JitError as e:  # one target failing must not hide the others' results
                failures.append(f"{shape.key()} on {arch}: {_failure_line(e)}")
                rows.append((f"{N}x{K}", f"g{args.group}", arch, "-", "FAILED", "-", f"{time.perf_counter() - t0:.2f}", "-"))
                continue
            us = "-"
            if p.tier in ("tuned", "db"):
                rec = tuner.TuningDB(p.spec.arch).get(tuner.db_key(shape, p.spec.kernel), {})
                us = f"{rec.us:.2f}" if rec is not None else "-"
            elif p.tier == "table":
                us = f"{tuner.shipped_table()[arch][shape.key()].get('us', float('nan')):.2f}"
            rows.append((f"{N}x{K}", f"g{args.group}", arch, p.spec.label(), p.tier, us,
                         f"{time.perf_counter() - t0:.2f}", ck.key[:12]))
    _print_table(["shape", "group", "arch", "BS,TN", "tier", "us", "s", "code object"], rows)
    for f in failures:
        print(f"int4jit warm: {f}", file=sys.stderr)
    return 1 if failures else 0


# -- tune ----------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    device = backends.device()
    shape = GemvShape(args.N, args.K, args.group, args.symmetric)
    _, kernel, pdl = plan.target(shape, device.arch, device)
    t0 = time.perf_counter()
    rec, best = tuner.autotune(shape, kernel, device, exhaustive=args.exhaustive, pdl=pdl)
    wall = time.perf_counter() - t0
    rec.context.update(tuner.db_context(kernel, device.arch, device))
    tuner.TuningDB(device.arch).put(tuner.db_key(shape, kernel), rec)
    first = tuner.heuristic(shape, device.arch, kernel, device, args.exhaustive)
    rows = []
    for label, t in rec.candidates.items():
        mark = ("winner " if label == best.label() else "") + ("heuristic" if label == str(first) else "")
        rows.append((label, "failed" if t is None else f"{t:.2f}",
                     "" if t is None else f"{shape.weight_bytes / t / 1e3:.0f}", mark.strip()))
    _print_table(["BS,TN[,variant]", "us", "GB/s", ""], rows)
    print(f"{shape.key()} on {device.name} ({kernel} kernel): {best.label()} at {rec.us:.2f} us; "
          f"{len(rec.candidates)} candidates measured in {wall:.2f} s; stored in {tuner.TuningDB(device.arch).path}")
    return 0


# -- cache -----------------------------------------------------------------------------------
def cmd_cache(args) -> int:
    from . import archive
    if args.action == "path":
        print(cache.cache_dir())
    elif args.action == "list":
        for path in sorted(cache.db_dir().glob("*.json")):
            entries = tuner.TuningDB(path.stem).entries()
            print(f"{path.stem}: {len(entries)} tuned shapes ({path})")
            for key, e in sorted(entries.items()):
                print(f"  {key:28s} {e.get('BS')},{e.get('TN')}  {e.get('us', 0):.2f} us  {e.get('date', '')}")
        files, size = cache.dir_size(cache.code_dir())
        print(f"code objects: {files} files, {size / 1e6:.1f} MB in {cache.code_dir()}")
    elif args.action == "clear":
        for path in (cache.code_dir(), cache.db_dir()):
            shutil.rmtree(path, ignore_errors=True)
        print(f"cleared {cache.cache_dir()}")
    elif args.action == "export":
        n = archive.export_cache(args.file)
        print(f"exported {n} files to {args.file}")
    elif args.action == "import":
        summary = archive.import_cache(args.file)
        print(json.dumps(summary))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="int4jit", description="JIT-compiled, autotuned M=1 INT4 GEMV. "
                                "With no command: compile, run and check a default workload.")
    p.add_argument("--version", action="version", version=f"int4jit {__version__}")

    def shape_opts(q, with_arch=True):
        q.add_argument("--shapes", type=parse_shapes, help="NxK list, e.g. 4096x4096,28672x4096")
        q.add_argument("--shapes-file", help="file with NxK shapes (one or more per line, # comments)")
        q.add_argument("--group", type=int, default=128, choices=(16, 32, 64, 128, 256))
        q.add_argument("--symmetric", action="store_true", help="no zero points (zero point 8)")
        if with_arch:
            q.add_argument("--arch", action="append", help="target for compile-only work (repeatable), "
                           "e.g. sm_90, gfx90a, gfx1151")

    shape_opts(p)
    p.set_defaults(func=cmd_run)
    sub = p.add_subparsers(dest="command")
    sub.add_parser("info", help="backend, device, compilers, cache").set_defaults(func=cmd_info)
    w = sub.add_parser("warm", help="tune (or compile only) a list of shapes into the caches")
    shape_opts(w)
    w.add_argument("--exhaustive", action="store_true", help="search the 20-point grid")
    w.add_argument("--compile-only", action="store_true", help="no GPU: compile what tiers 1-3 or the heuristic pick")
    w.set_defaults(func=cmd_warm)
    t = sub.add_parser("tune", help="tune one shape and print every candidate")
    t.add_argument("N", type=int)
    t.add_argument("K", type=int)
    t.add_argument("--group", type=int, default=128, choices=(16, 32, 64, 128, 256))
    t.add_argument("--symmetric", action="store_true")
    t.add_argument("--exhaustive", action="store_true")
    t.set_defaults(func=cmd_tune)
    c = sub.add_parser("cache", help="path | list | clear | export FILE | import FILE")
    c.add_argument("action", choices=("path", "list", "clear", "export", "import"))
    c.add_argument("file", nargs="?")
    c.set_defaults(func=cmd_cache)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "action", None) in ("export", "import") and not args.file:
        parser.error(f"cache {args.action} needs a FILE")
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"int4jit: {e}", file=sys.stderr)
        return 2
    except Int4JitError as e:  # compiler, driver or cache failure: the message carries the detail
        print(f"int4jit: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
