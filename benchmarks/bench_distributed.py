"""Multi-device SpMM and GCN training step on row-partitioned R-MAT graphs (distributed module).

One command, any device count (1, 2, 4, 8 GPUs, or CPU with forced host devices):

    python -m benchmarks.bench_distributed --devices 2                       # rmat22-d16
    python -m benchmarks.bench_distributed --devices 2,4 --scales 24 --overlap --lhs
    python -m benchmarks.bench_distributed --devices 2 --scales 24 --oom-demo  # 1 GPU OOM, 2 fit
    PJRT_NPROC=8 python -m benchmarks.bench_distributed --devices 4 --scales 14 --quick \
      --cpu-devices 4        # host devices: XLA's CPU pool needs 2 threads a device

For each graph and op it times, in one process:
- `plain`: the unsharded operator on one device (a SparseMatrix; the 1-device baseline);
- `shard1`: the sharded code path on a 1-device mesh (its overhead over plain);
- `shardN`: the graph cut into N row blocks balanced by nonzeros (N = each of --devices, a
  comma-separated list: the graph is generated once for all), with each exchange asked for
  (--exchange: auto, allgather, halo), and with --overlap also each with own/remote parts
  (`+overlap`: the SpMM multiplies the shard's own columns while the other rows are exchanged);
  --lhs times the sharded programs a second time compiled with XLA's latency-hiding scheduler
  (`+lhs`: compiler option xla_gpu_enable_latency_hiding_scheduler, which lets XLA move a
  collective's start before independent kernels).
Columns: build_s (host build of the format), ms (median per call / step), speedup (plain ms /
this ms), xbytes_MB (dense bytes one device receives per step by the layout's count: rows
exchanged x width x itemsize, summed over the step's exchanges), hlo_MB (bytes per device that
the compiled program's collectives move, parsed from its HLO: all-gather, all-to-all,
reduce-scatter, all-reduce (x2, ring)), mem_GB (the compiled program's argument + output +
temporary bytes per device, memory_analysis), halo (rows received per pair / rows per shard).
A run that does not fit prints OOM in ms (the memory error is shown below the table).
--check adds rel_err: each sharded result against the plain run's, in global node order (the
inputs are hashes of node ids, so every layout gets the same numbers): the SpMM output, or the
GCN step's loss and Adam state after the step (its moments are the gradients'); rel_err_exact
the same with both programs compiled under jax.default_matmul_precision("highest") (no tf32
in XLA's matmuls or our kernels: what remains is the order of float32 sums); f64_err that
exact program's (plain runs too) against float64 on the host (scipy, from the same inputs and
initial parameters): the sharded error should be the size of the one-device one.

Ops: `spmm` (A @ X, d = --dims, --dtype), `exchange` (the sharded SpMM's data movement alone:
`distributed.exchange`, the rows every shard's matrix reads, X at d = --dims) and `gcn` (one
training step: 2-layer GCN in -> hidden -> classes, ReLU, softmax cross-entropy over the real
nodes, Adam; float32; features generated on the devices, so the host never holds them) and
`gcn-pre` (the same step with the input features exchanged once, before it: they are constant,
so `distributed.exchange` runs outside the step and layer 1 exchanges nothing). R-MAT
node ids are random, so halos cover nearly every row; --order (affinity, rcm, ...) renumbers the
graph first to give the halo exchange a chance.
`--oom-demo` runs only the big-feature step at --features (default 1024; a feature matrix of
n x 1024 float32 is 69 GB at scale 24): the plain run fails with the memory error, the
sharded one trains. `--big-features F1,F2` adds that step (`gcn-F`, hidden 64, compiled without
XLA's GEMM autotuning, NO_AUTOTUNE) after the others on every mode, so one run shows which
device counts hold which width.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import traceback

import numpy as np

from benchmarks import common

COLUMNS = [
  "graph",
  "nodes",
  "nnz",
  "op",
  "mode",
  "devices",
  "exchange",
  "build_s",
  "ms",
  "speedup",
  "xbytes_MB",
  "hlo_MB",
  "mem_GB",
  "halo",
  "rel_err",
  "rel_err_exact",
  "f64_err",
]


# -- graphs ---------------------------------------------------------------------------------------
def rmat_graph(scale: int, edges_per_node: int, order: str = "none", seed: int = 0):
  """R-MAT CSR (common.rmat_csr: chunked, int32), optionally renumbered for locality:
  jaxsparse_tc.reorder's methods (affinity, rabbit, rcm, degree) or scipy's RCM (scipy-rcm)."""
  g = common.rmat_csr(scale, edges_per_node, seed=seed)
  if order == "none":
    return g
  if order == "scipy-rcm":
    import scipy.sparse.csgraph as csgraph

    perm = csgraph.reverse_cuthill_mckee((g + g.T).tocsr(), symmetric_mode=True)
  else:
    from jaxsparse_tc.reorder import reorder

    perm = np.asarray(reorder(g, order).perm)
  g = g[perm][:, perm].tocsr()
  g.sort_indices()
  return g


def gcn_normalized(g):
  """D^-1/2 (A + I) D^-1/2 of a CSR graph (rows = targets), float32, host (int32 indices)."""
  import scipy.sparse as sp

  n = g.shape[0]
  a = g.tocsr().astype(np.float32)
  a.data[:] = 1.0
  diag = a.diagonal()
  a = (a + sp.diags((diag == 0).astype(np.float32), format="csr")).tocsr()
  deg = np.asarray(a.sum(axis=1)).ravel()
  dinv = np.where(deg > 0, deg**-0.5, 0.0).astype(np.float32)
  rows = np.repeat(np.arange(n, dtype=np.int32), np.diff(a.indptr))
  a.data = (dinv[rows] * a.data * dinv[a.indices]).astype(np.float32)
  del rows
  return a


# -- measurements ---------------------------------------------------------------------------------
def _is_oom(e: BaseException) -> bool:
  s = str(e)
  return "RESOURCE_EXHAUSTED" in s or "out of memory" in s.lower() or "OOM" in s


_SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|f16|bf16|s32|u32|f32|s64|u64|f64)\[([0-9,]*)\]")
_BYTES = {
  "pred": 1,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
}
_COLLECTIVES = {
  "all-gather": 1.0,
  "all-to-all": 1.0,
  "reduce-scatter": 1.0,
  "all-reduce": 2.0,
  "collective-permute": 1.0,
}


def hlo_collective_bytes(text: str, devices: int) -> float:
  """Bytes per device moved by the collectives of a compiled (per-device) HLO module: the
  result bytes of each collective times (P-1)/P (x2 for an all-reduce, x P for a
  reduce-scatter's input); async pairs are counted once (at -start, or the plain op)."""
  if devices <= 1:
    return 0.0
  total = 0.0
  for line in text.splitlines():
    if "=" not in line:
      continue
    lhs, rhs = line.split("=", 1)
    m = re.search(
      r"\b(all-gather|all-to-all|reduce-scatter|all-reduce|collective-permute)"
      r"(-start)?\(",
      rhs,
    )
    if not m:
      continue
    kind = m.group(1)
    head = rhs[: m.start()]
    sizes = [
      int(np.prod([int(d) for d in dims.split(",") if d] or [1])) * _BYTES[t]
      for t, dims in _SHAPE.findall(head)
    ]
    if not sizes:
      continue
    # An async -start's tuple holds its input and output: count the output (the largest); a
    # plain op's tuple is its results (an all-to-all of several chunks): count them all.
    b = (max(sizes) if m.group(2) else sum(sizes)) * _COLLECTIVES[kind] * (devices - 1) / devices
    total += b * (devices if kind == "reduce-scatter" else 1)
  return total


def memory_gb(compiled) -> float | None:
  try:
    ma = compiled.memory_analysis()
    total = (
      ma.argument_size_in_bytes
      + ma.output_size_in_bytes
      + ma.temp_size_in_bytes
      - getattr(ma, "alias_size_in_bytes", 0)
    )
    return total / 1e9
  except Exception:  # noqa: BLE001 (not every backend reports)
    return None


LHS = {"xla_gpu_enable_latency_hiding_scheduler": True}
# The big-feature steps compile without GEMM autotuning: the autotuner allocates redzone copies
# of a matmul's operands, which for a [8.4M, 1024] float32 feature matrix (R-MAT 2^24 on 2
# GPUs) ran the compile out of memory where the step itself fits.
NO_AUTOTUNE = {"xla_gpu_autotune_level": 0}


def _timed(fn, args, repeat, compiler_options=None):
  """(median ms, compiled) of jit(fn)(*args); the matrix is an argument (not a constant)."""
  import jax

  lowered = jax.jit(fn).lower(*args)
  compiled = lowered.compile(compiler_options) if compiler_options else lowered.compile()
  ms = common.time_fn(compiled, *args, warmup=2, repeat=repeat)
  return ms, compiled


# -- one configuration ----------------------------------------------------------------------------
def _matrices(g, mode, devices, exchange, overlap=False):
  """(matrix, build seconds) of a run mode: plain SparseMatrix or a ShardedMatrix."""
  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist

  coo_rows = np.repeat(np.arange(g.shape[0], dtype=np.int64), np.diff(g.indptr))
  t0 = time.perf_counter()
  if mode == "plain":
    A = jst.SparseMatrix.from_coo(coo_rows, g.indices, g.data, shape=g.shape)
  else:
    mesh = dist.make_mesh(devices)
    A = dist.shard_coo(
      coo_rows,
      g.indices,
      g.data,
      num_nodes=g.shape[0],
      mesh=mesh,
      exchange=exchange,
      overlap=overlap,
    )
  import jax

  jax.block_until_ready(A.values)
  return A, time.perf_counter() - t0


def _dense(A, shape_tail, dtype, seed):
  """Pseudo-random dense node data [n or P*M, ...] made on the devices, sharded like A's rows:
  an integer hash of each element's node id and other indices, computed in one fused
  elementwise kernel (no random-bit temporaries as large as the result, which alone ran a 2-GPU
  feature matrix of 34 GB out of memory). A node's row is the same in every layout (padded rows
  are 0), so sharded results compare with the plain ones (--check). Floats are uniform in
  [-1, 1); integers in [0, 16)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec

  from jaxsparse_tc.distributed import ShardedMatrix

  if isinstance(A, ShardedMatrix):
    ids = A.shard_rows(np.arange(A.num_nodes, dtype=np.int32), fill=-1)  # -1: padding
    out = NamedSharding(A.mesh, PartitionSpec(A.axis_name, *([None] * len(shape_tail))))
  else:
    ids = jnp.arange(A.shape[0], dtype=jnp.int32)
    out = None
  shape = (ids.shape[0],) + tuple(shape_tail)

  def f(ids):
    node = jax.lax.broadcast_in_dim(ids, shape, (0,))
    h = jnp.uint32(0x9E3779B1 * (seed + 1) & 0xFFFFFFFF)
    for axis in range(len(shape)):
      i = (
        node.astype(jnp.uint32) if axis == 0 else jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
      )
      h = (h ^ i) * jnp.uint32(0x85EBCA77)
      h = h ^ (h >> 13)
    h = (h * jnp.uint32(0xC2B2AE3D)) ^ (h >> 16)
    if jnp.issubdtype(dtype, jnp.integer):
      v = (h >> 28).astype(dtype)
    else:
      v = ((h >> 8).astype(jnp.float32) * (2.0 / (1 << 24)) - 1.0).astype(dtype)
    return jnp.where(node >= 0, v, jnp.zeros((), dtype))

  return jax.jit(f, out_shardings=out)(ids)


def _host_result(A, out):
  """A program's result on the host in global node order (a sharded layout unpadded)."""
  import jax

  from jaxsparse_tc.distributed import ShardedMatrix

  out = jax.tree.map(np.asarray, out)
  if isinstance(A, ShardedMatrix) and isinstance(out, np.ndarray):
    return A.unshard_rows(out)  # [P*M, d] -> [n, d]
  return out


def _check_results(A, op, compiled, fn, fargs):
  """Host results of a program for --check: the timed one's, and the program recompiled with
  jax.default_matmul_precision("highest") (exact float32 in XLA's matmuls and in our kernels,
  so that what remains is the order of float32 sums). For a GCN step: (loss, Adam's first
  moment, i.e. 0.1 x the gradients); the updated parameters are left out, as Adam's first
  step turns ~0 gradients into +-lr."""
  import jax

  with jax.default_matmul_precision("highest"):
    exact = jax.jit(fn)(*fargs)
  outs = [_host_result(A, compiled(*fargs)), _host_result(A, exact)]
  return [o if op == "spmm" else (o[0], o[2][0].mu) for o in outs]


def float64_reference(g, op, fargs):
  """The plain program's result computed on the host in float64 (scipy), in _check_results'
  form: A @ X, or the GCN step's (loss, 0.1 x gradients) from its initial parameters."""
  import jax

  a = g.astype(np.float64)
  if op == "spmm":
    return a @ np.asarray(fargs[2], np.float64)
  _, params, _, x, labels, mask = jax.tree.map(np.asarray, fargs)
  p = {k: v.astype(np.float64) for k, v in params.items()}
  x = x.astype(np.float64)
  at = a.T.tocsr()
  ax = a @ x  # gcn_conv propagates x first at equal widths
  z1 = ax @ p["w1"] + p["b1"]
  h = np.maximum(z1, 0.0)
  hw = h @ p["w2"]
  logits = a @ hw + p["b2"]
  logits -= logits.max(axis=1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  rows = np.arange(labels.shape[0])
  w = mask.astype(np.float64) / max(mask.sum(), 1)
  loss = -(w * logp[rows, labels]).sum()
  dlogits = np.exp(logp)
  dlogits[rows, labels] -= 1.0
  dlogits *= w[:, None]
  dhw = at @ dlogits
  dz1 = (dhw @ p["w2"].T) * (z1 > 0)
  grads = {
    "w1": ax.T @ dz1,
    "b1": dz1.sum(axis=0),
    "w2": h.T @ dhw,
    "b2": dlogits.sum(axis=0),
  }
  return loss, {k: 0.1 * v for k, v in grads.items()}  # Adam's b1 = 0.9


def relative_error(got, ref) -> float:
  """Largest over the leaves of max |got - ref| / max |ref| (float leaves)."""
  import jax

  worst = 0.0
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
    if not np.issubdtype(b.dtype, np.floating):
      continue
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a.astype(np.float64) - b))) if b.size else 0.0
    worst = max(worst, diff / scale if scale else diff)
  return worst


