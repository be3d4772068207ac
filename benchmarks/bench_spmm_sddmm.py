"""SpMM and SDDMM: this library's CUDA kernels against cuSPARSE (torch CSR), XLA gather /
segment_sum and jax.experimental.sparse, in one run on the same inputs.

Timing: every implementation is timed the same way: `iters` back-to-back calls (JAX dispatches
asynchronously, torch launches asynchronously), then one synchronisation; median over 5
repeats of the per-call time. Kernels longer than the ~10-20 us host dispatch cost are timed at
device speed; tiny graphs (Cora) measure dispatch for every implementation alike. The JAX
implementations close over the sparsity structure (ours: the pattern; XLA: its index arrays)
and take values and dense operands as arguments (jax.experimental.sparse: the matrix object).
GB/s: the minimal bytes (A's column indices, row pointers and values once, each touched dense
row once, the output once) over the time.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from benchmarks import common

# At d=128 both kernel families are timed forced next to the default: rows
# `ours-rows-<dtype>` (its fp32 is exact: compare it with ours-fp32-highest too) and
# `ours-<dtype>-tc` (the tensor-core window kernels).
FAMILIES = {"rows": "rows", "tc": "windows"}
COLUMNS = ["graph", "op", "d", "impl", "ms", "GB/s", "GFLOP/s", "err"]


def _sync_jax(out):
  import jax

  jax.block_until_ready(out)


def _time(call, sync, budget_s: float = 0.04) -> float:
  """Median ms per call of back-to-back calls (see the module docstring)."""
  for _ in range(3):
    sync(call())
  t0 = time.perf_counter()
  sync(call())
  one = time.perf_counter() - t0
  iters = int(min(50, max(3, budget_s / max(one, 1e-6))))
  samples = []
  for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(iters):
      out = call()
    sync(out)
    samples.append((time.perf_counter() - t0) / iters)
  return float(np.median(samples) * 1e3)


def _rel(a, b) -> float:
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run(quick: bool = False) -> list[dict]:
  import jax
  import jax.numpy as jnp
  from jax.experimental import sparse as jsparse

  import jaxsparse_tc as jst

  try:
    import torch

    has_torch = torch.cuda.is_available()
  except Exception:  # noqa: BLE001 - torch is optional
    has_torch = False

  rows_out: list[dict] = []
  bw = common.copy_bandwidth() / 1e9
  rows_out.append({"graph": "-", "op": "copy", "d": 0, "impl": "device copy", "GB/s": bw})
  print(f"device copy bandwidth: {bw:.0f} GB/s")
  ds = [128] if quick else [32, 64, 128, 256]
  dtypes = {"fp16": jnp.float16, "bf16": jnp.bfloat16, "fp32": jnp.float32}

  for gname, csr in common.benchmark_graphs(quick).items():
    csr = csr.tocsr()
    csr.sort_indices()
    m, n = csr.shape
    nnz = csr.nnz
    t0 = time.perf_counter()
    A = jst.SparseMatrix.from_scipy(csr)
    print(
      f"{gname}: {m} x {n}, nnz {nnz}, blocks {A.pattern.num_blocks}, "
      f"items {A.pattern.schedule.shape[0]}, built in {time.perf_counter() - t0:.1f}s",
      flush=True,
    )
    coo = csr.tocoo()
    r_idx = jnp.asarray(coo.row.astype(np.int32))
    c_idx = jnp.asarray(coo.col.astype(np.int32))
    vals32 = jnp.asarray(coo.data.astype(np.float32))
    # the library's values in format order come from the same scipy data
    if has_torch:
      t_rowptr = torch.as_tensor(csr.indptr.astype(np.int64)).cuda()
      t_col = torch.as_tensor(csr.indices.astype(np.int64)).cuda()
      t_val32 = torch.as_tensor(csr.data.astype(np.float32)).cuda()
      tA = {
        k: torch.sparse_csr_tensor(t_rowptr, t_col, t_val32.to(dt), size=(m, n))
        for k, dt in (("fp32", torch.float32), ("fp16", torch.float16))
      }
    bcoo = jsparse.BCOO((vals32, jnp.stack([r_idx, c_idx], 1)), shape=(m, n))
    bcsr = jsparse.BCSR.from_bcoo(bcoo)
    rng = np.random.default_rng(0)

    for d in ds:
      x32 = jnp.asarray(rng.standard_normal((n, d), np.float32))
      q32 = jnp.asarray(rng.standard_normal((m, d), np.float32))
      flops_spmm = 2.0 * nnz * d

      def add(op, impl, dt_name, ms, err=None):
        isz = 2 if dt_name in ("fp16", "bf16") else 4
        rows_out.append(
          {
            "graph": gname,
            "op": op,
            "d": d,
            "impl": impl,
            "ms": ms,
            "GB/s": common.min_bytes(csr, d, isz, op) / (ms * 1e-3) / 1e9,
            "GFLOP/s": flops_spmm / (ms * 1e-3) / 1e9,
            "err": None if err is None else f"{err:.1e}",
          }
        )

      # ---- SpMM -------------------------------------------------------------------------
      # rows come from the sorted CSR: sorted segments, as BASELINES.md's xla-segment_sum
      seg = jax.jit(
        lambda v, x: jax.ops.segment_sum(
          v[:, None] * x[c_idx], r_idx, num_segments=m, indices_are_sorted=True
        )
      )
      ref = np.asarray(seg(vals32, x32), np.float64)  # fp32 reference for the err column
      for name, dt in dtypes.items():
        x = x32.astype(dt)
        Ad = A.with_values(A.values.astype(dt))  # values stored in the compute dtype
        precs = [None, "highest"] if name == "fp32" else [None]
        for prec in precs:
          # The pattern is closed over, as the XLA peers close over their index arrays: every JAX
          # call takes the values and x (the structure's 24 arrays as arguments cost ~35 us of
          # dispatch per call on an H100 host, scripts/latency_probe.py).
          def make(options=None, Ad=Ad, prec=prec):
            return jax.jit(
              lambda v, x: jst.spmm(Ad.with_values(v), x, precision=prec, options=options)
            )

          f = make()
          out = f(Ad.values, x)
          impl = f"ours-{'tf32' if (name == 'fp32' and prec is None) else name}"
          if prec == "highest":
            impl = "ours-fp32-highest"
          add("spmm", impl, name, _time(lambda: f(Ad.values, x), _sync_jax), _rel(out, ref))
          del out
          if prec is None and d == 128:
            for fam, choice in FAMILIES.items():
              g = make(jst.KernelOptions(spmm=choice))
              out = g(Ad.values, x)
              label = f"ours-rows-{name}" if fam == "rows" else f"{impl}-{fam}"
              add("spmm", label, name, _time(lambda: g(Ad.values, x), _sync_jax), _rel(out, ref))
              del out
      add("spmm", "xla-segment_sum-fp32", "fp32", _time(lambda: seg(vals32, x32), _sync_jax))
      if d == 128:
        # (xla-segment_sum-fp16 is left out: fp16 scatter-add took ~1 s per call on rmat17,
        # ../shared/BASELINES.md has it 10-40x slower than fp32.)
        fb = jax.jit(lambda a, x: a @ x)
        add("spmm", "jax-bcoo-fp32", "fp32", _time(lambda: fb(bcoo, x32), _sync_jax))
        add("spmm", "jax-bcsr-fp32", "fp32", _time(lambda: fb(bcsr, x32), _sync_jax))
      if has_torch:
        tx32 = torch.as_tensor(np.asarray(x32)).cuda()
        for name, tdt in (("fp32", torch.float32), ("fp16", torch.float16)):
          tx = tx32.to(tdt)
          out = torch.sparse.mm(tA[name], tx)
          err = _rel(out.float().cpu().numpy(), ref)
          ms = _time(lambda: torch.sparse.mm(tA[name], tx), lambda _: torch.cuda.synchronize())
          add("spmm", f"cusparse-{name}", name, ms, err)
        del tx32, tx, out

      # ---- SDDMM ------------------------------------------------------------------------
      gather = jax.jit(
        lambda q, x: jnp.sum(
          q[r_idx].astype(jnp.float32) * x[c_idx].astype(jnp.float32), -1
        ).astype(q.dtype)
      )
      sref = np.asarray(gather(q32, x32), np.float64)
      sref_f = None
      for name, dt in dtypes.items():
        q, x = q32.astype(dt), x32.astype(dt)
        precs = [None, "highest"] if name == "fp32" else [None]
        for prec in precs:
          f = jax.jit(lambda q, x, prec=prec: jst.sddmm(A, q, x, precision=prec).values)
          out = f(q, x)
          if sref_f is None:  # the reference in the library's value order
            sref_f = np.asarray(
              jax.jit(lambda A, s: A.values_from_input(s))(A, jnp.asarray(sref, jnp.float32)),
              np.float64,
            )
          impl = (
            "ours-fp32-highest" if prec else ("ours-tf32" if name == "fp32" else f"ours-{name}")
          )
          add("sddmm", impl, name, _time(lambda: f(q, x), _sync_jax), _rel(out, sref_f))
          del out
      for name in ("fp32", "fp16"):
        q, x = q32.astype(dtypes[name]), x32.astype(dtypes[name])
        add("sddmm", f"xla-gather-{name}", name, _time(lambda: gather(q, x), _sync_jax))
      del x32, q32
    del A, bcoo, bcsr
    if has_torch:
      del tA
      torch.cuda.empty_cache()
  return rows_out


def summary(rows: list[dict]) -> list[dict]:
  """Geomean over graphs at d=128 of the speedups the project targets."""

  def ms(graph, op, impl):
    for r in rows:
      if r["graph"] == graph and r["op"] == op and r["d"] == 128 and r["impl"] == impl:
        return r["ms"]
    return None

  graphs = sorted({r["graph"] for r in rows if r.get("d") == 128})
  pairs = [
    ("SpMM ours-fp16 vs cusparse-fp32", "spmm", "ours-fp16", "cusparse-fp32", 2.5),
    ("SpMM ours-fp16 vs cusparse-fp16", "spmm", "ours-fp16", "cusparse-fp16", 2.0),
    ("SpMM ours-tf32 vs cusparse-fp32", "spmm", "ours-tf32", "cusparse-fp32", 1.5),
    ("SpMM ours-fp32-highest vs cusparse-fp32", "spmm", "ours-fp32-highest", "cusparse-fp32", None),
    (
      "SpMM ours-rows-fp16 vs ours-fp16 (default)",
      "spmm",
      "ours-rows-fp16",
      "ours-fp16",
      None,
    ),
    (
      "SpMM ours-rows-bf16 vs ours-bf16 (default)",
      "spmm",
      "ours-rows-bf16",
      "ours-bf16",
      None,
    ),
    (
      "SpMM ours-rows-fp32 vs ours-fp32-highest",
      "spmm",
      "ours-rows-fp32",
      "ours-fp32-highest",
      None,
    ),
    ("SpMM ours-rows-fp32 vs ours-tf32", "spmm", "ours-rows-fp32", "ours-tf32", None),
    (
      "SpMM ours-rows-fp16 vs cusparse-fp32",
      "spmm",
      "ours-rows-fp16",
      "cusparse-fp32",
      2.5,
    ),
    (
      "SpMM ours-rows-fp16 vs cusparse-fp16",
      "spmm",
      "ours-rows-fp16",
      "cusparse-fp16",
      2.0,
    ),
    (
      "SpMM ours-rows-fp32 vs cusparse-fp32",
      "spmm",
      "ours-rows-fp32",
      "cusparse-fp32",
      None,
    ),
    ("SDDMM ours-fp16 vs xla-gather-fp16", "sddmm", "ours-fp16", "xla-gather-fp16", 3.0),
    ("SDDMM ours-tf32 vs xla-gather-fp32", "sddmm", "ours-tf32", "xla-gather-fp32", None),
  ]
  return [
    common.speedup_row(
      "comparison (d=128, speedup)",
      label,
      graphs,
      lambda g: ms(g, op, ours),
      lambda g: ms(g, op, peer),
      target=target,
    )
    for label, op, ours, peer, target in pairs
  ]


if __name__ == "__main__":
  common.main(sys.modules[__name__])
