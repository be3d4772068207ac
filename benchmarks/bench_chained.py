"""Device time per operation: K dependent calls inside one compiled program, per call.

The per-call benchmarks (bench_spmm_sddmm, bench_attention) time one jitted call at a time; on
a small graph (Cora: 2.7k nodes) every implementation then measures host dispatch (~50 us per
JAX call, ~30 us per torch call), not its kernels. Inside a user's jitted model the operations
run back to back on the device. This benchmark measures that: one program makes K calls, and
the time per call is the GPU's time for the program over K (`us_per_call`: the program queued
behind a matmul that outlasts the host's queueing, common.time_jax_device; torch: a CUDA graph
of the K calls replayed between CUDA events). `wall_us` is the program's wall time over K, which
on Cora is the host's pace of enqueueing (for XLA's fusions as for our FFI calls), not the
GPU's. The calls depend on each other through their data, so none can be merged or dropped and
nothing is added between them: SpMM
x <- A_norm x (A_norm: rows scaled by 1/degree, so values stay bounded), attention q <- out;
SDDMM (whose output is not an input) runs on K different operand pairs and returns all K
outputs (independent calls: XLA may fuse some of its K into one kernel, which favours it); the
"-serial" rows order each call after the previous one's output (an optimization barrier, no
work added), so that every call stands alone on both sides.
cuSPARSE: the same K-step SpMM chain captured in one CUDA graph and replayed (if capture fails,
K launches timed with CUDA events; the `how` column says which).

This is the suite behind docs/PERFORMANCE.md:
  python -m benchmarks.bench_chained [--quick] [--graphs a,b] [--ops spmm,sddmm,attention]
      [--chain K] [--attention-dims 64,128] [--plot PATH]
Rows at d=128 (SpMM fp16 and float32 as tf32, SDDMM fp16) and attention forward and
forward+backward (fp16, d=64 and 128, H=4; fwd+bwd: q <- q + 1e-3 (dq + dk + dv) with the
gradients of sum(out * w), as bench_attention) on every benchmark graph, against the peers of
the per-call benchmarks. On the large graphs the per-call and chained times agree (a check of
the method); on Cora they differ by the dispatch cost.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np

from benchmarks import common


def _forced(**kwargs):
  """jst.spmm / jst.sddmm keyword arguments forcing a kernel family, or None where this build of
  the library has no KernelOptions (then the forced rows are skipped)."""
  import jaxsparse_tc as jst

  if not hasattr(jst, "KernelOptions"):
    return None
  return {"options": jst.KernelOptions(**kwargs)}


COLUMNS = ["graph", "op", "d", "H", "impl", "us_per_call", "wall_us", "how", "K"]


def _chain(f, k: int):
  """A jitted program x <- f(*consts, x), k times: the result of each call feeds the next."""
  import jax

  def run(*args):
    *consts, x = args
    for _ in range(k):
      x = f(*consts, x)
    return x

  return jax.jit(run)


def _serial(f):
  """(G, qs, ys) -> the tuple of f(G, q_i, y_i), call i ordered after call i - 1's output by an
  optimization barrier: XLA may neither fuse nor overlap the calls, and adds no work."""
  import jax

  def run(G, qs, ys):
    outs = []
    for q, y in zip(qs, ys):
      if outs:
        q, _ = jax.lax.optimization_barrier((q, outs[-1]))
      outs.append(f(G, q, y))
    return tuple(outs)

  return run


def grad_step(f):
  """One fwd+bwd call of a chain: q <- q + 1e-3 (dq + dk + dv), the gradients of
  sum(f(G, q, k, v) * w), so every gradient is used."""
  from benchmarks import bench_attention

  grad = bench_attention.with_grad(f)

  def step(G, k_, v_, w_, q_):
    dq, dk, dv = grad(G, q_, k_, v_, w_)
    return (q_ + 1e-3 * (dq + dk + dv)).astype(q_.dtype)

  return step


def _time_jax(prog, args, k: int) -> tuple[float, float]:
  """(device, wall) microseconds per call of a k-call program."""
  return common.time_jax_device(prog, args, k)


def _time_torch(step, x0, k: int) -> tuple[float, str]:
  """Microseconds per call of the chain x <- step(x), k times: a CUDA graph replay, else events."""
  import torch

  def chain():
    x = x0
    for _ in range(k):
      x = step(x)
    return x

  torch.cuda.synchronize()
  try:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
      chain()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
      chain()
    replay, how = graph.replay, "cuda graph"
  except Exception:  # noqa: BLE001 - capture is not supported everywhere
    torch.cuda.synchronize()
    replay, how = chain, "events"
  ms = common.time_torch(replay, warmup=3, repeat=10)
  return ms * 1e3 / k, how


def run(
  quick: bool = False,
  graphs=None,
  ops=("spmm", "sddmm", "attention"),
  k: int = 32,
  attention_dims=(64, 128),
  on_graph=None,
) -> list[dict]:
  """The rows of every graph; `on_graph(rows)` is called after each graph (partial results
  survive a run that is stopped)."""
  import functools

  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst
  from benchmarks import bench_attention

  try:
    import torch

    has_torch = torch.cuda.is_available()
  except Exception:  # noqa: BLE001 - torch is optional
    has_torch = False

  rows: list[dict] = []
  d = 128
  spmm_tc, sddmm_tc = _forced(spmm="windows"), _forced(sddmm="windows")
  for gname, csr in common.benchmark_graphs(quick, graphs).items():
    csr = csr.tocsr()
    csr.sort_indices()
    m, n = csr.shape
    A = jst.SparseMatrix.from_scipy(csr)
    coo = csr.tocoo()
    r_idx = jnp.asarray(coo.row.astype(np.int32))
    c_idx = jnp.asarray(coo.col.astype(np.int32))
    rng = np.random.default_rng(0)
    x32 = jnp.asarray(rng.standard_normal((n, d), np.float32))

    def add(op, impl, us, how="jit chain", h=None, dd=d, kk=None):
      us, wall = us if isinstance(us, tuple) else (us, us)  # JAX: (device, wall); torch: one
      rows.append(
        {
          "graph": gname,
          "op": op,
          "d": dd,
          "H": h,
          "impl": impl,
          "us_per_call": us,
          "wall_us": wall,
          "how": how,
          "K": kk or k,
        }
      )
      print(f"{gname} {op} d={dd} H={h} {impl}: {us:.1f} us (wall {wall:.1f})", flush=True)

    if "spmm" in ops:
      # x <- A_norm x
      deg = np.maximum(np.diff(csr.indptr), 1).astype(np.float32)
      norm = csr.multiply(1.0 / deg[:, None]).tocsr()
      norm.sort_indices()
      A_n = jst.SparseMatrix.from_scipy(norm)
      for name, dt in (("fp16", jnp.float16), ("tf32", jnp.float32)):
        Ad = A_n.with_values(A_n.values.astype(dt))
        add("spmm", f"ours-{name}", _time_jax(_chain(jst.spmm, k), (Ad, x32.astype(dt)), k))
        if spmm_tc:  # same inputs, the tensor-core kernels forced
          add(
            "spmm",
            f"ours-{name}-tc",
            _time_jax(_chain(functools.partial(jst.spmm, **spmm_tc), k), (Ad, x32.astype(dt)), k),
          )
      vals_n = jnp.asarray(norm.tocoo().data.astype(np.float32))
      seg = lambda v, x: jax.ops.segment_sum(
        v[:, None] * x[c_idx], r_idx, num_segments=m, indices_are_sorted=True
      )
      add("spmm", "xla-segment_sum-fp32", _time_jax(_chain(seg, k), (vals_n, x32), k))
      if has_torch:
        tA = common.torch_csr(norm.astype(np.float32))
        tx = torch.as_tensor(np.asarray(x32)).cuda()
        for name, tdt in (("fp32", torch.float32), ("fp16", torch.float16)):
          tAd, txd = tA.to(tdt), tx.to(tdt)
          us, how = _time_torch(lambda x: torch.sparse.mm(tAd, x), txd, k)
          add("spmm", f"cusparse-{name}", us, how)
        del tA, tx, tAd, txd
        torch.cuda.empty_cache()
      del A_n, Ad

    if "sddmm" in ops:
      # SDDMM: ks calls on different operands (q_i, y_i), all outputs returned. (Distinct q_i
      # too: with one q, XLA computes the shared q[rows] gather once for all calls.)
      ks = max(4, min(k, int(4e9 // ((m + n) * d * 2))))
      qs = tuple(jnp.asarray(rng.standard_normal((m, d)), jnp.float16) for _ in range(ks))
      ys = tuple(jnp.asarray(rng.standard_normal((n, d)), jnp.float16) for _ in range(ks))

      def ours(**kw):
        return jax.jit(
          lambda A, qs, ys: tuple(jst.sddmm(A, q, y, **kw).values for q, y in zip(qs, ys))
        )

      add("sddmm", "ours-fp16", _time_jax(ours(), (A, qs, ys), ks), how="jit fan", kk=ks)
      if sddmm_tc:  # same inputs, the tensor-core kernel forced
        add(
          "sddmm",
          "ours-fp16-tc",
          _time_jax(ours(**sddmm_tc), (A, qs, ys), ks),
          how="jit fan",
          kk=ks,
        )
      gather_one = lambda q, y: jnp.sum(  # noqa: E731
        q[r_idx].astype(jnp.float32) * y[c_idx].astype(jnp.float32), -1
      ).astype(q.dtype)
      gather = jax.jit(lambda qs, ys: tuple(gather_one(q, y) for q, y in zip(qs, ys)))
      add("sddmm", "xla-gather-fp16", _time_jax(gather, (qs, ys), ks), how="jit fan", kk=ks)
      # The same fans with each call ordered after the previous one (no compute added), so that
      # XLA cannot fuse calls across the fan: each call stands alone, as in a model.
      add(
        "sddmm",
        "ours-fp16-serial",
        _time_jax(jax.jit(_serial(lambda A, q, y: jst.sddmm(A, q, y).values)), (A, qs, ys), ks),
        how="jit serial fan",
        kk=ks,
      )
      add(
        "sddmm",
        "xla-gather-fp16-serial",
        _time_jax(jax.jit(_serial(lambda _, q, y: gather_one(q, y))), (None, qs, ys), ks),
        how="jit serial fan",
        kk=ks,
      )
      del qs, ys

    if "attention" in ops:
      # Attention forward, H = 4: q <- out
      rows_e, cols_e = bench_attention.csr_edges(csr)
      edges = (jnp.asarray(rows_e), jnp.asarray(cols_e))
      h = 4
      ka_ = max(2, min(k, int(2e9 // (csr.nnz * h * 4 * 8))))  # XLA's temporaries per call
      for da in attention_dims:
        qa, ka, va = (jnp.asarray(rng.standard_normal((h, s, da)), jnp.float16) for s in (m, n, n))
        meths = bench_attention.methods(1.0 / np.sqrt(da))
        fused = lambda A, k_, v_, q_: meths["fused"](A, q_, k_, v_)
        xla = lambda e, k_, v_, q_: meths["xla"](e, q_, k_, v_)
        add(
          "attention fwd",
          "fused",
          _time_jax(_chain(fused, ka_), (A, ka, va, qa), ka_),
          h=h,
          dd=da,
          kk=ka_,
        )
        add(
          "attention fwd",
          "xla-unfused",
          _time_jax(_chain(xla, ka_), (edges, ka, va, qa), ka_),
          h=h,
          dd=da,
          kk=ka_,
        )
        if m == n:  # fwd+bwd: q <- q + 1e-3 (dq + dk + dv), every gradient used
          w = jnp.asarray(rng.standard_normal((h, m, da)), jnp.float32)
          for impl, graph in (("fused", A), ("xla-unfused", edges)):
            step = grad_step(meths["xla" if impl == "xla-unfused" else "fused"])
            try:
              us = _time_jax(_chain(step, ka_), (graph, ka, va, w, qa), ka_)
            except Exception as e:  # noqa: BLE001 - XLA's unfused backward may not fit
              if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
                raise
              us, how = float("nan"), "out of memory"
            else:
              how = "jit chain"
            add("attention fwd+bwd", impl, us, how=how, h=h, dd=da, kk=ka_)
          del w
        del qa, ka, va
    del A
    if on_graph is not None:
      on_graph(rows)
  return rows


def summary(rows: list[dict]) -> list[dict]:
  """Speedups per graph (peer time / ours) and their geometric mean."""

  def us(graph, op, impl, d):
    for r in rows:
      if r["graph"] == graph and r["op"] == op and r["impl"] == impl and r["d"] == d:
        return r["us_per_call"]
    return None

  graphs = sorted({r["graph"] for r in rows})
  pairs = [
    ("SpMM ours-fp16 vs cusparse-fp32", "spmm", "ours-fp16", "cusparse-fp32", 128),
    ("SpMM ours-fp16 vs cusparse-fp16", "spmm", "ours-fp16", "cusparse-fp16", 128),
    ("SpMM ours-tf32 vs cusparse-fp32", "spmm", "ours-tf32", "cusparse-fp32", 128),
    ("SpMM ours-fp16 vs ours-fp16-tc", "spmm", "ours-fp16", "ours-fp16-tc", 128),
    ("SDDMM ours-fp16 vs ours-fp16-tc", "sddmm", "ours-fp16", "ours-fp16-tc", 128),
    ("SpMM ours-tf32 vs xla-segment_sum-fp32", "spmm", "ours-tf32", "xla-segment_sum-fp32", 128),
    ("SDDMM ours-fp16 vs xla-gather-fp16", "sddmm", "ours-fp16", "xla-gather-fp16", 128),
    (
      "SDDMM serial fans: ours vs xla-gather",
      "sddmm",
      "ours-fp16-serial",
      "xla-gather-fp16-serial",
      128,
    ),
    ("attention fwd H=4 d=64: fused vs xla", "attention fwd", "fused", "xla-unfused", 64),
    ("attention fwd H=4 d=128: fused vs xla", "attention fwd", "fused", "xla-unfused", 128),
    ("attention fwd+bwd H=4 d=64: fused vs xla", "attention fwd+bwd", "fused", "xla-unfused", 64),
    ("attention fwd+bwd H=4 d=128: fused vs xla", "attention fwd+bwd", "fused", "xla-unfused", 128),
  ]
  return [
    common.speedup_row(
      "device time per call (speedup)",
      label,
      graphs,
      lambda g: us(g, op, ours, d),
      lambda g: us(g, op, peer, d),
    )
    for label, op, ours, peer, d in pairs
  ]


def plot(summary_rows: list[dict], path, title: str) -> None:
  """Speedup over each peer per graph (one panel per comparison), with the geomean line."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = [r for r in summary_rows if np.isfinite(r["geomean"])]
  graphs = [g for g in rows[0] if g not in ("device time per call (speedup)", "geomean")]
  fig, axes = plt.subplots(len(rows), 1, figsize=(9, 1.9 * len(rows)), sharex=True)
  for ax, r in zip(np.atleast_1d(axes), rows):
    vals = [r.get(g) or np.nan for g in graphs]
    ax.bar(graphs, vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(r["geomean"], color="tab:blue", ls="--", lw=0.8)
    ax.set_ylabel("x", rotation=0)
    ax.set_title(
      f"{r['device time per call (speedup)']} (geomean {r['geomean']:.2f}x)", fontsize=9, loc="left"
    )
  plt.xticks(rotation=30, ha="right", fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout(rect=(0, 0, 1, 0.98))
  fig.savefig(path, dpi=110)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--graphs", default=None, help="comma-separated names (default: all)")
  ap.add_argument("--ops", default="spmm,sddmm,attention")
  ap.add_argument("--chain", type=int, default=32, help="K calls per program")
  ap.add_argument("--attention-dims", default="64,128")
  ap.add_argument("--plot", default=None, help="write the speedup plot (PNG) here")
  ap.add_argument("--json", default=None, help="write the rows (JSON) here")
  a = ap.parse_args()

  def save(rows):
    if a.json:
      import json

      with open(a.json, "w") as f:
        json.dump(
          {"device": common.device_name(), "rows": rows, "summary": summary(rows)}, f, indent=1
        )

  rows = run(
    a.quick,
    a.graphs.split(",") if a.graphs else None,
    tuple(a.ops.split(",")),
    a.chain,
    tuple(int(x) for x in a.attention_dims.split(",")),
    on_graph=save,
  )
  common.print_table(rows, COLUMNS, "bench_chained")
  s = summary(rows)
  common.print_table(s, list(s[0].keys()), f"summary ({common.device_name()})")
  if a.plot:
    plot(
      s,
      a.plot,
      f"jaxsparse_tc speedup over peers, per call in a chained program ({common.device_name()})",
    )


if __name__ == "__main__":
  main()