def _xbytes(A, widths, itemsize) -> float:
  from jaxsparse_tc.distributed import ShardedMatrix

  if not isinstance(A, ShardedMatrix):
    return 0.0
  return sum(A.exchange_bytes(w, itemsize) for w in widths)


def spmm_program(A, d, dtype):
  """(fn, args) of one SpMM A @ X, X [n, d] random on the devices."""

  import jaxsparse_tc as jst

  X = _dense(A, (d,), dtype, 1)
  v = A.values.astype(dtype)
  return (lambda A, v, X: jst.spmm(A.with_values(v), X)), (A, v, X)


def run_spmm(A, d, dtype, repeat, compiler_options=None):
  import jax.numpy as jnp

  fn, fargs = spmm_program(A, d, dtype)
  ms, compiled = _timed(fn, fargs, repeat, compiler_options)
  return ms, compiled, _xbytes(A, [d], jnp.dtype(dtype).itemsize), (fn, fargs)


def run_exchange(A, d, dtype, repeat, compiler_options=None):
  """The sharded SpMM's exchange alone (all-gather, or halo gather + all_to_all + join)."""
  import jax.numpy as jnp

  from jaxsparse_tc import distributed as dist

  X = _dense(A, (d,), dtype, 1)
  ms, compiled = _timed(lambda A, X: dist.exchange(A, X), (A, X), repeat, compiler_options)
  return ms, compiled, _xbytes(A, [d], jnp.dtype(dtype).itemsize), None


