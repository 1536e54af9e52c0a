"""The int4jit command: run a default workload, show the setup, warm and move caches."""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed

import numpy as np

from . import backends, cache, compiler, env, plan, tuner
from ._version import __version__
from .errors import BackendUnavailable, CompileError, Int4JitError
from .reference import dequantize, random_problem, reference_gemv
from .shapes import ACTIVATION_DTYPES, MAX_TOKENS, SUPPORTED_GROUPS, GemvShape
from .spec import KNOWN_TARGETS, gemm_row_tiles, gemm_unsupported, make_dequant_spec, make_gemm_spec, make_xperm_spec

DEFAULT_SHAPES = [(896, 896), (4096, 4096), (28672, 4096), (4096, 14336)]
DEFAULT_TARGETS = ["sm_90", "gfx90a", "gfx1030"]


MAX_DIM = (1 << 31) - 1


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for tok in text.replace(";", ",").replace(" ", ",").replace("\t", ",").split(","):
        tok = tok.strip()
        if not tok:
            continue
        n, sep, k = tok.lower().partition("x")
        if not sep or not (n + k).isascii() or not n.isdigit() or not k.isdigit():
            raise argparse.ArgumentTypeError(f"bad shape {tok[:60]!r}: expected NxK, e.g. 4096x4096")
        if not (0 < int(n) <= MAX_DIM and 0 < int(k) <= MAX_DIM):
            raise argparse.ArgumentTypeError(f"bad shape {tok[:60]!r}: N and K must be 1 to {MAX_DIM}")
        shapes.append((int(n), int(k)))
    return shapes


MAX_SHAPES_FILE = 1 << 20


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more; got {text[:20]!r}")
    return int(text)


