"""Where the warps of a kernel wait, from ncu's source page (`ncu -i R.ncu-rep --page source
--csv --print-source sass > R-sass.csv`): the SASS instructions with the most stall samples.

    python3 bench/proto/ncu_stalls.py R-sass.csv [R2-sass.csv ...] [--top 10]
"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    for path in a.csv:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))[1:]  # the first line names the kernel
        header, data = rows[0], rows[1:]
        col = {name: header.index(name) for name in ("Source", "Warp Stall Sampling (All Samples)", "stall_long_sb")}
        samples = lambda r: int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        total = sum(samples(r) for r in data)
        long_sb = sum(int(r[col["stall_long_sb"]] or 0) for r in data)
        print(f"{path}: {total} samples over {len(data)} instructions, {long_sb / total:.0%} waiting on a global load")
        for r in sorted(data, key=samples, reverse=True)[:a.top]:
            print(f"  {samples(r) / total:6.1%}  long_sb {int(r[col['stall_long_sb']] or 0):5d}  {r[col['Source']].strip()}")


if __name__ == "__main__":
    main()
