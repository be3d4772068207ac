"""Runs every benchmark module (benchmarks/bench_*.py) and prints their tables last.

Each module defines `run(quick: bool) -> list[dict]` rows and `COLUMNS` (the table's columns),
and may define `summary(rows) -> list[dict]` (ratios against peers). Usage:
  python3 -m benchmarks.run [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from pathlib import Path

from benchmarks import common


def main() -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--only", nargs="*", default=None)
  args = parser.parse_args()
  names = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
  if args.only:
    names = [n for n in names if any(o in n for o in args.only)]
  tables = []
  failed = 0
  for name in names:
    mod = importlib.import_module(name)
    try:
      rows = mod.run(quick=args.quick)
    except Exception:  # keep going: one broken benchmark must not hide the others
      traceback.print_exc()
      failed += 1
      continue
    common.write_json(rows, name)
    summary = mod.summary(rows) if hasattr(mod, "summary") else None
    tables.append((name, rows, mod.COLUMNS, summary))
  print(f"\n# device: {common.device_name()}")
  for name, rows, columns, _ in tables:
    common.print_table(rows, columns, name)
  for name, _, _, summary in tables:
    if summary:
      common.print_table(summary, list(summary[0].keys()), f"{name}: summary")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