def _read_shapes_file(path: str) -> list[tuple[int, int]]:
    """NxK shapes from a text file; a ValueError naming the file (and line) for anything else."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SHAPES_FILE + 1)
    except OSError as e:
        raise ValueError(f"--shapes-file {path}: cannot read it ({e.strerror or e})") from None
    if len(raw) > MAX_SHAPES_FILE:
        raise ValueError(f"--shapes-file {path}: over {MAX_SHAPES_FILE} bytes; not a list of shapes")
    try:
        text = raw.decode("utf-8")
        if "\0" in text:
            raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL byte")
    except UnicodeDecodeError:
        raise ValueError(f"--shapes-file {path}: not a text file (expected NxK shapes, one or more per line)") from None
    shapes = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                shapes += parse_shapes(line)
            except argparse.ArgumentTypeError as e:
                raise ValueError(f"--shapes-file {path}, line {number}: {e}") from None
    return shapes


def _shapes_from(args) -> list[tuple[int, int]]:
    shapes = list(args.shapes or [])
    if getattr(args, "shapes_file", None):
        shapes += _read_shapes_file(args.shapes_file)
    for N, K in shapes:  # every shape checked before any work starts
        try:
            GemvShape(N, K, args.group, args.symmetric)
        except ValueError as e:
            raise ValueError(f"shape {N}x{K} with --group {args.group}: {e}") from None
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
def _emulated_error(spec, x, w, s, z) -> float:
    """Relative error of the spec's first and last blocks run on the CPU (int4jit.emulate) against
    the float64 reference on their rows."""
    from . import emulate
    blocks = sorted({0, spec.grid - 1})
    out = np.full((spec.shape.N,), np.nan, np.float16)
    emulate.run(spec, x, w, s, z, out, blocks=blocks)
    rows = np.concatenate([np.arange(r.start, r.stop) for r in (emulate.rows_of_block(spec, b) for b in blocks)])
    ref = reference_gemv(x, w[rows], s[rows], None if z is None else z[rows])
    return _rel_err(out[rows], ref)


def _run_without_gpu(args, shapes, rng) -> int:
    """Compile each shape's plan for each target; run the first and last blocks of each kernel on
    the CPU (emulated) against the reference; check the reference against dequantise + matmul."""
    from . import emulate
    targets = args.arch or DEFAULT_TARGETS
    print(f"int4jit {__version__}: no GPU here. Compiling for {', '.join(targets)} (a compile or a code-cache "
          f"hit per row), and running the first and last blocks of each kernel on the CPU, emulated.")
    before = {p.name for p in cache.code_dir().glob("*/*.bin")}
    plans = {(N, K, arch): plan.plan(GemvShape(N, K, args.group, args.symmetric), arch) for N, K in shapes for arch in targets}

    unavailable = emulate.unavailable()

    def cpu_build(spec):
        """(why it cannot run on the CPU here, the C++ compiler's refusal), None where not."""
        if unavailable:
            return unavailable, None
        try:
            emulate.build(spec)
        except RuntimeError as e:  # an int4jit bug: reported on the kernel's row, the others still run
            return None, str(e)
        except OSError as e:  # the library cannot be loaded from the temp dir (mounted noexec?)
            return f"a CPU build cannot be loaded here ({e})", None
        return None, None

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # the CPU builds, ~0.6 s each, all at once
        cpu_builds = dict(zip(plans, pool.map(cpu_build, [p.spec for p in plans.values()])))
    rows, worst_ref, worst_kernel, failures, not_emulated, emulated_count = [], 0.0, 0.0, [], set(), 0
    for N, K in shapes:
        shape = GemvShape(N, K, args.group, args.symmetric)
        x, w, s, z = random_problem(shape, rng)
        for arch in targets:
            p = plans[N, K, arch]
            t0 = time.perf_counter()
            try:
                ck = compiler.build(p.spec)
            except Int4JitError as e:  # e.g. no hiprtc here: report it, keep the other targets
                failures.append(f"{shape.key()} on {arch}: {_failure_line(e)}")
                rows.append((f"{N}x{K}", arch, p.spec.label(), p.tier, "FAILED", "-", "-", "-"))
                continue
            built = "cache hit" if f"{getattr(ck, 'key', '')}.bin" in before else "compiled"
            ms = f"{1e3 * (time.perf_counter() - t0):.0f}"
            why, refused = cpu_builds[N, K, arch]
            if why:
                not_emulated.add(why)
                emulated = "-"
            elif refused:
                failures.append(f"{shape.key()} on {arch}: {refused}")
                emulated = "FAILED"
            else:
                err = _emulated_error(p.spec, x, w, s, z)
                worst_kernel, emulated_count = max(worst_kernel, err), emulated_count + 1
                emulated = f"{err:.1e}"
                if not err <= 2e-3:
                    failures.append(f"{shape.key()} on {arch}: the emulated kernel's relative error is {err:.1e} "
                                    f"(at most 2e-3 expected)")
            rows.append((f"{N}x{K}", arch, p.spec.label(), p.tier, built, f"{len(ck.binary)}", ms, emulated))
        xs, ws, ss, zs = x, w[:256], s[:256], None if z is None else z[:256]
        err = _rel_err(dequantize(ws, ss, zs).astype(np.float64) @ xs.astype(np.float64), reference_gemv(xs, ws, ss, zs))
        worst_ref = max(worst_ref, err)
    _print_table(["shape", "arch", "BS,TN", "tier", "build", "bytes", "ms", "emulated err"], rows)
    ran = (f"each kernel's first and last blocks, run on the CPU with the target's wave size, against the float64 "
           f"reference (worst relative error {worst_kernel:.1e}); " if emulated_count else "")
    print(f"checked: the kernels compile for each target above; {ran}the reference against dequantise + matmul "
          f"({worst_ref:.1e}).")
    print("not checked: the vendor preludes (inline PTX, hiprtc builtins) and speed: they need a GPU (run this "
          "command on one)" + "".join(f"; not emulated: {w}" for w in sorted(not_emulated)) + ".")
    for f in failures:
        print(f"int4jit: {f}", file=sys.stderr)
    return 0 if worst_ref < 1e-6 and not failures else 1


def cmd_run(args) -> int:
    from .api import gemv
    shapes = _shapes_from(args) or DEFAULT_SHAPES
    rng = np.random.default_rng()
    if not backends.gpu_available():
        return _run_without_gpu(args, shapes, rng)
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
                     f"{shape.bytes_moved / us / 1e3:.0f}", f"{err:.1e}"))
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
        count = mod.device_count() if ok else 0
        print(f"  {name}: compiler {cv}; devices {count if ok else 'none (' + why + ')'}")
        for ordinal in range(count):
            try:
                dev = backends.device(ordinal, backend=name)
                print(f"    [{ordinal}] {dev.name}: arch {dev.arch}, {dev.sm_count} SMs/CUs, "
                      f"memory {dev.total_memory() / 2**30:.1f} GiB, L2 {dev.l2_bytes >> 20} MB, "
                      f"warp {dev.warp_size}, dot2 {'yes' if dev.has_dot2 else 'no'}")
            except (Int4JitError, ValueError) as e:  # one GPU that cannot be opened does not hide the rest
                print(f"    [{ordinal}] cannot be opened: {str(e).splitlines()[0]}")
    root = cache.cache_dir()
    for label, path in (("code objects", cache.code_dir()), ("tuning DB", cache.db_dir())):
        files, size = cache.dir_size(path)
        print(f"  {label}: {path} ({files} files, {size / 1e6:.1f} MB)")
    print(f"  cache dir: {root}")
    return 0


