"""Locality reordering (jaxsparse_tc.reorder, docs/REORDER.md): block statistics and time.

For each graph (the real graphs of ../shared/data, symmetrized, and R-MAT 17/16, 20/8 and the
10M-edge 20/10) and each ordering: the reordering's wall time (the C++ call, 2 threads at most),
the format build's (SparseMatrix.from_coo of the unreordered graph, both orientations), and the
block statistics before -> after: mean nonzeros per 8x8 block, mean distinct columns per row
window, fill (nnz / 64 blocks). A second table gives, for the affinity order, the distribution
of nonzeros per block (quantiles over blocks, and the share of nonzeros in blocks of more than
16, the fill at which the tensor-core kernels take over from the CUDA-core ones).

  python3 -m benchmarks.bench_reorder [--quick] [--graphs pubmed,DD] [--methods affinity,rcm]
  python3 -m benchmarks.bench_reorder --overhead [--graphs ...] [--dims 64]   # transparent mode

--overhead times, on the default JAX device (CPU here; run the same command on a GPU machine
for the GPU figure), one SpMM (float32, d features) four ways: the plain matrix; the explicit
reordered matrix on pre-permuted features; the transparent ReorderedMatrix (which gathers X's
rows in and the output's rows out); and the two gathers alone. And the gradient of a two-layer
GCN (both weights; 4 SpMMs) plain, explicit and transparent. extra_% / gcn_extra_%: transparent
over explicit, the price of keeping the caller's order. On CPU a lone SpMM program is the
kernel alone, while any second op in the program (a gather, x + 1, another SpMM) costs more
than its own time (XLA's CPU runtime around the FFI call), so the per-SpMM figure overstates
what the gathers cost inside a model: read gcn_extra_%.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks import common

COLUMNS = [
  "graph",
  "nodes",
  "nnz",
  "ordering",
  "time_s",
  "build_s",
  "x_build",
  "nnz/block",
  "cols/window",
  "fill",
  "groups",
]
DIST_COLUMNS = [
  "graph",
  "ordering",
  "blocks",
  "nnz/block p10/p50/p90",
  "blocks >16 nnz",
  "nnz in blocks >16",
]
OVERHEAD_COLUMNS = [
  "graph",
  "d",
  "plain_ms",
  "explicit_ms",
  "transparent_ms",
  "gathers_ms",
  "extra_%",
  "gcn_plain_ms",
  "gcn_explicit_ms",
  "gcn_transparent_ms",
  "gcn_extra_%",
]
METHODS = ("affinity", "rabbit", "rcm", "degree")
RMAT = ("rmat17-d16", "rmat20-d8", "rmat20-d10")


def graph_names(quick: bool) -> list[str]:
  if quick:
    return ["cora", "pubmed", "rmat17-d16"]
  real = [
    g
    for g in ("pubmed", "proteins", "facebook-page-page", "github-musae", "DD")
    if g in common.real_graph_names()
  ]
  return real + list(RMAT)


def _build_seconds(rows, cols, shape, repeat: int) -> float:
  from jaxsparse_tc import SparseMatrix

  best = float("inf")
  for _ in range(repeat):
    t0 = time.perf_counter()
    A = SparseMatrix.from_coo(rows, cols, None, shape=shape)
    A.values.block_until_ready()
    best = min(best, time.perf_counter() - t0)
    del A
  return best


def _arrow(a: float, b: float, fmt: str) -> str:
  return f"{a:{fmt}} -> {b:{fmt}}"


def _dist(stats) -> tuple:
  hist = stats.block_nnz_hist
  k = np.arange(hist.size)
  dense = hist[17:].sum() / max(1, stats.blocks)
  dense_nnz = (k[17:] * hist[17:]).sum() / max(1, stats.nnz)
  return "/".join(str(q) for q in stats.block_nnz_quantiles()), dense, dense_nnz


def run(quick: bool = False, graphs=None, methods=METHODS, dist_rows=None) -> list[dict]:
  import jaxsparse_tc as jst

  rows_out = []
  for name in graphs or graph_names(quick):
    g = common.load_graph(name).tocoo()
    r, c = g.row.astype(np.int64), g.col.astype(np.int64)
    big = r.size > 4_000_000
    build = _build_seconds(r, c, g.shape, 1 if big else 3)
    for method in methods:
      best = None
      for _ in range(1 if big else 3):
        res = jst.reorder((r, c), method, num_nodes=g.shape[0])
        best = res if best is None or res.seconds < best.seconds else best
      b, a = best.before, best.after
      rows_out.append(
        {
          "graph": name,
          "nodes": g.shape[0],
          "nnz": b.nnz,
          "ordering": method,
          "time_s": best.seconds,
          "build_s": build,
          "x_build": best.seconds / build,
          "nnz/block": _arrow(b.nnz_per_block, a.nnz_per_block, ".2f"),
          "cols/window": _arrow(b.cols_per_window, a.cols_per_window, ".1f"),
          "fill": _arrow(b.fill, a.fill, ".3f"),
          "groups": best.groups,
        }
      )
      if dist_rows is not None:
        if method == methods[0]:
          q, d, dn = _dist(b)
          dist_rows.append(
            {
              "graph": name,
              "ordering": "(input)",
              "blocks": b.blocks,
              "nnz/block p10/p50/p90": q,
              "blocks >16 nnz": f"{d:.3f}",
              "nnz in blocks >16": f"{dn:.3f}",
            }
          )
        q, d, dn = _dist(a)
        dist_rows.append(
          {
            "graph": name,
            "ordering": method,
            "blocks": a.blocks,
            "nnz/block p10/p50/p90": q,
            "blocks >16 nnz": f"{d:.3f}",
            "nnz in blocks >16": f"{dn:.3f}",
          }
        )
    del g, r, c
  return rows_out


def overhead(graphs, dims) -> list[dict]:
  """Transparent mode's extra cost per SpMM and per GCN step (see the module docstring)."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst

  out = []
  for name in graphs:
    g = common.load_graph(name).tocoo()
    A = jst.SparseMatrix.from_coo(g.row, g.col, np.ones(g.nnz, np.float32), shape=g.shape)
    re = jst.reorder(A, "affinity")
    R = re.wrap(A)
    B = re.permute_matrix(A)
    perm = jnp.asarray(re.perm, jnp.int32)
    inv = jnp.asarray(re.inverse, jnp.int32)
    rng = np.random.default_rng(0)
    for d in dims:
      x = jnp.asarray(rng.standard_normal((g.shape[0], d)), jnp.float32)
      xb = x[perm]
      w1, w2 = (
        jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d), jnp.float32) for _ in range(2)
      )
      spmm = jax.jit(lambda M, x: M @ x)
      gathers = jax.jit(lambda x: x[perm][inv])

      def gcn_loss(w1, w2, x, M):  # two GCN layers: what a training step differentiates
        return jnp.sum(M @ (jax.nn.relu(M @ (x @ w1)) @ w2))

      step = jax.jit(jax.grad(gcn_loss, argnums=(0, 1)))
      t = {}
      for _ in range(2):  # alternate the variants twice: background load hits all of them
        for key, fn, args in (
          ("plain_ms", spmm, (A, x)),
          ("explicit_ms", spmm, (B, xb)),
          ("transparent_ms", spmm, (R, x)),
          ("gathers_ms", gathers, (x,)),
          ("gcn_plain_ms", step, (w1, w2, x, A)),
          ("gcn_explicit_ms", step, (w1, w2, xb, B)),
          ("gcn_transparent_ms", step, (w1, w2, x, R)),
        ):
          ms = common.time_fn(fn, *args, repeat=30)
          t[key] = min(t.get(key, ms), ms)
      out.append(
        {
          "graph": name,
          "d": d,
          **t,
          "extra_%": 100 * (t["transparent_ms"] - t["explicit_ms"]) / t["explicit_ms"],
          "gcn_extra_%": 100
          * (t["gcn_transparent_ms"] - t["gcn_explicit_ms"])
          / t["gcn_explicit_ms"],
        }
      )
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true")
  p.add_argument("--graphs", default=None, help="comma-separated (default: all)")
  p.add_argument("--methods", default=",".join(METHODS))
  p.add_argument("--overhead", action="store_true", help="time transparent mode instead")
  p.add_argument("--dims", default="64")
  args = p.parse_args()
  graphs = args.graphs.split(",") if args.graphs else None
  print(f"cores: {os.cpu_count()}")
  if args.overhead:
    import jaxsparse_tc as jst  # noqa: F401 (device name below)

    rows = overhead(
      graphs or ["pubmed", "github-musae", "DD", "rmat17-d16"],
      [int(d) for d in args.dims.split(",")],
    )
    common.print_table(rows, OVERHEAD_COLUMNS, f"transparent mode on {common.device_name()}")
    return
  dist = []
  rows = run(args.quick, graphs, tuple(args.methods.split(",")), dist)
  common.print_table(rows, COLUMNS, "reordering: block statistics before -> after, time")
  common.print_table(dist, DIST_COLUMNS, "nonzeros per 8x8 block")


if __name__ == "__main__":
  main()