def gcn_program(A, features, hidden, classes, pre_exchange=False):
  """(fn, args) of one GCN training step (module docstring). pre_exchange: the input features
  are exchanged once, before the step (they are constant; `distributed.exchange`), so that the
  step exchanges only the hidden layer's rows."""
  import jax
  import jax.numpy as jnp
  import optax

  from jaxsparse_tc.distributed import ShardedMatrix
  from jaxsparse_tc.nn import functional as F

  x = _dense(A, (features,), jnp.float32, 2)
  if pre_exchange and isinstance(A, ShardedMatrix):
    from jaxsparse_tc import distributed as dist

    x = jax.block_until_ready(jax.jit(dist.exchange)(A, x))  # [P*n_ext, features]
  labels = _dense(A, (), jnp.int32, 3) % classes
  mask = A.row_mask() if isinstance(A, ShardedMatrix) else jnp.ones((A.shape[0],), bool)
  k1, k2 = jax.random.split(jax.random.key(4))
  glorot = jax.nn.initializers.glorot_uniform()
  params = {
    "w1": glorot(k1, (features, hidden)),
    "b1": jnp.zeros((hidden,)),
    "w2": glorot(k2, (hidden, classes)),
    "b2": jnp.zeros((classes,)),
  }
  if isinstance(A, ShardedMatrix):
    from jax.sharding import NamedSharding, PartitionSpec

    params = jax.device_put(params, NamedSharding(A.mesh, PartitionSpec()))
  tx = optax.adam(1e-2)
  opt = tx.init(params)

  def step(A, params, opt, x, labels, mask):
    def loss_fn(p):
      h = jax.nn.relu(F.gcn_conv(A, x, p["w1"], p["b1"]))
      logits = F.gcn_conv(A, h, p["w2"], p["b2"])
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
      return jnp.sum(jnp.where(mask, ce, 0.0)) / jnp.maximum(jnp.sum(mask), 1)

    loss, g = jax.value_and_grad(loss_fn)(params)
    upd, opt = tx.update(g, opt, params)
    return loss, optax.apply_updates(params, upd), opt

  return step, (A, params, opt, x, labels, mask)