# -- warm ----------------------------------------------------------------------------------
def _build_one(spec) -> str | None:
    """Compile one spec into the code cache: None, or the first line of its error."""
    try:
        compiler.build(spec)
    except Int4JitError as e:
        return str(e).splitlines()[0]
    return None


def compile_specs(specs, jobs: int, desc: str = "compile") -> tuple[list, dict]:
    """Compile the specs the code cache lacks, in `jobs` processes (spawned, not forked: the
    caller may hold a GPU context; in this process when jobs is 1), with a progress bar.
    -> (the specs it compiled, {spec: first line of its error} for those that failed);
    compiler.build raises a failed one's whole log again when it is used."""
    todo = [s for s in dict.fromkeys(specs) if not compiler.is_cached(s)]
    from tqdm import tqdm
    bar = lambda it: tqdm(it, total=len(todo), desc=desc, unit="kernel", file=sys.stderr, disable=None)
    if jobs <= 1 or len(todo) <= 1:
        results = ((s, _build_one(s)) for s in todo)
        return todo, {s: err for s, err in bar(results) if err is not None}
    failed = {}
    with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_build_one, s): s for s in todo}
        for f in bar(as_completed(futures)):
            if f.result() is not None:
                failed[futures[f]] = f.result()
    return todo, failed


def _launched_specs(p, shape: GemvShape, arch: str, device, exhaustive) -> list:
    """What a model's calls launch for a planned shape: the plan's kernel (first), the
    fixed-weights (early) build GemvWeights / Int4Linear launch, and the kernels Int4Linear's
    prefill launches (in the activations' type): the dequantising one, and on Hopper the GEMM's two."""
    specs = [p.spec, plan.plan(shape, arch, device, exhaustive=exhaustive, fixed_weights=True).spec,
             make_dequant_spec(shape, p.spec.arch, shape.dtype)]
    if gemm_unsupported(shape, arch) is None:
        sms = device.sm_count if device is not None else KNOWN_TARGETS[arch][0]
        # the x layout kernel, and the GEMM in each tile height a prompt may take (PDL as the plan's)
        specs += [make_xperm_spec(shape, arch, sms),
                  *(make_gemm_spec(shape, arch, sms, rows, p.spec.pdl) for rows in gemm_row_tiles(shape.N))]
    return specs


def _warm_plan(shape: GemvShape, arch: str, exhaustive) -> tuple:
    """(plan, specs) of `warm --compile-only` for one shape on one target: what its calls launch
    (_launched_specs, the plan's kernel first) and every candidate the runtime tuner would measure."""
    p = plan.plan(shape, arch, None, exhaustive=exhaustive)
    return p, [*_launched_specs(p, shape, arch, None, exhaustive), *plan.search_space(shape, arch, exhaustive=exhaustive)]


