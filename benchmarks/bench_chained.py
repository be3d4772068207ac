"""Device time per operation: K dependent calls inside one compiled program, per call.

The per-call benchmarks (bench_spmm_sddmm, bench_attention) time one jitted call at a time; on
a small graph (Cora: 2.7k nodes) every implementation then measures host dispatch (~50 us per
JAX call, ~30 us per torch call), not its kernels. Inside a user's jitted model the operations
run back to back on the device. This benchmark measures that: one program makes K calls, and
the time per call is the GPU's time for the program over K (`us_per_call`: the program queued
behind a matmul that outlasts the host's queueing, common.time_jax_device; torch: a CUDA graph
of the K calls replayed between CUDA events). `wall_us` is the program's wall time over K, which on Cora is the host's
pace of enqueueing (for XLA's fusions as for our FFI calls), not the GPU's. The calls depend on
each other through their data, so none can be merged or dropped and nothing is added between
them: SpMM
x <- A_norm x (A_norm: rows scaled by 1/degree, so values stay bounded), attention q <- out;
SDDMM (whose output is not an input) runs on K different operand pairs and returns all K
outputs (independent calls: XLA may fuse some of its K into one kernel, which favours it); the
"-serial" rows order each call after the previous one's output (an optimization barrier, no
work added), so that every call stands alone on both sides.
cuSPARSE: the same K-step SpMM chain captured in one CUDA graph and replayed (if capture fails,
K launches timed with CUDA events; the `how` column says which).

BENCH_CHAINED_OPS=spmm,sddmm,attention picks the operations; BENCH_CHAIN=K (default 32).
Rows at d=128 (SpMM fp16 and float32 as tf32, SDDMM fp16) and attention forward and
forward+backward (fp16, d=64 and 128, H=4; fwd+bwd: q <- q + 1e-3 (dq + dk + dv) with the
gradients of sum(out * w), as bench_attention) on every benchmark graph, against the peers of
the per-call benchmarks. On the large graphs the per-call and chained times agree (a check of
the method); on Cora they differ by the dispatch cost.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

import common  # noqa: E402

# The tensor-core kernels, forced (the default picks the CUDA-core row kernels for sparse blocks).
SPMM_TC = {"JAXSPARSE_TC_SPMM_VARIANT": "async"}
SDDMM_TC = {"JAXSPARSE_TC_SDDMM_VARIANT": "tc"}


def _variants(var: str) -> dict[str, dict[str, str]]:
  """Kernel experiments: VAR="name=ENV:VALUE;ENV:VALUE,..." adds rows "ours-<dtype>-<name>" run
  with those environment variables set (BENCH_CHAINED_SPMM_VARIANTS, ..._SDDMM_VARIANTS)."""
  return {name: dict(kv.split(":", 1) for kv in spec.split(";"))
          for name, spec in (v.split("=", 1) for v in os.environ.get(var, "").split(",") if v)}


SPMM_VARIANTS = _variants("BENCH_CHAINED_SPMM_VARIANTS")
SDDMM_VARIANTS = _variants("BENCH_CHAINED_SDDMM_VARIANTS")
ATTENTION_VARIANTS = _variants("BENCH_CHAINED_ATTENTION_VARIANTS")  # rows "fused-<name>"

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
  import bench_attention

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
  ops = os.environ.get("BENCH_CHAINED_OPS", "spmm,sddmm,attention").split(",")
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
    rng = np.random.default_rng(0)
    x32 = jnp.asarray(rng.standard_normal((n, d), np.float32))

    def add(op, impl, us, how="jit chain", h=None, dd=d, kk=None):
      us, wall = us if isinstance(us, tuple) else (us, us)  # JAX: (device, wall); torch: one
      rows.append({"graph": gname, "op": op, "d": dd, "H": h, "impl": impl, "us_per_call": us,
                   "wall_us": wall, "how": how, "K": kk or k})
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
        for vname, env in {"tc": SPMM_TC, **SPMM_VARIANTS}.items():  # same inputs, forced
          with common.environ(env):
            add("spmm", f"ours-{name}-{vname}",
                _time_jax(_chain(jst.spmm, k), (Ad, x32.astype(dt)), k))
      vals_n = jnp.asarray(norm.tocoo().data.astype(np.float32))
      seg = lambda v, x: jax.ops.segment_sum(v[:, None] * x[c_idx], r_idx, num_segments=m,
                                             indices_are_sorted=True)
      add("spmm", "xla-segment_sum-fp32", _time_jax(_chain(seg, k), (vals_n, x32), k))
      if has_torch:
        tA = torch.sparse_csr_tensor(torch.as_tensor(norm.indptr.astype(np.int64)),
                                     torch.as_tensor(norm.indices.astype(np.int64)),
                                     torch.as_tensor(norm.data.astype(np.float32)),
                                     size=(m, n)).cuda()
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
      # A new program per variant: a handler reads its switches when XLA records it into a
      # command buffer, and a program replays that record while its buffers stay put.
      ours = lambda: jax.jit(lambda A, qs, ys: tuple(jst.sddmm(A, q, y).values  # noqa: E731
                                                     for q, y in zip(qs, ys)))
      add("sddmm", "ours-fp16", _time_jax(ours(), (A, qs, ys), ks), how="jit fan", kk=ks)
      for vname, env in {"tc": SDDMM_TC, **SDDMM_VARIANTS}.items():  # same inputs, forced
        with common.environ(env):
          add("sddmm", f"ours-fp16-{vname}", _time_jax(ours(), (A, qs, ys), ks), how="jit fan",
              kk=ks)
      gather_one = lambda q, y: jnp.sum(  # noqa: E731
          q[r_idx].astype(jnp.float32) * y[c_idx].astype(jnp.float32), -1).astype(q.dtype)
      gather = jax.jit(lambda qs, ys: tuple(gather_one(q, y) for q, y in zip(qs, ys)))
      add("sddmm", "xla-gather-fp16", _time_jax(gather, (qs, ys), ks), how="jit fan", kk=ks)
      # The same fans with each call ordered after the previous one (no compute added), so that
      # XLA cannot fuse calls across the fan: each call stands alone, as in a model.
      add("sddmm", "ours-fp16-serial",
          _time_jax(jax.jit(_serial(lambda A, q, y: jst.sddmm(A, q, y).values)), (A, qs, ys), ks),
          how="jit serial fan", kk=ks)
      add("sddmm", "xla-gather-fp16-serial",
          _time_jax(jax.jit(_serial(lambda _, q, y: gather_one(q, y))), (None, qs, ys), ks),
          how="jit serial fan", kk=ks)
      del qs, ys

    if "attention" in ops:
      # Attention forward, H = 4: q <- out
      rows_e, cols_e = bench_attention.csr_edges(csr)
      edges = (jnp.asarray(rows_e), jnp.asarray(cols_e))
      h = 4
      ka_ = max(2, min(k, int(2e9 // (csr.nnz * h * 4 * 8))))  # XLA's temporaries per call
      for da in (64, 128):
        qa, ka, va = (jnp.asarray(rng.standard_normal((h, s, da)), jnp.float16) for s in (m, n, n))
        meths = bench_attention.methods(1.0 / np.sqrt(da))
        fused = lambda A, k_, v_, q_: meths["fused"](A, q_, k_, v_)
        xla = lambda e, k_, v_, q_: meths["xla"](e, q_, k_, v_)
        for vname, env in {"": {}, **ATTENTION_VARIANTS}.items():
          with common.environ(env):
            add("attention fwd", "fused" + (vname and f"-{vname}"),
                _time_jax(_chain(fused, ka_), (A, ka, va, qa), ka_), h=h, dd=da, kk=ka_)
        add("attention fwd", "xla-unfused", _time_jax(_chain(xla, ka_), (edges, ka, va, qa), ka_),
            h=h, dd=da, kk=ka_)
        if m == n:  # fwd+bwd: q <- q + 1e-3 (dq + dk + dv), every gradient used
          w = jnp.asarray(rng.standard_normal((h, m, da)), jnp.float32)
          runs = [("fused", A, {}), *((f"fused-{nm}", A, env) for nm, env in
                                      ATTENTION_VARIANTS.items()), ("xla-unfused", edges, {})]
          for impl, graph, env in runs:
            step = grad_step(meths["xla" if impl == "xla-unfused" else "fused"])
            try:
              with common.environ(env):
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
           ("SpMM ours-fp16 vs ours-fp16-tc", "spmm", "ours-fp16", "ours-fp16-tc", 128),
           ("SDDMM ours-fp16 vs ours-fp16-tc", "sddmm", "ours-fp16", "ours-fp16-tc", 128),
           ("SpMM ours-tf32 vs xla-segment_sum-fp32", "spmm", "ours-tf32",
            "xla-segment_sum-fp32", 128),
           ("SDDMM ours-fp16 vs xla-gather-fp16", "sddmm", "ours-fp16", "xla-gather-fp16", 128),
           ("SDDMM serial fans: ours vs xla-gather", "sddmm", "ours-fp16-serial",
            "xla-gather-fp16-serial", 128),
           ("attention fwd H=4 d=64: fused vs xla", "attention fwd", "fused", "xla-unfused", 64),
           ("attention fwd H=4 d=128: fused vs xla", "attention fwd", "fused", "xla-unfused", 128),
           ("attention fwd+bwd H=4 d=64: fused vs xla", "attention fwd+bwd", "fused",
            "xla-unfused", 64),
           ("attention fwd+bwd H=4 d=128: fused vs xla", "attention fwd+bwd", "fused",
            "xla-unfused", 128)]
  return [common.speedup_row("device time per call (speedup)", label, graphs,
                             lambda g: us(g, op, ours, d), lambda g: us(g, op, peer, d))
          for label, op, ours, peer, d in pairs]


if __name__ == "__main__":
  common.main(sys.modules[__name__])
