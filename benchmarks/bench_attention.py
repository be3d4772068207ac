"""Fused sparse attention vs unfused peers (fp16): forward and forward+backward, peak memory.

Grid: d in {32, 64, 128} x heads H in {1, 4, 8} on every graph of common.benchmark_graphs (the
real graphs, rmat17-d16, rmat20-d8); --quick: cora + rmat17-d16, d in {64, 128}, H = 4 (on a
CPU-only machine rmat17-d16 is replaced by rmat14-d16 to keep it short). Inputs q, k, v
[H, n, d] float16, scale 1/sqrt(d); fwd+bwd is jax.grad of sum(out * w) with respect to q, k, v.

Methods, each jitted with the graph as an argument (not a constant):
- `fused`: jaxsparse_tc.sparse_attention.
- `lib`: this library's unfused sddmm -> edge_softmax -> spmm.
- `xla`: hand-written XLA, the `xla-unfused-fp16` peer of ../shared/BASELINES.md: the edges in
  row-major (CSR) order, built on the host from the scipy matrix; gathers, segment_max /
  segment_sum softmax in float32 with indices_are_sorted=True on every segment op, a float32
  segment_sum SpMM, float16 output. No gradient through the max (a no-op for softmax), and the
  gathers' backward scatter-adds in float32 (XLA's float16 scatter-add is 10-40x slower,
  BASELINES.md), so XLA is not penalised for details a careful author would avoid.
Memory, from the compiled program's memory_analysis(): `*_tmp_MB` = temp bytes (what XLA
allocates beyond inputs and outputs), `*_MB` = temp + arguments + outputs (the footprint).
Check: for the first config of each graph the three methods' outputs (fwd) and gradients
(fwd+bwd) agree to a relative error < 1e-2 (asserted; `rel_err` is the largest pairwise one).
Timing: common.time_fn median after one warm-up, fewer repeats for slow calls (~0.4 s of
timed calls each); a config's six programs compile concurrently.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import sys
import time

# Grow GPU memory on demand instead of preallocating 75% of it: the OOM sweep of
# bench_attention_memory (a child process) and PyG in bench_train_step need the rest.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np

from benchmarks import common

COLUMNS = [
  "graph",
  "nodes",
  "nnz",
  "d",
  "H",
  "mode",
  "fused_ms",
  "lib_unfused_ms",
  "xla_ms",
  "x_vs_xla",
  "x_vs_lib",
  "fused_tmp_MB",
  "lib_tmp_MB",
  "xla_tmp_MB",
  "fused_MB",
  "lib_MB",
  "xla_MB",
  "rel_err",
]

METHODS = ("fused", "lib", "xla")
CHECK_TOL = 1e-2
_MS = {"fused": "fused_ms", "lib": "lib_unfused_ms", "xla": "xla_ms"}
_MB = 2.0**20


def csr_edges(g):
  """(rows, cols) int32 of g's nonzeros in row-major order (rows sorted), duplicates merged."""
  csr = g.tocsr(copy=True)
  csr.sum_duplicates()  # also sorts the column indices of each row
  n = csr.shape[0]
  rows = np.repeat(np.arange(n, dtype=np.int32), np.diff(csr.indptr))
  return rows, csr.indices.astype(np.int32, copy=False)


def _take_f32(x, idx, indices_are_sorted):
  """x[idx] as float32, gathering x's own dtype; the backward scatter-adds in float32."""
  import jax
  import jax.numpy as jnp

  n, dtype = x.shape[0], x.dtype

  @jax.custom_vjp
  def take(x, idx):
    return (
      x.at[idx]
      .get(indices_are_sorted=indices_are_sorted, mode="promise_in_bounds")
      .astype(jnp.float32)
    )

  def fwd(x, idx):
    return take(x, idx), idx

  def bwd(idx, ct):
    g = jax.ops.segment_sum(ct, idx, n, indices_are_sorted=indices_are_sorted)
    return g.astype(dtype), None

  take.defvjp(fwd, bwd)
  return take(x, idx)


