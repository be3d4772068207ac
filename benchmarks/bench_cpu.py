"""CPU: this library's kernels against XLA's CPU code for the same operations, written as a
competent JAX user would (gathers, segment reductions), on real graphs.

Ops (one head, A's values random):
  spmm          A @ X                 XLA: segment_sum(vals[:, None] * X[cols], rows)
  sddmm         (X Y^T) at A          XLA: sum(X[rows] * Y[cols], -1)
  edge_softmax  row softmax of values XLA: stop_gradient(segment_max), exp, segment_sum, divide
  attn_fwd      sparse_attention      XLA: gather SDDMM, scale, the softmax above in fp32, SpMM
  attn_fwd_bwd  jax.grad of sum(attention) w.r.t. Q, K, V, both sides

Both sides run under jax.jit with the sparsity structure closed over (ours: the SparseMatrix;
XLA: its row and column index arrays, CSR order, rows sorted) and the dense operands / values as
arguments. Time: warm-ups, then the median of repeated calls, each synchronised with
block_until_ready, ours and XLA's alternating (so that both see the same background load).
ratio = XLA ms / ours ms (> 1: ours is faster). err: the largest difference between the two
outputs over the largest magnitude of XLA's (a sanity check, not a test).

  python3 benchmarks/bench_cpu.py [--graphs pubmed,DD] [--dims 32,128] [--data ../shared/data]
                                  [--dtypes float32,float16] [--ops spmm,...] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsparse_tc as jst

OPS = ("spmm", "sddmm", "edge_softmax", "attn_fwd", "attn_fwd_bwd")
DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def load_graph(data: Path, name: str):
  """(rows, cols, nodes) in CSR order from an edge-list npz (row, col, num_nodes) or a CSR one
  (indptr, indices, shape: cora)."""
  z = np.load(data / f"{name}.npz")
  if "row" in z:
    rows, cols, n = z["row"].astype(np.int64), z["col"].astype(np.int64), int(z["num_nodes"])
  else:
    indptr = z["indptr"].astype(np.int64)
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    cols, n = z["indices"].astype(np.int64), int(z["shape"][0])
  order = np.lexsort((cols, rows))  # CSR order (the files are sorted already; keep it certain)
  return rows[order], cols[order], n


def time_pair(f, args_f, g, args_g, warmup: int, repeat: int, budget_s: float):
  """Median ms of f(*args_f) and of g(*args_g) after `warmup` calls each; the calls alternate,
  so that both see the same machine (other load comes and goes). Fewer than `repeat` pairs
  for slow ones (at least 3, about `budget_s` in all)."""
  for _ in range(warmup):
    jax.block_until_ready(f(*args_f))
    jax.block_until_ready(g(*args_g))
  t0 = time.perf_counter()
  jax.block_until_ready(f(*args_f))
  jax.block_until_ready(g(*args_g))
  first = time.perf_counter() - t0
  n = int(max(3, min(repeat, budget_s / max(first, 1e-6))))
  tf, tg = [], []
  for _ in range(n):
    for fn, args, times in ((f, args_f, tf), (g, args_g, tg)):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times.append(time.perf_counter() - t0)
  return float(np.median(tf) * 1e3), float(np.median(tg) * 1e3)


# -- XLA's formulations ---------------------------------------------------------------------------
def xla_spmm(vals, x, rows, cols, m):
  return jax.ops.segment_sum(vals[:, None] * x[cols], rows, num_segments=m, indices_are_sorted=True)


def xla_sddmm(x, y, rows, cols):
  return jnp.sum(x[rows] * y[cols], -1)


def xla_edge_softmax(v, rows, m):
  """PyG-style: the row max detached, float32 math, the input's dtype out."""
  vf = v.astype(jnp.float32)
  mx = jax.lax.stop_gradient(jax.ops.segment_max(vf, rows, num_segments=m, indices_are_sorted=True))
  e = jnp.exp(vf - mx[rows])
  s = jax.ops.segment_sum(e, rows, num_segments=m, indices_are_sorted=True)
  return (e / s[rows]).astype(v.dtype)


def xla_attention(q, k, v, rows, cols, m):
  scale = 1.0 / math.sqrt(q.shape[-1])
  s = xla_sddmm(q, k, rows, cols) * jnp.asarray(scale, q.dtype)
  p = xla_edge_softmax(s, rows, m)
  return xla_spmm(p, v, rows, cols, m)


def _grad_of_sum(f):
  return jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))


