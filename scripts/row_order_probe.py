"""What the row kernels' value lookup and item order cost (timing only; NOTES, session 8).

On GCN's propagation matrix of R-MAT 2^20 nodes x 16 edges (bench_train_step's graph), float32
SpMM and its vjp (A^T) at d = 16 and 128, with the pattern's row view altered in two ways:
  csr_values: each entry's value position replaced by its CSR index, so values are read in
              order (the results are wrong: a timing model of values kept in CSR order);
  by_window:  whole-row items ordered by window (the 8 rows of a window consecutive, windows
              with most entries first) instead of longest row first, so a window's rows, whose
              values share sectors in the format's order, run on the same warp or CTA.
Prints ms per call (block_until_ready medians), with the device name.

  python3 scripts/row_order_probe.py        (needs the CUDA extension and a GPU)
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import common  # noqa: E402
import jaxsparse_tc as jst  # noqa: E402
from jaxsparse_tc.nn import graph  # noqa: E402
from jaxsparse_tc._src.pattern import WHOLE_ROW, WINDOW_ROWS  # noqa: E402


def csr_values(p):
  e = np.asarray(p.row_entries).copy()
  e[:, 1] = np.arange(e.shape[0])
  return p._replace(row_entries=jnp.asarray(e))


def by_window(p):
  s = np.asarray(p.row_schedule)
  whole = s[:, 3] == WHOLE_ROW
  head, tail = s[~whole], s[whole]
  rows = tail[:, 0].astype(np.int64)
  length = (tail[:, 2] - tail[:, 1]).astype(np.int64)
  win = rows // WINDOW_ROWS
  total = np.bincount(win, weights=length, minlength=win.max() + 1)
  order = np.lexsort((rows, -total[win]))
  return p._replace(row_schedule=jnp.asarray(np.concatenate([head, tail[order]])))


def main():
  print("# device:", jax.devices()[0].device_kind)
  g = common.rmat(int(os.environ.get("SCALE", "20")), 16)
  csr = g.tocsr()
  targets = np.repeat(np.arange(g.shape[0]), np.diff(csr.indptr))
  A = graph.gcn_norm(np.stack([csr.indices.astype(np.int64), targets]), g.shape[0])
  n = A.shape[0]
  print(f"rmat{os.environ.get('SCALE', '20')}-d16 gcn_norm: {n} rows, {A.nnz} nnz")
  variants = {"base": lambda p: p, "csr_values": csr_values, "by_window": by_window,
              "both": lambda p: by_window(csr_values(p))}
  rng = np.random.default_rng(1)
  fwd = jax.jit(lambda A, h: jst.spmm(A, h))
  bwd = jax.jit(lambda A, h: jax.vjp(lambda z: jst.spmm(A, z), h)[1](h)[0])
  print("| variant | d | spmm ms | vjp (A^T) ms |")
  print("|---|---|---|---|")
  for d in (16, 128):
    h = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    for name, f in variants.items():
      B = jst.SparseMatrix(A.values, f(A.pattern), f(A.pattern_t), A.perm_t, A.perm_t_inv,
                           A.input_to_format, A.shape)
      print(f"| {name} | {d} | {common.time_fn(fwd, B, h, repeat=20):.3f} | "
            f"{common.time_fn(bwd, B, h, repeat=20):.3f} |", flush=True)


if __name__ == "__main__":
  main()