def run_gcn(A, features, hidden, classes, repeat, compiler_options=None, pre_exchange=False):
  fn, fargs = gcn_program(A, features, hidden, classes, pre_exchange)
  ms, compiled = _timed(fn, fargs, repeat, compiler_options)
  # Exchanges: layer 1 propagates min(features, hidden) columns (no backward SpMM when x is
  # propagated first; none at all when x was exchanged before the step), layer 2
  # min(hidden, classes) forward and again in its transpose.
  w1 = min(features, hidden)
  widths = [] if pre_exchange else [w1] + ([] if features <= hidden else [w1])
  widths += [min(hidden, classes)] * 2
  return ms, compiled, _xbytes(A, widths, 4), (fn, fargs)


def bench_graph(name, g, devices, ops, exchanges, args, rows, errors):
  import gc

  import jax
  import jax.numpy as jnp

  dtype = {"float16": jnp.float16, "bfloat16": jnp.bfloat16, "float32": jnp.float32}[args.dtype]
  modes = [("plain", 1, "-", False), ("shard1", 1, "auto", False)]
  for count in devices:
    if count < 2:
      continue
    for ex in exchanges:
      modes.append((f"shard{count}", count, ex, False))
      if args.overlap:
        modes.append((f"shard{count}", count, ex, True))
  if args.no_shard1:
    modes = [m for m in modes if m[0] != "shard1"]
  if args.no_plain:
    modes = [m for m in modes if m[0] != "plain"]
  base, reference = {}, {}
  for mode, ndev, ex, overlap in modes:
    if overlap and set(ops) - {"spmm", "gcn", "exchange"}:
      continue
    try:
      A, build_s = _matrices(g, "plain" if mode == "plain" else "sharded", ndev, ex, overlap)
    except Exception as e:  # noqa: BLE001
      if not _is_oom(e):
        raise
      errors.append(f"{name} {mode} build: {str(e)[:2000]}")
      rows.append(
        dict(
          graph=name,
          nodes=g.shape[0],
          nnz=g.nnz,
          op="build",
          mode=mode,
          devices=ndev,
          exchange=ex,
          ms="OOM",
        )
      )
      continue
    lay = getattr(A, "layout", None)
    halo = f"{lay.max_real_halo}/{lay.rows_per_shard}" if lay is not None else None
    runs = [(op, None) for op in ops]
    runs += [(f"gcn-{f}", NO_AUTOTUNE) for f in args.big_features]
    if args.lhs and mode != "plain":
      runs += [(op, LHS) for op in ops if op != "exchange"]
    for op, copts in runs:
      if op == "exchange" and mode == "plain":
        continue
      label = mode if mode == "plain" else f"{mode}/{ex}" + ("+overlap" if overlap else "")
      label += "+lhs" if copts is LHS else ""
      row = dict(
        graph=name,
        nodes=g.shape[0],
        nnz=g.nnz,
        op=op,
        mode=label,
        devices=ndev,
        exchange=lay.exchange if lay is not None else "-",
        build_s=build_s,
        halo=halo,
      )
      try:
        if op == "spmm":
          ms, compiled, xb, result = run_spmm(A, args.dims, dtype, args.repeat, copts)
        elif op == "exchange":
          ms, compiled, xb, result = run_exchange(A, args.dims, dtype, args.repeat, copts)
        elif op in ("gcn", "gcn-pre"):
          if op == "gcn-pre" and mode == "plain" and "gcn" in base:
            base[op] = base["gcn"]  # one device: the same program
            continue
          ms, compiled, xb, result = run_gcn(
            A,
            args.features,
            args.hidden,
            args.classes,
            args.repeat,
            copts,
            pre_exchange=op == "gcn-pre",
          )
        else:  # gcn-F: the big-feature step
          f = int(op.split("-")[1])
          ms, compiled, xb, result = run_gcn(A, f, 64, args.classes, args.repeat, copts)
        row.update(
          ms=ms,
          xbytes_MB=xb / 1e6,
          mem_GB=memory_gb(compiled),
          hlo_MB=hlo_collective_bytes(compiled.as_text(), ndev) / 1e6,
        )
        if mode == "plain":
          base[op] = ms
        if args.check and result is not None and op in ("spmm", "gcn", "gcn-pre"):
          got = _check_results(A, op, compiled, *result)
          if mode == "plain":
            f64 = float64_reference(g, op, result[1])
            reference[op] = reference["gcn-pre" if op == "gcn" else op] = (*got, f64)
          elif op in reference:
            errs = [relative_error(a, b) for a, b in zip(got, reference[op][:2], strict=True)]
            row["rel_err"], row["rel_err_exact"] = (f"{e:.1e}" for e in errs)
          if op in reference:
            row["f64_err"] = f"{relative_error(got[1], reference[op][2]):.1e}"
          del got
        if base.get(op) and op != "exchange":
          row["speedup"] = base[op] / ms
      except Exception as e:  # noqa: BLE001
        if not _is_oom(e):
          errors.append(f"{name} {mode} {op}: {traceback.format_exc()[-3000:]}")
          row["ms"] = "error"
        else:
          errors.append(f"{name} {mode} {op} (out of memory, as reported):\n{str(e)[:1500]}")
          row["ms"] = "OOM"
      rows.append(row)
      print(common._fmt(row.get("ms")), row, flush=True)
      gc.collect()
    del A
    gc.collect()
    try:
      for dev in jax.devices():
        stats = dev.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
          print(f"  {dev}: peak {stats['peak_bytes_in_use'] / 1e9:.2f} GB so far", flush=True)
    except Exception:  # noqa: BLE001
      pass


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument(
    "--devices",
    default="0",
    help="comma-separated device counts to shard over (0: all visible)",
  )
  p.add_argument(
    "--cpu-devices",
    type=int,
    default=0,
    help="run on this many forced CPU devices (jax_num_cpu_devices), for smoke runs",
  )
  p.add_argument("--scales", default="22", help="comma-separated R-MAT scales")
  p.add_argument("--edges-per-node", type=int, default=16)
  p.add_argument(
    "--order",
    default="none",
    choices=["none", "affinity", "rabbit", "rcm", "degree", "scipy-rcm"],
    help="renumber the nodes for locality first (jaxsparse_tc.reorder), so that "
    "contiguous row blocks read fewer remote rows",
  )
  p.add_argument("--ops", default="spmm,gcn")
  p.add_argument("--exchange", default="auto", help="comma-separated: auto,allgather,halo")
  p.add_argument("--dims", type=int, default=128, help="SpMM feature width")
  p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
  p.add_argument("--features", type=int, default=None, help="gcn input width (default 128)")
  p.add_argument(
    "--big-features",
    default="",
    help="comma-separated input widths: also time the gcn step with each (hidden 64) on every "
    "mode, largest last",
  )
  p.add_argument(
    "--lhs",
    action="store_true",
    help="also time the sharded programs compiled with XLA's latency-hiding scheduler",
  )
  p.add_argument("--hidden", type=int, default=128)
  p.add_argument("--classes", type=int, default=16)
  p.add_argument("--repeat", type=int, default=10)
  p.add_argument("--no-shard1", action="store_true", help="skip the 1-device sharded run")
  p.add_argument(
    "--no-plain", action="store_true", help="skip the unsharded run (no speedups then)"
  )
  p.add_argument(
    "--overlap",
    action="store_true",
    help="also time each exchange with own/remote parts (SpMM overlaps the exchange)",
  )
  p.add_argument(
    "--oom-demo",
    action="store_true",
    help="only the big-feature step at --features (default 1024): a feature matrix one "
    "device cannot hold",
  )
  p.add_argument(
    "--check",
    action="store_true",
    help="compare every sharded result with the plain run's (rel_err: max |diff| / max |plain| "
    "of the SpMM output, or of the GCN step's loss and optimizer state, i.e. its gradients)",
  )
  p.add_argument("--quick", action="store_true", help="repeat 3 (smoke runs)")
  args = p.parse_args(argv)
  if args.oom_demo:
    args.ops, args.no_shard1 = "", True
    args.big_features = str(args.features or 1024)
  args.features = args.features or 128
  args.big_features = [int(f) for f in args.big_features.split(",") if f]
  if args.quick:
    args.repeat = 3
  return args