def methods(scale):
  """{name: f(graph, q, k, v) -> [H, m, d]}; the graph is A (SparseMatrix) or (rows, cols)."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst

  def fused(A, q, k, v):
    return jst.sparse_attention(A, q, k, v, scale=scale)

  def lib(A, q, k, v):
    s = jst.sddmm(A, q, k).values * jnp.asarray(scale, q.dtype)
    p = jst.edge_softmax(A, s)
    return jst.spmm(p, v)

  def xla(edges, q, k, v):
    rows, cols = edges  # CSR order: rows sorted
    m = q.shape[1]
    seg = dict(num_segments=m, indices_are_sorted=True)

    def at_rows(x):  # per-row quantity onto the edges
      return x.at[rows].get(indices_are_sorted=True, mode="promise_in_bounds")

    qn, kn, vn = (jnp.swapaxes(x, 0, 1) for x in (q, k, v))  # [n, H, d]: one row per gather
    s = jnp.sum(_take_f32(qn, rows, True) * _take_f32(kn, cols, False), -1) * scale  # [nnz, H]
    mx = jax.lax.stop_gradient(jax.ops.segment_max(s, rows, **seg))
    e = jnp.exp(s - at_rows(mx))
    p = e / at_rows(jax.ops.segment_sum(e, rows, **seg))
    o = jax.ops.segment_sum(p[:, :, None] * _take_f32(vn, cols, False), rows, **seg)
    return jnp.swapaxes(o, 0, 1).astype(q.dtype)

  return {"fused": fused, "lib": lib, "xla": xla}


def with_grad(f):
  """fwd+bwd: the gradient of sum(f(G, q, k, v) * w) with respect to q, k, v."""
  import jax
  import jax.numpy as jnp

  return jax.grad(
    lambda G, q, k, v, w: jnp.sum(f(G, q, k, v).astype(jnp.float32) * w), argnums=(1, 2, 3)
  )


@functools.lru_cache(maxsize=None)
def _normal_fn(shape):
  import jax
  import jax.numpy as jnp

  return jax.jit(lambda key: jax.random.normal(key, shape, jnp.float32).astype(jnp.float16))


def normal_f16(seed, shape):
  """A float16 standard normal array made on the device (no host copy of GB-sized inputs)."""
  import jax

  return _normal_fn(tuple(shape))(jax.random.key(seed))


def memory_mb(compiled):
  """(temp MB, temp + arguments + outputs MB) of a compiled program, or (None, None)."""
  try:
    mem = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - not every backend reports
    return None, None
  if isinstance(mem, (list, tuple)):
    mem = mem[0] if mem else None
  if mem is None:
    return None, None
  tmp = getattr(mem, "temp_size_in_bytes", None)
  if tmp is None:
    return None, None
  tot = (
    tmp
    + getattr(mem, "argument_size_in_bytes", 0)
    + getattr(mem, "output_size_in_bytes", 0)
    - getattr(mem, "alias_size_in_bytes", 0)
  )
  return tmp / _MB, tot / _MB


def is_oom(e: Exception) -> bool:
  s = str(e)
  return "RESOURCE_EXHAUSTED" in s or "out of memory" in s.lower()


def rel_err(a, b) -> float:
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _compile_all(jobs, pool):
  """{job key: compiled program or the exception}: traced here, compiled on a thread pool."""
  import jax

  lowered, out = {}, {}
  for key, (fn, args) in jobs.items():
    try:
      lowered[key] = jax.jit(fn).lower(*args)
    except Exception as e:  # noqa: BLE001
      out[key] = e
  futures = {key: pool.submit(low.compile) for key, low in lowered.items()}
  for key, fut in futures.items():
    try:
      out[key] = fut.result()
    except Exception as e:  # noqa: BLE001
      out[key] = e
  return out


def _measure(compiled, args, repeat, keep=False, budget_s=0.4):
  """{'ms', 'tmp', 'tot', 'out'} of a compiled program; 'ms' is 'OOM' or 'fail' if it fails."""
  import jax

  res = {"ms": None, "tmp": None, "tot": None, "out": None}
  try:
    if isinstance(compiled, Exception):
      raise compiled
    res["tmp"], res["tot"] = memory_mb(compiled)
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - t0
    if keep:
      res["out"] = out
    del out
    # about budget_s of timed calls (at least 3): slow peers get few repeats
    reps = int(np.clip(budget_s / max(first, 1e-6), 3, repeat))
    res["ms"] = common.time_fn(compiled, *args, warmup=1, repeat=reps)
  except Exception as e:  # noqa: BLE001 - out of memory, or a peer that cannot run this size
    print(f"    failed: {str(e).splitlines()[0][:100] if str(e) else type(e).__name__}", flush=True)
    res["ms"] = "OOM" if is_oom(e) else "fail"
  return res


def _check(outs, mode, label):
  """Largest pairwise relative error of the methods' results; asserts it is < CHECK_TOL."""
  import jax

  got = {k: jax.tree_util.tree_leaves(v) for k, v in outs.items() if v is not None}
  worst = 0.0
  names = sorted(got)
  for i, a in enumerate(names):
    for b in names[i + 1 :]:
      errs = [rel_err(x, y) for x, y in zip(got[a], got[b])]
      print(
        f"    check {mode} {a} vs {b}: rel err {', '.join(f'{x:.1e}' for x in errs)}", flush=True
      )
      worst = max(worst, *errs)
      assert max(errs) < CHECK_TOL, (
        f"{label} {mode}: {a} and {b} differ (relative errors {errs}); a peer is wrong"
      )
  return worst


