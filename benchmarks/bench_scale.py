"""Scale on one device: an R-MAT graph of 300M+ nonzeros, built on the host, SpMM, SDDMM and the
attention forward on one GPU, checked against float64 on a sample of rows (int32 overflow in the
format, the kernels or the schedule shows up as wrong rows: the sample always holds the last
rows, the longest rows and rows reading the largest column ids).

    python -m benchmarks.bench_scale                         # R-MAT 2^24 nodes x 20: ~330M nnz
    python -m benchmarks.bench_scale --scale 24 --edges-per-node 16 --dims 128 --dtype float16
    python -m benchmarks.bench_scale --scale 16 --edges-per-node 8            # smoke run (CPU)

Memory-aware: the graph is generated in chunks with int32 indices (common.rmat_csr, ~24 bytes
per edge at its peak); the dense operands are generated on the device (never on the host); the
host keeps the CSR (int32) for the float64 references. Reported: generation and build times,
the host's peak resident memory (ru_maxrss) after each phase, the device's peak memory
(memory_stats) after each op, time per op (median), and the worst relative error of the sampled
rows against float64 (per row: ||y - ref|| / ||ref||).

`benchmarks/run.py` calls `run()`, which uses R-MAT 2^20 x 16 (quick: 2^14 x 8) so that the
suite stays short; the 300M-edge run is this script's default from the command line.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np

from benchmarks import common

COLUMNS = [
  "graph",
  "nodes",
  "nnz",
  "phase",
  "dtype",
  "d",
  "seconds",
  "ms",
  "max_rel_err",
  "tol",
  "ok",
  "host_peak_GB",
  "dev_peak_GB",
]


def host_peak_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def device_peak_gb():
  import jax

  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # noqa: BLE001
    return None
  v = stats.get("peak_bytes_in_use")
  return None if v is None else v / 1e9


def sample_rows(indptr: np.ndarray, indices: np.ndarray, count: int, rng) -> np.ndarray:
  """Rows to check: the first and last 64, the 64 longest, 64 rows holding the largest column
  ids, and random rows."""
  n = indptr.size - 1
  deg = np.diff(indptr)
  k = min(64, n)
  picks = [np.arange(k), np.arange(n - k, n), np.argsort(deg)[-k:]]
  big_cols = np.flatnonzero(indices >= max(0, n - 4096))[:k]
  picks.append(np.searchsorted(indptr, big_cols, side="right") - 1)
  picks.append(rng.integers(0, n, max(0, count - 4 * k)))
  return np.unique(np.concatenate(picks)).astype(np.int64)


def _rel_rows(out: np.ndarray, ref: np.ndarray) -> float:
  out = out.reshape(out.shape[0], -1).astype(np.float64)
  ref = ref.reshape(ref.shape[0], -1)
  num = np.linalg.norm(out - ref, axis=1)
  den = np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
  err = np.where(np.linalg.norm(ref, axis=1) > 0, num / den, num)
  if not np.all(np.isfinite(out)):
    return float("inf")
  return float(err.max()) if err.size else 0.0


def run(quick: bool = False, argv=None) -> list[dict]:
  if argv is None:
    argv = ["--scale", "14" if quick else "20", "--edges-per-node", "8" if quick else "16"]
  args = parse(argv)
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst

  rng = np.random.default_rng(0)
  rows: list[dict] = []
  dtype = {"float16": jnp.float16, "bfloat16": jnp.bfloat16, "float32": jnp.float32}[args.dtype]
  tol = {"float16": 2e-2, "bfloat16": 1e-1, "float32": 1e-3}[args.dtype]
  d = args.dims
  name = f"rmat{args.scale}-d{args.edges_per_node}"

  def record(phase, **kw):
    row = dict(
      graph=name, phase=phase, host_peak_GB=host_peak_gb(), dev_peak_GB=device_peak_gb(), **kw
    )
    if "max_rel_err" in row:
      row["max_rel_err"] = f"{row['max_rel_err']:.2e}"
    rows.append(row)
    print({k: (common._fmt(v) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)

  t0 = time.perf_counter()
  g = common.rmat_csr(args.scale, args.edges_per_node, seed=args.seed)
  n, nnz = g.shape[0], g.nnz
  record("generate", nodes=n, nnz=nnz, seconds=time.perf_counter() - t0)
  indptr = np.asarray(g.indptr, np.int64)
  indices = g.indices  # int32, CSR order (sorted inside rows)
  del g

  t0 = time.perf_counter()
  coo_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
  A = jst.SparseMatrix.from_coo(coo_rows, indices, None, shape=(n, n))
  jax.block_until_ready(A.values)
  del coo_rows
  record("build", nodes=n, nnz=A.nnz, seconds=time.perf_counter() - t0)
  assert A.nnz == nnz, (A.nnz, nnz)

  sample = sample_rows(indptr, indices, args.sample, rng)
  # Keep the check's host work bounded: rows by increasing length while their entries fit
  # --max-entries (hub rows of R-MAT hold up to ~10^5 entries each).
  deg = indptr[sample + 1] - indptr[sample]
  by_len = np.argsort(deg, kind="stable")
  fits = np.cumsum(deg[by_len]) <= args.max_entries
  sample = np.sort(sample[by_len[fits]])
  starts, ends = indptr[sample], indptr[sample + 1]
  ent = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)] or [np.zeros(0)])
  ent = ent.astype(np.int64)
  ent_col = indices[ent].astype(np.int64)
  seg = np.repeat(np.arange(sample.size), ends - starts)
  print(
    f"checking {sample.size} rows ({ent.size} entries; longest {int(deg.max())}, last row "
    f"{int(sample.max())}, largest column {int(ent_col.max()) if ent.size else -1})",
    flush=True,
  )
  # Format positions of the sampled entries (input order = CSR order here).
  pos = np.asarray(jnp.take(A.input_to_format, jnp.asarray(ent, jnp.int32)))
  need = np.unique(np.concatenate([sample, ent_col]))
  r_idx = np.searchsorted(need, sample)
  col_idx = np.searchsorted(need, ent_col)

  def host_rows(x):
    """Rows `need` of a device array [n, w] as float64 (one small gather)."""
    return np.asarray(jnp.take(x, jnp.asarray(need, jnp.int32), axis=0)).astype(np.float64)

  def segment_sum(weights_rows):
    """sum over each sampled row's entries of weights_rows(chunk) ([chunk, d]), chunked."""
    out = np.zeros((sample.size, d))
    for c0 in range(0, ent.size, 1 << 18):
      c = slice(c0, c0 + (1 << 18))
      np.add.at(out, seg[c], weights_rows(c))
    return out

  gen = jax.jit(lambda k: jax.random.normal(k, (n, d), dtype))
  keys = jax.random.split(jax.random.key(args.seed), 4)

  # SpMM (A's values are ones), values in the benchmark's dtype: float32 values would promote
  # 16-bit X to float32 and time the float32 kernels.
  X = gen(keys[0])
  Ad = A.astype(dtype)
  f = jax.jit(lambda A, X: jst.spmm(A, X))
  Y = jax.block_until_ready(f(Ad, X))
  xs = host_rows(X)
  ref = segment_sum(lambda c: xs[col_idx[c]])
  err = _rel_rows(np.asarray(jnp.take(Y, jnp.asarray(sample, jnp.int32), axis=0)), ref)
  del Y
  ms = common.time_fn(f, Ad, X, warmup=1, repeat=args.repeat)
  del Ad
  record(
    "spmm", nodes=n, nnz=nnz, dtype=args.dtype, d=d, ms=ms, max_rel_err=err, tol=tol, ok=err <= tol
  )

  # SDDMM: values at the sampled rows' entries.
  f = jax.jit(lambda A, X, Y: jst.sddmm(A, X, Y).values)
  Y2 = gen(keys[1])
  S = jax.block_until_ready(f(A, X, Y2))
  ys = host_rows(Y2)
  got = np.asarray(jnp.take(S, jnp.asarray(pos, jnp.int32))).astype(np.float64)
  want = np.einsum("ed,ed->e", xs[r_idx][seg], ys[col_idx])
  scale = np.maximum(np.abs(want), np.sqrt(d))  # dot products of N(0,1) rows: ~sqrt(d)
  err = float(np.max(np.abs(got - want) / scale)) if got.size else 0.0
  err = err if np.all(np.isfinite(got)) else float("inf")
  del S
  ms = common.time_fn(f, A, X, Y2, warmup=1, repeat=args.repeat)
  record(
    "sddmm", nodes=n, nnz=nnz, dtype=args.dtype, d=d, ms=ms, max_rel_err=err, tol=tol, ok=err <= tol
  )
  del Y2

  # Attention forward (16-bit or float32; float32 softmax).
  if not args.skip_attention:
    adt = dtype
    Q, K, V = X, gen(keys[2]), gen(keys[3])
    f = jax.jit(lambda A, Q, K, V: jst.sparse_attention(A, Q, K, V))
    out = jax.block_until_ready(f(A, Q, K, V))
    qs, ks, vs = xs, host_rows(K), host_rows(V)
    logits = np.einsum("ed,ed->e", qs[r_idx][seg], ks[col_idx]) / np.sqrt(d)
    mx = np.full(sample.size, -np.inf)
    np.maximum.at(mx, seg, logits)
    p = np.exp(logits - mx[seg])
    den = np.zeros(sample.size)
    np.add.at(den, seg, p)
    ref = segment_sum(lambda c: p[c, None] * vs[col_idx[c]])
    ref /= np.maximum(den, 1e-300)[:, None]
    err = _rel_rows(np.asarray(jnp.take(out, jnp.asarray(sample, jnp.int32), axis=0)), ref)
    del out
    ms = common.time_fn(f, A, Q, K, V, warmup=1, repeat=args.repeat)
    record(
      "attention_fwd",
      nodes=n,
      nnz=nnz,
      dtype=jnp.dtype(adt).name,
      d=d,
      ms=ms,
      max_rel_err=err,
      tol=tol,
      ok=err <= tol,
    )
  return rows