def device_counts(args) -> list[int]:
  """--devices as a list of counts (0: all visible devices)."""
  import jax

  if args.cpu_devices:  # start with PJRT_NPROC >= 2 x devices where fewer CPUs (check_host_mesh)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
  visible = len(jax.devices())
  counts = [int(c) or visible for c in str(args.devices).split(",")]
  if max(counts) > visible:
    raise SystemExit(f"--devices {args.devices}: only {visible} devices are visible")
  return counts


def run(quick: bool = False, argv=None) -> list[dict]:
  """benchmarks/run.py's entry: all visible devices, R-MAT 2^20 x 16 (quick: 2^14 x 8)."""

  if argv is None:
    argv = ["--scales", "14" if quick else "20"] + (["--edges-per-node", "8"] if quick else [])
    argv += ["--quick"] if quick else []
  args = parse(argv)
  devices = device_counts(args)
  rows, errors = [], []
  for scale in (int(s) for s in args.scales.split(",")):
    t0 = time.perf_counter()
    g = rmat_graph(scale, args.edges_per_node, args.order)
    name = f"rmat{scale}-d{args.edges_per_node}" + (
      f"-{args.order}" if args.order != "none" else ""
    )
    print(
      f"{name}: {g.shape[0]} nodes, {g.nnz} nonzeros, generated in "
      f"{time.perf_counter() - t0:.1f} s",
      flush=True,
    )
    ops = [op for op in args.ops.split(",") if op]
    if any(op.startswith("gcn") for op in ops) or args.big_features:
      gn = gcn_normalized(g)
      bench_graph(name, gn, devices, ops, args.exchange.split(","), args, rows, errors)
    else:
      bench_graph(name, g, devices, ops, args.exchange.split(","), args, rows, errors)
    del g
  for e in errors:
    print("\n--- " + e)
  return rows


