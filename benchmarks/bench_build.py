"""Format build time: SparseMatrix.from_coo on R-MAT graphs (both orientations, host side).

Target (issue 2): a 10-million-edge graph builds in at most 3 s on a 2-core machine.
Run alone: python3 -m benchmarks.bench_build
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks import common
from jaxsparse_tc import SparseMatrix

COLUMNS = ["graph", "nodes", "edges", "nnz", "blocks", "build_s", "Medges_per_s"]


def _graphs(quick: bool):
  yield "rmat17-d16", common.rmat(17, 16)
  if not quick:
    yield "rmat20-d10 (10M)", common.rmat(20, 10)


def run(quick: bool = False) -> list[dict]:
  rows = []
  for name, g in _graphs(quick):
    coo = g.tocoo()
    r, c, v = coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data
    SparseMatrix.from_coo(r[:1000], c[:1000], v[:1000], shape=g.shape)  # warm-up
    times = []
    for _ in range(3):
      t0 = time.perf_counter()
      A = SparseMatrix.from_coo(r, c, v, shape=g.shape)
      A.values.block_until_ready()
      times.append(time.perf_counter() - t0)
    best = min(times)
    rows.append(
      dict(
        graph=name,
        nodes=g.shape[0],
        edges=len(r),
        nnz=A.nnz,
        blocks=A.pattern.num_blocks,
        build_s=best,
        Medges_per_s=len(r) / best / 1e6,
      )
    )
  return rows


if __name__ == "__main__":
  import os

  print(f"cores: {os.cpu_count()}")
  common.print_table(run(), COLUMNS, "format build")