def _grid(quick):
  if quick:
    return [(64, 4), (128, 4)]
  ds = (32, 64, 128)
  return [(d, h) for d in ds for h in (1, 4, 8)]


def _graphs(quick):
  import jax

  if quick and jax.default_backend() == "cpu":  # rmat17 takes minutes on a small CPU
    graphs = {nm: common.package_graph(nm) for nm in common.real_graph_names()}
    graphs["rmat14-d16"] = common.rmat(14, 16)
    return graphs
  return common.benchmark_graphs(quick)


def run(quick: bool = False) -> list[dict]:
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst

  configs = _grid(quick)
  rows_out = []
  seed = 0
  # the six programs of a config compile concurrently (XLA compiles outside the GIL)
  pool = concurrent.futures.ThreadPoolExecutor(2 * len(METHODS))
  try:
    for name, g in _graphs(quick).items():
      A = jst.SparseMatrix.from_scipy(g)
      n = g.shape[0]
      erows, ecols = csr_edges(g)
      assert erows.size == A.nnz, (erows.size, A.nnz)
      graph_arg = {"fused": A, "lib": A, "xla": (jnp.asarray(erows), jnp.asarray(ecols))}
      repeat = 10 if g.nnz > 2_000_000 else 20
      for ci, (d, H) in enumerate(configs):
        check = ci == 0  # the first config of every graph: the peers must agree
        q, k, v, w = (normal_f16(seed + i, (H, n, d)) for i in range(4))
        seed += 4
        fns = methods(1.0 / math.sqrt(d))
        args = {m: (graph_arg[m], q, k, v) for m in METHODS}
        jobs = {("fwd", m): (fns[m], args[m]) for m in METHODS}
        jobs.update({("fwd+bwd", m): (with_grad(fns[m]), args[m] + (w,)) for m in METHODS})
        t0 = time.perf_counter()
        compiled = _compile_all(jobs, pool)
        print(
          f"  {name} d={d} H={H}: 6 programs compiled in {time.perf_counter() - t0:.1f} s",
          flush=True,
        )
        for mode in ("fwd", "fwd+bwd"):
          row = dict(graph=name, nodes=n, nnz=int(A.nnz), d=d, H=H, mode=mode)
          print(f"  {name} d={d} H={H} {mode}", flush=True)
          outs = {}
          for m in METHODS:
            res = _measure(compiled.pop((mode, m)), jobs[(mode, m)][1], repeat, keep=check)
            row[_MS[m]] = res["ms"]
            row[f"{m}_tmp_MB"] = res["tmp"]
            row[f"{m}_MB"] = res["tot"]
            outs[m] = res["out"]
          if check:
            row["rel_err"] = f"{_check(outs, mode, f'{name} d={d} H={H}'):.1e}"
          del outs
          f, x, lb = row["fused_ms"], row["xla_ms"], row["lib_unfused_ms"]
          if isinstance(f, float):
            row["x_vs_xla"] = x / f if isinstance(x, float) else x
            row["x_vs_lib"] = lb / f if isinstance(lb, float) else lb
          rows_out.append(row)
          print("   ", {c: row.get(c) for c in COLUMNS[6:]}, flush=True)
        del q, k, v, w, args, jobs, compiled
      del A, graph_arg
      jax.clear_caches()
  finally:
    pool.shutdown()
  return rows_out


def summary(rows):
  out = []
  for mode in ("fwd", "fwd+bwd"):
    for d in sorted({r["d"] for r in rows}):
      sel = [r for r in rows if r["mode"] == mode and r["d"] == d]
      vx = [r["x_vs_xla"] for r in sel if isinstance(r.get("x_vs_xla"), float)]
      vl = [r["x_vs_lib"] for r in sel if isinstance(r.get("x_vs_lib"), float)]
      mem = [
        r["xla_MB"] / r["fused_MB"]
        for r in sel
        if isinstance(r.get("xla_MB"), float) and r.get("fused_MB")
      ]
      out.append(
        {
          "mode": mode,
          "d": d,
          "cases": len(sel),
          "geomean_vs_xla": common.geomean(vx),
          "geomean_vs_lib_unfused": common.geomean(vl),
          "geomean_mem_xla/fused": common.geomean(mem),
          "xla_oom_cases": sum(1 for r in sel if r.get("xla_ms") == "OOM"),
          "lib_oom_cases": sum(1 for r in sel if r.get("lib_unfused_ms") == "OOM"),
          "target_vs_xla": 4.0 if mode == "fwd" else 3.0,
        }
      )
  return out


if __name__ == "__main__":
  common.main(sys.modules[__name__])