def summary(rows):
  out = []
  for r in rows:
    if r.get("mode", "").startswith("shard") and r.get("devices", 1) > 1 and r.get("speedup"):
      out.append(
        {
          "graph": r["graph"],
          "op": r["op"],
          "mode": r["mode"],
          "exchange": r["exchange"],
          "ms": r["ms"],
          "speedup_vs_1": r["speedup"],
          "rel_err": r.get("rel_err"),
          "rel_err_exact": r.get("rel_err_exact"),
          "f64_err": r.get("f64_err"),
        }
      )
  return out or [
    {
      "graph": "-",
      "op": "-",
      "mode": "-",
      "exchange": "-",
      "ms": None,
      "speedup_vs_1": None,
      "rel_err": None,
      "rel_err_exact": None,
      "f64_err": None,
    }
  ]


def main(argv=None) -> int:
  import jax

  args = parse(argv)
  rows = run(argv=argv if argv is not None else sys.argv[1:])
  counts = device_counts(args)
  print(f"\n# device: {common.device_name()} ({len(jax.devices())} visible), shards {counts}")
  common.print_table(rows, COLUMNS, "bench_distributed")
  s = summary(rows)
  common.print_table(s, list(s[0].keys()), "summary")
  common.write_json(rows, f"bench_distributed_{max(counts)}dev")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