def parse_dtypes(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in ACTIVATION_DTYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected {' or '.join(ACTIVATION_DTYPES)}, comma-separated; got {text[:60]!r}")
    return list(dict.fromkeys(names))


def parse_tokens(text: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8], '1-16' -> 1..16: token counts of one call (1..MAX_TOKENS)."""
    counts = []
    try:
        for item in (t.strip() for t in text.split(",") if t.strip()):
            lo, _, hi = item.partition("-")
            first, last = int(lo), int(hi or lo)
            if last < first:  # a range written backwards is refused, not read as empty
                raise ValueError(item)
            counts += range(first, last + 1)
    except ValueError:
        counts = []
    if not counts or any(not 1 <= m <= MAX_TOKENS for m in counts):
        raise argparse.ArgumentTypeError(f"expected token counts 1..{MAX_TOKENS}, comma-separated or a range "
                                         f"such as 1-16; got {text[:60]!r}")
    return list(dict.fromkeys(counts))


def _table_us(p) -> str:
    """The shipped table's time for a table-tier plan (its row may be the fp16 one of a bf16 shape)."""
    hit = tuner.table_entry(p.spec.shape, p.spec.arch)
    return f"{tuner.shipped_table()[p.spec.arch][hit[1]].get('us', float('nan')):.2f}" if hit else "-"


def cmd_warm(args) -> int:
    shapes = _shapes_from(args)
    if not shapes:
        print("int4jit warm: no shapes given (use --shapes 4096x4096,... or --shapes-file)", file=sys.stderr)
        return 2
    if args.compile_only:
        archs = args.arch or DEFAULT_TARGETS
        device = None
    else:
        try:
            device = backends.device()
        except BackendUnavailable as e:  # a CI or image build without a GPU: say how to warm there
            raise BackendUnavailable(f"{e}. Without a GPU, `int4jit warm --compile-only --arch sm_90` (or gfx90a, "
                                     f"...) fills the code cache for the targets named") from None
        archs = [device.arch]
    exhaustive = args.exhaustive or None
    work = [(GemvShape(N, K, args.group, args.symmetric, M, dtype), arch)
            for N, K in shapes for M in args.tokens for dtype in args.dtype for arch in archs]
    planned = {}  # compile-only: (shape, arch) -> _warm_plan's (plan, specs), or the error planning raised
    if args.compile_only:  # every build first, in parallel; the loop below then reads the cache
        for item in work:
            try:
                planned[item] = _warm_plan(*item, exhaustive)
            except (Int4JitError, NotImplementedError) as e:  # the loop below reports it, on its row
                planned[item] = e
        compile_specs([s for done in planned.values() if isinstance(done, tuple) for s in done[1]],
                      args.jobs, "warm: compile")
    rows, failures, notes = [], [], []
    for shape, arch in _progress(work, "warm"):
        label = (f"{shape.N}x{shape.K}" + ("" if shape.M == 1 else f"/m{shape.M}")
                 + ("" if shape.dtype == "float16" else f"/{shape.dtype}"))
        t0 = time.perf_counter()
        try:
            if args.compile_only:
                done = planned[(shape, arch)]
                if isinstance(done, Exception):
                    raise done
                p, specs = done
            else:
                p = plan.plan(shape, arch, device, exhaustive=exhaustive)  # tunes where the shape needs it
                specs = _launched_specs(p, shape, arch, device, exhaustive)
            # specs[0] is p.spec; compile-only built them all above: a cache read, or the error with its log
            ck = [compiler.build(spec) for spec in specs][0]
        except Int4JitError as e:  # one target failing must not hide the others' results
            failures.append(f"{shape.key()} on {arch}: {_failure_line(e)}")
            rows.append((label, f"g{args.group}", arch, "-", "FAILED", "-", f"{time.perf_counter() - t0:.2f}", "-"))
            continue
        except NotImplementedError as e:  # no kernel for these calls there: Int4Linear dequantises + matmuls
            notes.append(f"{shape.key()} on {arch}: no kernel to build ({e}); Int4Linear runs dequantise + matmul there")
            rows.append((label, f"g{args.group}", arch, "-", "no kernel", "-", f"{time.perf_counter() - t0:.2f}", "-"))
            continue
        us = "-"
        if p.tier in ("tuned", "db"):
            rec = tuner.TuningDB(p.spec.arch).get(tuner.db_key(shape, p.spec.kernel), {})
            us = f"{rec.us:.2f}" if rec is not None else "-"
        elif p.tier == "table":
            us = _table_us(p)
        rows.append((label, f"g{args.group}", arch, p.spec.label(), p.tier, us,
                     f"{time.perf_counter() - t0:.2f}", ck.key[:12]))
    _print_table(["shape", "group", "arch", "BS,TN", "tier", "us", "s", "code object"], rows)
    for n in notes:
        print(f"int4jit warm: {n}")
    for f in failures:
        print(f"int4jit warm: {f}", file=sys.stderr)
    return 1 if failures else 0


# -- tune ----------------------------------------------------------------------------------
def _tune_shape(words: list[str]) -> tuple[int, int]:
    """`tune 4096x14336` (warm's form) or `tune 4096 14336`."""
    one_shape = ValueError(f"tune takes one shape, NxK (4096x14336) or N K (4096 14336); got {' '.join(words)[:80]!r}")
    if len(words) == 2 and all(w.isascii() and w.isdigit() for w in words):
        words = ["x".join(words)]
    if len(words) != 1:
        raise one_shape
    try:
        shapes = parse_shapes(words[0])
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"tune: {e}") from None
    if len(shapes) != 1:
        raise one_shape
    return shapes[0]


