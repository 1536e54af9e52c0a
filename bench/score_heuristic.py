"""Score the heuristic against measured winners (bench/results/tuning-*.json from
bench/make_table.py): how often its pick is the winner, or within 5% (and 15%) of it, on the
default 9-point grid and the exhaustive 20-point grid, each at the default variant. Runs on the CPU.

    python3 bench/score_heuristic.py [bench/results/tuning-sm_90.json ...]

The pick is validate_selection.heuristic_spec, what tuner.select's no-GPU tier yields: one
definition for both scripts (bench/validate_selection.py scores it on shapes outside the table)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_selection import heuristic_spec, parse_key  # noqa: E402

from int4jit import plan  # noqa: E402
from int4jit.shapes import candidate_grid  # noqa: E402
from int4jit.spec import make_spec  # noqa: E402


def grid_label(spec, candidates: dict) -> str:
    """A grid point's name in a tuning file: its label at the default variant, or plain 'BS,TN'
    in files written before the variant record."""
    return spec.label() if spec.label() in candidates else str(spec.config)


def score(path: Path):
    doc = json.loads(path.read_text())
    arch = doc["arch"]
    for exhaustive in (False, True):
        exact = near = near15 = 0
        losses = []
        skipped = 0
        for key, cands in sorted(doc["records"].items()):
            shape = parse_key(key)
            if shape.dtype != "float16" or shape.M > 1:  # the exhaustive records are one fp16 token's
                skipped += 1
                continue
            _, kernel, pdl = plan.target(shape, arch)
            grid = [grid_label(make_spec(shape, arch, kernel, c, pdl=pdl), cands) for c in candidate_grid(exhaustive)]
            times = {label: cands[label] for label in grid if cands.get(label) is not None}
            best = min(times.values())
            t = times.get(grid_label(heuristic_spec(shape, arch, kernel, pdl, exhaustive), cands), float("inf"))
            exact += t == best
            near += t <= 1.05 * best
            near15 += t <= 1.15 * best
            losses.append(t / best - 1)
        n = len(losses)
        print(f"{path.name} {'20' if exhaustive else ' 9'}-point grid: heuristic = winner on {exact}/{n}, "
              f"within 5% on {near}/{n}, within 15% on {near15}/{n}; median loss {100 * sorted(losses)[n // 2]:.1f}%, worst {100 * max(losses):.0f}%"
              + (f" ({skipped} records of bf16 or several tokens not scored)" if skipped else ""))


if __name__ == "__main__":
    for p in [a for a in sys.argv[1:] if not a.startswith("-")] or sorted(Path(__file__).parent.glob("results/tuning-*.json")):
        score(Path(p))
