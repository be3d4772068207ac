"""The gather model of the tensor-core kernels: what taller windows would save, from the pattern.

    python -m benchmarks.window_model [--data ROOT] [--graphs a,b,...] [--reorder] [--d 128]
        [--op spmm|sddmm|attention]

The window kernels read, per window of h rows, one row of X per distinct column the window
holds (its condensed columns, docs/FORMAT.md), d x itemsize bytes each, through L2; the
tensor cores then multiply h x 8 tiles. So per graph and window height h (8 today; 16 is
m16n8k16's native height, 32 two of those):

- gathers: sum over windows of their distinct columns, and the bytes of X rows they read;
- tiles: h x 8 tiles of condensed columns (8 per tile as the format groups them) and their
  density (nonzeros / tile cells): what a tile's MMA wastes;
- against h = 8: the gather bytes saved (the bound on a gather-bound kernel's gain) and the
  tiles' growth (the MMA issue added);
- the floor: X read once, Y written once and the structure read once (benchmarks.common
  min_bytes), as a share of the h-row gather bytes: the most of the floor a kernel that
  gathers every window's rows once through L2 could reach if L2 moved them at DRAM speed.

Figures for fp16 at --d (default 128) on the real suite graphs and the dense-community
stand-ins, in the caller's order and, with --reorder, after affinity reordering.

--op: the other window kernels gather the same columns. SDDMM (windows): each window's rows of
one operand once (m rows in all) and a row of the other per condensed column; floor
(common.min_bytes "sddmm"): each touched row of both once, the structure once. The attention
forward (one head): a K and a V row per condensed column and each Q row once; floor: Q, K, V
and the output once, the structure once.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks import common
from benchmarks.block_stats_table import DEFAULT_GRAPHS, add_graph_args, graphs_of

HEIGHTS = (8, 16, 32)


def window_figures(csr, h: int) -> tuple[int, int]:
  """(distinct columns summed over the h-row windows, h x 8 tiles of condensed columns)."""
  rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), np.diff(csr.indptr))
  keys = np.unique((rows // h) * csr.shape[1] + csr.indices.astype(np.int64))
  per_window = np.bincount(keys // csr.shape[1])
  return int(keys.size), int(np.sum((per_window + 7) // 8))


def floor_bytes(csr, d: int, itemsize: int, op: str) -> int:
  """The min-bytes floor of one call of `op` (module docstring)."""
  if op != "attention":
    return common.min_bytes(csr, d, itemsize, op)
  # Q and the output once per row, K and V once per touched column, the structure once
  return common.min_bytes(csr, d, itemsize, "sddmm") + (csr.shape[0] + csr.shape[1]) * d * itemsize


def gathered_rows(gathers: int, m: int, op: str) -> int:
  """Dense rows a window kernel of `op` reads through L2, from its windows' condensed columns."""
  return {"spmm": gathers, "sddmm": gathers + m, "attention": 2 * gathers + m}[op]


def model_rows(
  name: str, order: str, csr, d: int, itemsize: int = 2, op: str = "spmm"
) -> list[dict]:
  floor = floor_bytes(csr, d, itemsize, op)
  base_gathers, base_tiles = window_figures(csr, 8)
  out = []
  for h in HEIGHTS:
    gathers, tiles = (base_gathers, base_tiles) if h == 8 else window_figures(csr, h)
    gather_bytes = gathered_rows(gathers, csr.shape[0], op) * d * itemsize
    out.append(
      {
        "graph": name,
        "order": order,
        "nnz": int(csr.nnz),
        "h": h,
        "cols/window": gathers / max(1, -(-csr.shape[0] // h)),
        "gather MB": gather_bytes / 1e6,
        "saved vs h=8": 1
        - gathered_rows(gathers, csr.shape[0], op) / gathered_rows(base_gathers, csr.shape[0], op),
        "tiles": tiles,
        "tiles vs h=8": tiles / base_tiles,
        "density": csr.nnz / (tiles * h * 8),
        "floor / gathers": floor / gather_bytes,
      }
    )
  return out


COLUMNS = [
  "graph",
  "order",
  "nnz",
  "h",
  "cols/window",
  "gather MB",
  "saved vs h=8",
  "tiles",
  "tiles vs h=8",
  "density",
  "floor / gathers",
]


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_graph_args(ap)
  ap.add_argument("--d", type=int, default=128, help="feature width (fp16 rows)")
  ap.add_argument("--op", choices=("spmm", "sddmm", "attention"), default="spmm")
  a = ap.parse_args(argv)
  rows = []
  for name, csr in graphs_of(a, [g for g in DEFAULT_GRAPHS if "24.6M" not in g]):
    rows += model_rows(name, "caller", csr, a.d, op=a.op)
    if a.reorder:
      import jaxsparse_tc as jst

      perm = jst.reorder(csr, "affinity", seed=0).perm
      rows += model_rows(name, "affinity", csr[perm][:, perm].tocsr(), a.d, op=a.op)
  common.print_table(rows, COLUMNS, f"window gather model, {a.op}, fp16 d = {a.d}")


if __name__ == "__main__":
  main()