def cmd_tune(args) -> int:
    N, K = _tune_shape(args.shape)
    shape = GemvShape(N, K, args.group, args.symmetric, args.tokens, args.dtype)
    device = backends.device()
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
                     "" if t is None else f"{shape.bytes_moved / t / 1e3:.0f}", mark.strip()))
    _print_table(["BS,TN[,variant]", "us", "GB/s", ""], rows)
    print(f"{shape.key()} on {device.name} ({kernel} kernel): {best.label()} at {rec.us:.2f} us; "
          f"{len(rec.candidates)} candidates measured in {wall:.2f} s; stored in {tuner.TuningDB(device.arch).path}")
    return 0


# -- cache -----------------------------------------------------------------------------------
_KERNEL_NAME = re.compile(r"^int4jit_([a-z0-9]+)_n([0-9]+)_k([0-9]+)_g([0-9]+)([as])_bs([0-9]+)_tn([0-9]+)$")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _cache_list() -> int:
    from .tuning_db import TuningDB, is_db_name
    print(f"cache dir: {cache.cache_dir()}")
    db_root = cache.db_dir()
    dbs = sorted(p for p in db_root.glob("*.json") if is_db_name(p.name)) if db_root.is_dir() else []
    rows = []
    for path in dbs:
        for key, e in sorted(TuningDB(path.stem).entries().items()):
            config = ",".join(f"{k}={v}" if k not in ("BS", "TN") else str(v) for k, v in e["config"].items())
            rows.append((key, path.stem, config, f"{e['us']:.2f}", e["date"][:19]))
    print(f"tuning DB: {len(rows)} entries in {len(dbs)} file(s)")
    if rows:
        _print_table(["key", "arch", "config", "us", "date"], rows)
    objects = cache.list_code_objects()
    print(f"code objects: {len(objects)} ({_size(sum(o.size for o in objects))}) in {cache.code_dir()}")
    rows = []
    for o in objects:
        m = _KERNEL_NAME.match(o.kernel)
        shape, config, kernel = ((f"{m[2]}x{m[3]} g{m[4]} {'sym' if m[5] == 's' else 'asym'}", f"{m[6]},{m[7]}", m[1])
                                 if m else ("?", "?", "?"))
        rows.append((o.key[:12], shape, o.arch, kernel, config, _size(o.size), "ok" if o.valid else "CORRUPT"))
    if rows:
        _print_table(["code object", "shape", "arch", "kernel", "BS,TN", "size", "check"], rows)
    return 0


def _cache_clear() -> int:
    from . import archive
    removed, left = archive.clear_cache()
    print(f"removed {len(removed)} file(s) int4jit wrote from {cache.cache_dir()}")
    if left:
        print(f"left {len(left)} file(s) int4jit did not write:")
        for p in left[:20]:
            print(f"  {p}")
        if len(left) > 20:
            print(f"  ... and {len(left) - 20} more")
    return 0


