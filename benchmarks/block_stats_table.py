"""Block statistics of the real suite graphs and their stand-ins, side by side.

    python -m benchmarks.block_stats_table [--data ROOT] [--graphs a,b,...] [--reorder]

Per graph: nodes, stored edges, nonzeros per nonempty 8x8 block, distinct columns per 8-row
window (mean over windows), row length mean / CV / max (and max / mean), in the caller's order
and, with --reorder, after the library's affinity reordering (jaxsparse_tc.reorder). The
figures are jaxsparse_tc.reorder.block_stats' (docs/FORMAT.md's windows and blocks).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks import common

# The real graphs the stand-ins stand for, then the others, then stand-ins at their size and at
# the benchmark grid's.
DEFAULT_GRAPHS = (
  "imdb-binary",
  "dense193k-imdb",
  "imdb-multi",
  "dense198k-imdbm",
  "DD",
  "proteins",
  "pubmed",
  "github-musae",
  "facebook-page-page",
  "cora",
  "comm18-c64-d16",
  "dense2M-imdb",
  "dense2M-large",
  "dense24.6M-large",
)

COLUMNS = [
  "graph",
  "order",
  "nodes",
  "edges",
  "nnz/block",
  "cols/window",
  "row mean",
  "row CV",
  "row max",
  "max/mean",
  "seconds",
]


def graph_stats(csr, perm=None) -> dict:
  """Block and row-length figures of a scipy CSR pattern (of P A P^T for `perm[new] = old`)."""
  from jaxsparse_tc.reorder import block_stats

  s = block_stats(csr, perm)
  lengths = np.diff(csr.indptr)
  mean = float(lengths.mean()) if lengths.size else 0.0
  return {
    "nodes": csr.shape[0],
    "edges": int(csr.nnz),
    "nnz/block": s.nnz_per_block,
    "cols/window": s.cols_per_window,
    "row mean": mean,
    "row CV": float(lengths.std() / mean) if mean else 0.0,
    "row max": int(lengths.max()) if lengths.size else 0,
    "max/mean": float(lengths.max() / mean) if mean else 0.0,
  }


def rows_for(name: str, csr, reorder: bool) -> list[dict]:
  t0 = time.perf_counter()
  out = [{"graph": name, "order": "caller", **graph_stats(csr)}]
  out[-1]["seconds"] = time.perf_counter() - t0
  if reorder:
    import jaxsparse_tc as jst

    t0 = time.perf_counter()
    perm = jst.reorder(csr, "affinity", seed=0).perm
    out.append({"graph": name, "order": "affinity", **graph_stats(csr, perm)})
    out[-1]["seconds"] = time.perf_counter() - t0
  return out


def add_graph_args(ap: argparse.ArgumentParser) -> None:
  """--data, --graphs and --reorder, as the pattern tables here take them."""
  ap.add_argument("--data", default=None, help=f"folder of the real graphs ({common.SHARED_DATA})")
  ap.add_argument("--graphs", default=None, help="comma-separated names (default: the suite's)")
  ap.add_argument("--reorder", action="store_true", help="also after affinity reordering")


def graphs_of(a, default=DEFAULT_GRAPHS):
  """(name, scipy CSR) of the graphs `a` (add_graph_args' arguments) names, one at a time; a
  graph whose file is missing is reported and skipped."""
  if a.data is not None:
    root = Path(a.data)
    if not root.is_dir():
      raise SystemExit(f"--data: {root} is not a folder")
    common.SHARED_DATA = root
  for name in a.graphs.split(",") if a.graphs else list(default):
    try:
      csr = common.load_graph(name)
    except FileNotFoundError as e:
      print(f"skipped {name}: {e}")
      continue
    yield name, csr


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_graph_args(ap)
  a = ap.parse_args(argv)
  rows = []
  for name, csr in graphs_of(a):
    rows += rows_for(name, csr, a.reorder)
  common.print_table(rows, COLUMNS, "block statistics")


if __name__ == "__main__":
  main()
