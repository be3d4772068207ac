"""Per-row time ratios of two benchmark runs (bench_kernels JSON) of the same configurations, e.g.
one source tree before and after a change, timed in one session on one GPU
(scripts/bench_compare.sh runs both and calls this).

  python -m benchmarks.compare BEFORE.json [BEFORE2.json ...] -- AFTER.json [AFTER2.json ...]

Several files per side (repeated rounds) are reduced to the median time of each row. Prints
after / before per row and the geomean per op, and over all rows: above 1 is slower after.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict

KEY = ("graph", "order", "op", "d", "dtype", "H", "impl")

# Impl names of runs made before the kernel families were renamed, as they are called now, so
# that rows of an older tree pair with the same kernels' rows of a newer one.
RENAMED_IMPLS = {"ours-cuda_core": "ours-rows", "ours-tensor_core": "ours-windows"}
RENAMED_PLANS = {"cuda_core": "rows", "tensor_core": "windows"}  # rows' `plan` field


def _median(xs):
  xs = sorted(xs)
  mid = len(xs) // 2
  return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def load(paths) -> dict:
  times = defaultdict(list)
  for path in paths:
    with open(path) as f:
      for row in json.load(f)["rows"]:
        if row.get("us_per_call") and not row.get("error"):
          row = {**row, "impl": RENAMED_IMPLS.get(row.get("impl"), row.get("impl"))}
          times[tuple(row.get(k) for k in KEY)].append(float(row["us_per_call"]))
  return {k: _median(v) for k, v in times.items()}


def geomean(xs) -> float:
  return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def compare(before: dict, after: dict) -> str:
  keys = sorted(set(before) & set(after), key=lambda k: tuple(str(x) for x in k))
  lines = ["| graph | order | op | d | dtype | impl | before us | after us | after / before |"]
  lines.append("|---|---|---|---|---|---|---|---|---|")
  by_op = defaultdict(list)
  for k in keys:
    graph, order, op, d, dtype, _, impl = k
    r = after[k] / before[k]
    by_op[op].append(r)
    lines.append(
      f"| {graph} | {order} | {op} | {d} | {dtype} | {impl} | {before[k]:.1f} | {after[k]:.1f}"
      f" | {r:.3f} |"
    )
  lines.append("")
  for op, rs in sorted(by_op.items()):
    lines.append(f"geomean after / before, {op}: {geomean(rs):.4f} ({len(rs)} rows)")
  everything = [r for rs in by_op.values() for r in rs]
  lines.append(f"geomean after / before, all: {geomean(everything):.4f} ({len(everything)} rows)")
  return "\n".join(lines)


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  if "--" not in argv:
    raise SystemExit(__doc__)
  cut = argv.index("--")
  print(compare(load(argv[:cut]), load(argv[cut + 1 :])))


if __name__ == "__main__":
  main()