def cmd_cache(args) -> int:
    from . import archive
    if args.action == "path":
        print(cache.cache_dir())
    elif args.action == "list":
        return _cache_list()
    elif args.action == "clear":
        return _cache_clear()
    elif args.action == "export":
        try:
            n = archive.export_cache(args.file)
        except OSError as e:
            raise ValueError(f"cache export: cannot write {args.file} ({e.strerror or e})") from None
        print(f"exported {n} file(s) (code objects and tuning DBs) to {args.file}")
    elif args.action == "import":
        try:
            s = archive.import_cache(args.file)
        except archive.ArchiveError as e:
            raise ValueError(f"cache import: {e}; the cache was not changed") from None
        print(f"imported {args.file} into {cache.cache_dir()}: {s['code_objects_added']} code object(s) added "
              f"({s['code_objects_present']} already present), {s['tuning_entries_merged']} tuning entr"
              f"{'y' if s['tuning_entries_merged'] == 1 else 'ies'} merged"
              + (f" into {', '.join(s['tuning_dbs'])}" if s["tuning_dbs"] else ""))
        for note in s["skipped"]:
            print(f"  skipped {note}")
    return 0


SHAPE_OPTIONS = {"shapes": None, "shapes_file": None, "group": 128, "symmetric": False, "arch": None}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="int4jit", description="JIT-compiled, autotuned INT4 weight-only GEMV "
                                "(1..16 tokens, fp16 or bf16). "
                                "With no command: compile, run and check a default workload (without a GPU: "
                                "compile it for --arch targets and check the reference on the CPU).")
    p.add_argument("--version", action="version", version=f"int4jit {__version__}")

    def shape_opts(q, top=False):
        # Given before a subcommand, these land in top_* (so a subcommand's defaults cannot hide
        # them); main() hands them to warm or refuses them.
        dest = (lambda n: "top_" + n) if top else (lambda n: n)
        default = (lambda v: argparse.SUPPRESS) if top else (lambda v: v)
        q.add_argument("--shapes", type=parse_shapes, dest=dest("shapes"), default=default(None), metavar="NxK,...",
                       help="shapes to work on, NxK separated by commas, e.g. 4096x4096,28672x4096")
        q.add_argument("--shapes-file", dest=dest("shapes_file"), default=default(None), metavar="FILE",
                       help="text file of NxK shapes, one or more per line, '#' starts a comment")
        q.add_argument("--group", type=int, choices=SUPPORTED_GROUPS, dest=dest("group"), default=default(128),
                       help="quantisation group size along K (default 128)")
        q.add_argument("--symmetric", action="store_true", dest=dest("symmetric"), default=default(False),
                       help="symmetric weights: no zero points (zero point 8)")
        q.add_argument("--arch", action="append", dest=dest("arch"), default=default(None), metavar="TARGET",
                       help="target to compile for without a GPU, repeatable: sm_80, sm_90 (NVRTC), gfx90a, "
                            "gfx908, gfx1030, gfx900 (Debian's ROCm 5.2); gfx942, gfx11xx, gfx12xx need a newer "
                            f"ROCm (default {', '.join(DEFAULT_TARGETS)})")

    shape_opts(p, top=True)
    p.set_defaults(func=cmd_run)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("info", help="backends, compilers, device and cache locations",
                   description="Show the backends, their compilers, the device and the cache.").set_defaults(func=cmd_info)
    w = sub.add_parser("warm", help="tune (or compile only) a list of shapes into the caches",
                       description="Fill the caches for a list of shapes: tune and compile on this GPU, or with "
                                   "--compile-only compile for --arch targets without one.")
    shape_opts(w)
    w.add_argument("--exhaustive", action="store_true", help="search the 20-point grid (BS 32-512 x TN 2-16)")
    w.add_argument("--compile-only", action="store_true",
                   help="no GPU: compile what the override, tuning DB, shipped table or heuristic pick, and the "
                        "candidates tuning would try")
    w.add_argument("--jobs", type=_positive_int, default=os.cpu_count() or 1,
                   help="with --compile-only: compile processes (default: one a CPU)")
    w.add_argument("--dtype", type=parse_dtypes, default=["float16"], metavar="float16,bfloat16",
                   help="activation types the model runs in, comma-separated (default float16)")
    w.add_argument("--tokens", type=parse_tokens, default=[1], metavar="1,4,8",
                   help=f"tokens a call carries (1..{MAX_TOKENS}: speculative decoding, small batches, and "
                        f"Int4Linear's launches of 16 and a remainder for up to 64 tokens), comma-separated or "
                        f"a range such as 1-16 (default 1)")
    w.set_defaults(func=cmd_warm)
    t = sub.add_parser("tune", help="tune one shape on this GPU and print every candidate",
                       description="Benchmark every candidate for one shape on this GPU and store the winner.")
    t.add_argument("shape", nargs="+", metavar="NxK",
                   help="the weight's rows x columns, as warm's --shapes writes it (4096x14336); N K also works")
    t.add_argument("--group", type=int, default=128, choices=SUPPORTED_GROUPS,
                   help="quantisation group size along K (default 128)")
    t.add_argument("--symmetric", action="store_true", help="symmetric weights: no zero points (zero point 8)")
    t.add_argument("--exhaustive", action="store_true", help="search the 20-point grid (BS 32-512 x TN 2-16)")
    t.add_argument("--dtype", choices=ACTIVATION_DTYPES, default="float16", help="the activations' type (default float16)")
    t.add_argument("--tokens", type=int, default=1, choices=range(1, MAX_TOKENS + 1), metavar=f"1..{MAX_TOKENS}",
                   help="tokens a call carries (default 1)")
    t.set_defaults(func=cmd_tune)
    c = sub.add_parser("cache", help="path | list | clear | export FILE | import FILE",
                       description="path: print the cache dir; list: its tuning entries and code objects; clear: "
                                   "remove the files int4jit wrote (others stay); export FILE: write code objects "
                                   "and tuning DBs to a .tar.gz; import FILE: check such an archive, then merge it.")
    c.add_argument("action", choices=("path", "list", "clear", "export", "import"), help="what to do")
    c.add_argument("file", nargs="?", metavar="FILE", help="the archive, for export and import")
    c.set_defaults(func=cmd_cache)
    try:
        from . import inspection
    except ImportError:
        inspection = None
    if inspection is not None and hasattr(inspection, "add_arguments") and hasattr(inspection, "run"):
        i = sub.add_parser("inspect", help="what the compiled kernels are: registers, spills, occupancy, loads",
                           description="Build kernels and report facts read from their code objects.")
        inspection.add_arguments(i)
        i.set_defaults(func=inspection.run)
    return p


