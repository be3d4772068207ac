"""Device time per operation: K dependent calls inside one compiled program, per call.

The per-call benchmarks (bench_spmm_sddmm, bench_attention) time one jitted call at a time; on
a small graph (Cora: 2.7k nodes) every implementation then measures host dispatch (~50 us per
JAX call, ~30 us per torch call), not its kernels. Inside a user's jitted model the operations
run back to back on the device. This benchmark measures that: each program runs the operation
K times, each call ordered after the previous one by `lax.optimization_barrier` (no arithmetic
added, no call merged away), and the time per call is the program's median time over K.
cuSPARSE: K torch.sparse.mm calls captured in one CUDA graph, replayed (if capture fails, K
back-to-back launches timed with CUDA events; the `how` column says which).

Rows at d=128 (SpMM, SDDMM: fp16, and float32 as tf32 for SpMM) and attention forward (fp16,
d=64 and 128, H=4) on every benchmark graph, against the peers of the per-call benchmarks.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

import common  # noqa: E402

COLUMNS = ["graph", "op", "d", "H", "impl", "us_per_call", "how", "K"]


def _chain(f, k: int):
  """A jitted program calling f(*args) k times in sequence; returns the last result."""
  import jax

  def run(*args):
    out = None
    for _ in range(k):
      out = f(*args)
      args, out = jax.lax.optimization_barrier((args, out))
    return out

  return jax.jit(run)


def _median_ms(call, sync, repeat: int = 10) -> float:
  for _ in range(2):
    sync(call())
  times = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    sync(call())
    times.append(time.perf_counter() - t0)
  return float(np.median(times) * 1e3)


def _time_jax(f, args, k: int) -> float:
  """Microseconds per call of f(*args) over a k-call chain in one program."""
  import jax

  prog = _chain(f, k)
  return _median_ms(lambda: prog(*args), jax.block_until_ready) * 1e3 / k


def _time_torch(fn, k: int) -> tuple[float, str]:
  """Microseconds per call of fn over k calls: a CUDA graph replay, else events."""
  import torch

  torch.cuda.synchronize()
  try:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
      for _ in range(3):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
      for _ in range(k):
        fn()
    replay = graph.replay
    how = "cuda graph"
  except Exception:  # noqa: BLE001 - capture is not supported everywhere
    torch.cuda.synchronize()

    def replay():
      for _ in range(k):
        fn()

    how = "events"
  ms = common.time_torch(replay, warmup=3, repeat=10)
  return ms * 1e3 / k, how


def run(quick: bool = False) -> list[dict]:
  import jax
  import jax.numpy as jnp

  import bench_attention
  import jaxsparse_tc as jst

  try:
    import torch

    has_torch = torch.cuda.is_available()
  except Exception:  # noqa: BLE001 - torch is optional
    has_torch = False

  k = int(os.environ.get("BENCH_CHAIN", "32"))
  rows: list[dict] = []
  d = 128
  for gname, csr in common.benchmark_graphs(quick).items():
    csr = csr.tocsr()
    csr.sort_indices()
    m, n = csr.shape
    A = jst.SparseMatrix.from_scipy(csr)
    coo = csr.tocoo()
    r_idx = jnp.asarray(coo.row.astype(np.int32))
    c_idx = jnp.asarray(coo.col.astype(np.int32))
    vals32 = jnp.asarray(coo.data.astype(np.float32))
    rng = np.random.default_rng(0)
    x32 = jnp.asarray(rng.standard_normal((n, d), np.float32))
    q32 = jnp.asarray(rng.standard_normal((m, d), np.float32))

    def add(op, impl, us, how="jit chain", h=None, dd=d):
      rows.append({"graph": gname, "op": op, "d": dd, "H": h, "impl": impl, "us_per_call": us,
                   "how": how, "K": k})
      print(f"{gname} {op} d={dd} H={h} {impl}: {us:.1f} us", flush=True)

    # SpMM
    for name, dt in (("fp16", jnp.float16), ("tf32", jnp.float32)):
      Ad = A.with_values(A.values.astype(dt))
      add("spmm", f"ours-{name}", _time_jax(jst.spmm, (Ad, x32.astype(dt)), k))
    seg = lambda v, x: jax.ops.segment_sum(v[:, None] * x[c_idx], r_idx, num_segments=m,
                                           indices_are_sorted=True)
    add("spmm", "xla-segment_sum-fp32", _time_jax(seg, (vals32, x32), k))
    if has_torch:
      tA = torch.sparse_csr_tensor(torch.as_tensor(csr.indptr.astype(np.int64)),
                                   torch.as_tensor(csr.indices.astype(np.int64)),
                                   torch.as_tensor(csr.data.astype(np.float32)),
                                   size=(m, n)).cuda()
      tx = torch.as_tensor(np.asarray(x32)).cuda()
      for name, tdt in (("fp32", torch.float32), ("fp16", torch.float16)):
        tAd, txd = tA.to(tdt), tx.to(tdt)
        us, how = _time_torch(lambda: torch.sparse.mm(tAd, txd), k)
        add("spmm", f"cusparse-{name}", us, how)
      del tA, tx, tAd, txd
      torch.cuda.empty_cache()

    # SDDMM
    q16, x16 = q32.astype(jnp.float16), x32.astype(jnp.float16)
    add("sddmm", "ours-fp16", _time_jax(lambda A, q, x: jst.sddmm(A, q, x).values, (A, q16, x16), k))
    gather = lambda q, x: jnp.sum(q[r_idx].astype(jnp.float32) * x[c_idx].astype(jnp.float32),
                                  -1).astype(q.dtype)
    add("sddmm", "xla-gather-fp16", _time_jax(gather, (q16, x16), k))

    # Attention forward, H = 4
    rows_e, cols_e = bench_attention.csr_edges(csr)
    edges = (jnp.asarray(rows_e), jnp.asarray(cols_e))
    h = 4
    for da in (64, 128):
      qa, ka, va = (jnp.asarray(rng.standard_normal((h, s, da)), jnp.float16) for s in (m, n, n))
      meths = bench_attention.methods(1.0 / np.sqrt(da))
      add("attention fwd", "fused", _time_jax(meths["fused"], (A, qa, ka, va), k), h=h, dd=da)
      add("attention fwd", "xla-unfused", _time_jax(meths["xla"], (edges, qa, ka, va), k), h=h,
          dd=da)
      del qa, ka, va
    del A
  return rows


def summary(rows: list[dict]) -> list[dict]:
  """Speedups per graph (peer time / ours) and their geometric mean."""

  def us(graph, op, impl, d):
    for r in rows:
      if r["graph"] == graph and r["op"] == op and r["impl"] == impl and r["d"] == d:
        return r["us_per_call"]
    return None

  graphs = sorted({r["graph"] for r in rows})
  pairs = [("SpMM ours-fp16 vs cusparse-fp32", "spmm", "ours-fp16", "cusparse-fp32", 128),
           ("SpMM ours-fp16 vs cusparse-fp16", "spmm", "ours-fp16", "cusparse-fp16", 128),
           ("SpMM ours-tf32 vs cusparse-fp32", "spmm", "ours-tf32", "cusparse-fp32", 128),
           ("SpMM ours-tf32 vs xla-segment_sum-fp32", "spmm", "ours-tf32",
            "xla-segment_sum-fp32", 128),
           ("SDDMM ours-fp16 vs xla-gather-fp16", "sddmm", "ours-fp16", "xla-gather-fp16", 128),
           ("attention fwd H=4 d=64: fused vs xla", "attention fwd", "fused", "xla-unfused", 64),
           ("attention fwd H=4 d=128: fused vs xla", "attention fwd", "fused", "xla-unfused", 128)]
  out = []
  for label, op, ours, peer, d in pairs:
    ratios = {}
    for g in graphs:
      a, b = us(g, op, ours, d), us(g, op, peer, d)
      if a and b:
        ratios[g] = b / a
    row = {"device time per call (speedup)": label, "geomean": common.geomean(ratios.values())}
    row.update({g: ratios.get(g) for g in graphs})
    out.append(row)
  return out


if __name__ == "__main__":
  import sys

  rs = run(quick="--quick" in sys.argv)
  common.print_table(rs, COLUMNS, "bench_chained")
  s = summary(rs)
  common.print_table(s, list(s[0].keys()), "summary")