def summary(rows):
  bad = [r["phase"] for r in rows if r.get("ok") is False]
  return [
    {
      "graph": rows[0]["graph"] if rows else "-",
      "nnz": rows[0].get("nnz") if rows else None,
      "all_ok": not bad,
      "failed": ",".join(bad) or "-",
      "host_peak_GB": max((r["host_peak_GB"] for r in rows), default=None),
      "dev_peak_GB": max((r["dev_peak_GB"] or 0 for r in rows), default=None),
    }
  ]


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--scale", type=int, default=24)
  p.add_argument("--edges-per-node", type=int, default=20)
  p.add_argument("--dims", type=int, default=128)
  p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
  p.add_argument("--sample", type=int, default=2048, help="rows checked against float64")
  p.add_argument(
    "--max-entries",
    type=int,
    default=1_000_000,
    help="most nonzeros of the sampled rows (bounds the host's check)",
  )
  p.add_argument("--repeat", type=int, default=5)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--skip-attention", action="store_true")
  return p.parse_args(argv)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  rows = run(argv=argv)
  print(f"\n# device: {common.device_name()}")
  common.print_table(rows, COLUMNS, "bench_scale")
  s = summary(rows)
  common.print_table(s, list(s[0].keys()), "summary")
  common.write_json(rows, "bench_scale")
  return 0 if s[0]["all_ok"] else 1


if __name__ == "__main__":
  raise SystemExit(main())