def make_pair(op, A, rows, cols, n):
  """(ours, xla, to_common): jitted functions of the same dense arguments, and a map of ours'
  output to XLA's layout (format order -> CSR order for per-edge values)."""
  r, c = jnp.asarray(rows, jnp.int32), jnp.asarray(cols, jnp.int32)
  to_input = lambda vals: A.values_to_input(vals)
  same = lambda out: out
  if op == "spmm":
    ours = lambda vf, x: jst.spmm(A.with_values(vf), x)
    xla = lambda vi, x: xla_spmm(vi, x, r, c, n)
    return jax.jit(ours), jax.jit(xla), same
  if op == "sddmm":
    ours = lambda x, y: jst.sddmm(A, x, y).values
    return jax.jit(ours), jax.jit(lambda x, y: xla_sddmm(x, y, r, c)), to_input
  if op == "edge_softmax":
    ours = lambda vf: jst.edge_softmax(A, vf).values
    return jax.jit(ours), jax.jit(lambda vi: xla_edge_softmax(vi, r, n)), to_input
  ours_attn = lambda q, k, v: jst.sparse_attention(A, q, k, v)
  xla_attn = lambda q, k, v: xla_attention(q, k, v, r, c, n)
  if op == "attn_fwd":
    return jax.jit(ours_attn), jax.jit(xla_attn), same
  if op == "attn_fwd_bwd":
    return jax.jit(_grad_of_sum(ours_attn)), jax.jit(_grad_of_sum(xla_attn)), same
  raise ValueError(op)


def make_args(op, A, n, d, dtype, rng):
  """(ours' arguments, XLA's arguments): the same numbers, per-edge values in each side's
  order."""
  dense = lambda: jnp.asarray(rng.standard_normal((n, d), np.float32), dtype)
  if op in ("spmm", "edge_softmax"):
    vi = jnp.asarray(rng.standard_normal(A.nnz, np.float32), dtype)
    vf = A.values_from_input(vi)
    if op == "edge_softmax":
      return (vf,), (vi,)
    x = dense()
    return (vf, x), (vi, x)
  if op == "sddmm":
    x, y = dense(), dense()
    return (x, y), (x, y)
  q, k, v = dense(), dense(), dense()
  return (q, k, v), (q, k, v)


def rel_err(a, b) -> float:
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  worst = 0.0
  for x, y in zip(la, lb):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = max(float(np.max(np.abs(y))) if y.size else 0.0, 1e-30)
    worst = max(worst, float(np.max(np.abs(x - y))) / scale if y.size else 0.0)
  return worst


def run(graphs, dims, dtypes, ops, data, warmup, repeat, budget_s):
  rng = np.random.default_rng(0)
  rows_out = []
  for g in graphs:
    rows, cols, n = load_graph(data, g)
    A = jst.SparseMatrix.from_coo(rows, cols, shape=(n, n))
    for op in ops:
      for dtype in dtypes:
        for d in dims:
          if op == "edge_softmax" and d != dims[0]:
            continue  # no feature axis
          ours, xla, to_common = make_pair(op, A, rows, cols, n)
          args_o, args_x = make_args(op, A, n, d, dtype, rng)
          err = rel_err(to_common(ours(*args_o)), xla(*args_x))
          t_o, t_x = time_pair(ours, args_o, xla, args_x, warmup, repeat, budget_s)
          row = dict(
            graph=g,
            op=op,
            dtype=jnp.dtype(dtype).name,
            d="-" if op == "edge_softmax" else d,
            ours_ms=t_o,
            xla_ms=t_x,
            ratio=t_x / t_o,
            err=err,
          )
          rows_out.append(row)
          print_row(row, flush=True)
  return rows_out


COLUMNS = [
  ("graph", 8),
  ("op", 13),
  ("dtype", 8),
  ("d", 4),
  ("ours_ms", 10),
  ("xla_ms", 10),
  ("ratio", 7),
  ("err", 8),
]


def _fmt(v):
  if isinstance(v, float):
    return f"{v:.2e}" if v < 1e-2 and v != 0 else f"{v:.3f}"
  return str(v)


def print_header():
  print("| " + " | ".join(c.ljust(w) for c, w in COLUMNS) + " |")
  print("|" + "|".join("-" * (w + 2) for _, w in COLUMNS) + "|")


def print_row(row, flush=False):
  print("| " + " | ".join(_fmt(row.get(c, "")).ljust(w) for c, w in COLUMNS) + " |", flush=flush)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument(
    "--graphs", default=None, help="comma-separated npz names (default pubmed,DD; --quick: pubmed)"
  )
  ap.add_argument("--dims", default="32,128")
  ap.add_argument("--dtypes", default="float32,float16")
  ap.add_argument("--ops", default=",".join(OPS))
  ap.add_argument("--data", default=str(DEFAULT_DATA))
  ap.add_argument("--quick", action="store_true", help="pubmed only unless --graphs, fewer runs")
  a = ap.parse_args()
  graphs = (a.graphs or ("pubmed" if a.quick else "pubmed,DD")).split(",")
  dims = [int(x) for x in a.dims.split(",")]
  dtypes = [jnp.dtype(x) for x in a.dtypes.split(",")]
  ops = a.ops.split(",")
  unknown = set(ops) - set(OPS)
  if unknown:
    ap.error(f"unknown ops {sorted(unknown)}; choose from {OPS}")
  warmup, repeat, budget = (1, 5, 0.5) if a.quick else (3, 20, 2.0)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} cores")
  print_header()
  rows = run(graphs, dims, dtypes, ops, Path(a.data), warmup, repeat, budget)
  gm = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows)) if rows else float("nan")
  print_row(dict(graph="geomean", ratio=gm))


if __name__ == "__main__":
  main()