def _apply_top_level_options(parser, args):
    """Options given before the subcommand: the main command's own; handed to warm, which has
    the same ones; refused elsewhere (argparse would silently drop them)."""
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("top_")}
    for k in list(vars(args)):
        if k.startswith("top_"):
            delattr(args, k)
    command = getattr(args, "command", None)
    if command is None:
        for k, default in SHAPE_OPTIONS.items():
            setattr(args, k, given.get(k, default))
        return
    if not given:
        return
    flags = ", ".join("--" + k.replace("_", "-") for k in given)
    if command != "warm":
        parser.error(f"{flags} given before '{command}', which does not take it; "
                     f"options go after the command (int4jit {command} --help)")
    for k, v in given.items():
        mine = getattr(args, k)
        if k in ("shapes", "arch"):
            setattr(args, k, (v or []) + (mine or []))
        elif mine == SHAPE_OPTIONS[k]:
            setattr(args, k, v)
        elif mine != v:
            parser.error(f"--{k.replace('_', '-')} given twice, before and after 'warm', with different values")


def _check_environment():
    """Every int4jit variable parsed now, whichever command runs: a bad value is an error."""
    env.check_all()
    found = env.env_lookup("INT4JIT_CONFIG")
    if found is not None and found[1].strip():
        tuner.parse_override(found[1], found[0])


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _apply_top_level_options(parser, args)
    action = getattr(args, "action", None)
    if action in ("export", "import") and not args.file:
        parser.error(f"cache {action} needs a FILE")
    if action in ("path", "list", "clear") and args.file:
        parser.error(f"cache {action} takes no FILE")
    try:
        _check_environment()
        for arch in getattr(args, "arch", None) or []:
            backends.module_for_arch(arch).parse_arch(arch)
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"int4jit: {e}", file=sys.stderr)
        return 2
    except Int4JitError as e:  # compiler, driver or cache failure: the message carries the detail
        print(f"int4jit: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a path that cannot be read or written
        where = f": {e.filename}" if e.filename else ""
        print(f"int4jit: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("int4jit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
