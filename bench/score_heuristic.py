"""Score the heuristic against measured winners (bench/results/tuning-*.json from
bench/make_table.py): how often its pick is the winner, or within 5% of it, on the
default 9-point grid and the exhaustive 20-point grid. Runs on the CPU.

    python3 bench/score_heuristic.py [bench/results/tuning-sm_90.json ...]

TODO(api): uses int4jit internals (tuner.heuristic(shape, arch, exhaustive=...),
shapes.candidate_grid). It needs a public "what would the no-GPU pick be for this shape on
this arch" call (e.g. `int4jit warm --compile-only --arch sm_90 --dry-run --json` printing
the pick per shape, or a documented int4jit.plan(...)) and the candidate list of each grid,
variants included. Switch once the planner refactor (issue 17) lands."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from int4jit import plan, tuner  # noqa: E402
from int4jit.shapes import GemvShape, candidate_grid  # noqa: E402


def parse_key(key: str) -> GemvShape:
    nk, g, sym = key.split("/")
    n, k = nk.split("x")
    return GemvShape(int(n), int(k), int(g[1:]), sym == "sym")


def score(path: Path):
    doc = json.loads(path.read_text())
    arch = doc["arch"]
    for exhaustive in (False, True):
        grid = {str(c) for c in candidate_grid(exhaustive)}
        exact = near = near15 = 0
        losses = []
        for key, cands in sorted(doc["records"].items()):
            times = {c: t for c, t in cands.items() if t is not None and c in grid}
            best = min(times.values())
            shape = parse_key(key)
            pick = str(tuner.heuristic(shape, arch, plan.target(shape, arch)[1], exhaustive=exhaustive))
            t = times.get(pick, float("inf"))
            exact += t == best
            near += t <= 1.05 * best
            near15 += t <= 1.15 * best
            losses.append(t / best - 1)
        n = len(losses)
        print(f"{path.name} {'20' if exhaustive else ' 9'}-point grid: heuristic = winner on {exact}/{n}, "
              f"within 5% on {near}/{n}, within 15% on {near15}/{n}; median loss {100 * sorted(losses)[n // 2]:.1f}%, worst {100 * max(losses):.0f}%")


if __name__ == "__main__":
    for p in [a for a in sys.argv[1:] if not a.startswith("-")] or sorted(Path(__file__).parent.glob("results/tuning-*.json")):
        score(Path(p))
