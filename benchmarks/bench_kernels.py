"""Kernel grid: SpMM / SDDMM / attention time per graph, node order, width and dtype.

Each kernel family forced and auto, against cuSPARSE and XLA, the memory floors, the selector.

Method: bench_chained's. SpMM is a chain x <- A_norm x of K calls in one jitted program (A_norm:
rows scaled by 1/degree), timed on the device (common.time_jax_device: the program queued
behind a matmul; per call = program / K); cuSPARSE (torch CSR, same dtype) is the same K-step
chain captured in one CUDA graph and replayed (bench_chained._time_torch). SDDMM: a fan of K
calls on distinct operand pairs, all outputs returned. Attention (fp16, H = 4): the forward chain
q <- out, and forward+backward q <- q + 1e-3 (dq + dk + dv) (bench_chained.grad_step), K chosen
as bench_chained does (at most 32). K (--chain) defaults to chain_length: 16 calls from 2^20
nonzeros, up to 128 on smaller graphs. One compiled program per (impl, config); the matrix is
an argument.

Grid: every graph of common.benchmark_graphs with more than 80k stored edges (not Cora) plus
rmat17-d16, rmat20-d8 and the dense stand-ins common.DENSE_STANDINS (graphs named with
--graphs are taken whatever their size); orders
`none` (the caller's) and `affinity` (jst.reorder(csr, "affinity", seed=0), then P A P^T);
d in 32, 64, 128, 256; fp16, bf16 and fp32 (float32 inputs, default precision: tf32 tensor
cores allowed). Ours: KernelOptions "auto", "rows" and "windows" (a forced kernel that
raises gets a row with `error`); XLA peers (segment_sum SpMM, gather SDDMM; float32
accumulation, inputs and outputs in the dtype) at --xla-dims (default 128). Attention: the fused
forward vs XLA unfused; fwd+bwd with attention_backward auto / fused / composed vs XLA.
Floors (SpMM): `floor-bytes` = A's column indices (4 B) + row pointers (4 B) + values once, each
touched X row once, the output once (common.min_bytes) at the measured
device-copy bandwidth (read + written bytes of a 512 MiB x + 1); `floor-gather` = the CSR column
list's rows of d * itemsize bytes gathered by benchmarks/gather_floor.py's kernel (16-byte
lanes, 4 rows in flight, as its --rmat mode; needs cupy). SDDMM (at --xla-dims):
`floor-gather` = the same kernel on X's rows once each plus Y's row per nonzero;
`floor-gather-windows` = X's rows once plus each 8-row window's distinct columns of Y once.

For docs/PERFORMANCE.md (one H100; split the grid across calls with --graphs / --orders / --ops /
--dims, one --json per call, then summarize them together):
  python -m benchmarks.bench_kernels [--graphs a,b] [--orders none,affinity]
      [--dims 32,64,128,256] [--dtypes fp16,bf16,fp32] [--ops spmm,sddmm,attention] [--chain 16]
      [--xla-dims 128|all] [--attention-dims 64,128] [--json PATH] [--quick]
      [--flashsparse PATH]   # FlashSparse's SpMM/SDDMM rows, impl `flashsparse` (its own timer)
  python -m benchmarks.bench_kernels --summarize a.json [b.json ...]   # offline, no GPU
      [--replan]   # auto re-derived from today's selector: the hit rate of rules fit later
--json is rewritten after every (graph, order), so a stopped run leaves valid JSON. --quick:
K = 4 and few timing repeats (and common.benchmark_graphs' quick list). On the CPU backend the
kernel options are ignored (forced rows equal auto) and times are wall times.

Raw rows (JSON "rows"): graph, order, op (spmm | sddmm | attention fwd | attention fwd+bwd),
d, dtype, H, impl (ours-auto | ours-rows | ours-windows | ours-fused | ours-composed |
cusparse | xla | floor-bytes | floor-gather; SDDMM also floor-gather-windows, and xla-serial
and ours-auto-serial, the fans with each call ordered after the previous one, so XLA cannot
fuse the K calls into one kernel),
us_per_call (device us per call), wall_us, how, K,
error (first line, where the config raised), and the features of the (graph, order): rows, nnz,
nnz_per_block (nnz / 8x8 blocks of the built format), cols_per_window (distinct columns per
8-row window), dense_block_nnz (share of nonzeros in blocks of > 16), row_cv (std / mean of row
lengths), max_row, reorder_s (Reordering.seconds: the C++ reordering's wall time; 0 for none),
build_s (SparseMatrix.from_scipy, device transfer included). Derived rows (JSON "derived", see
`derive`) and the summary (`summarize`) are recomputed from the raw rows alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time

import numpy as np

from benchmarks import common, compare, flashsparse_peer

MIN_EDGES = 80_000  # default graphs: more stored edges than this (not Cora)
DTYPES = {"fp16": ("float16", 2), "bf16": ("bfloat16", 2), "fp32": ("float32", 4)}
HIT = 1.03  # auto "hits" when within 3% of the fastest forced kernel
# The selector's targets (within 5% of the best forced kernel on >= 90% of the grid's
# configurations, never worse than 15%), counted beside the hits.
NEAR, FAR = 1.05, 1.15
H_ATT = 4
FEATURES = [
  "rows",
  "nnz",
  "nnz_per_block",
  "cols_per_window",
  "dense_block_nnz",
  "row_cv",
  "max_row",
  "reorder_s",
  "build_s",
]
COLUMNS = ["graph", "order", "op", "d", "dtype", "H", "impl", "us_per_call", "wall_us", "how", "K"]
DERIVED_COLUMNS = [
  "graph",
  "order",
  "op",
  "d",
  "dtype",
  "auto_us",
  "rows_us",
  "windows_us",
  "fused_us",
  "composed_us",
  "best",
  "auto_hit",
  "auto_like",
  "floor_bytes",
  "floor_gather",
  "x_cusparse",
  "x_cusparse_orig",
  "x_xla",
  "payback_calls",
]


# -- timing -----------------------------------------------------------------------------------
_STATE = {"quick": False}


def _cpu() -> bool:
  import jax

  return jax.default_backend() == "cpu"


def _time(prog, args, k: int) -> tuple[float, float]:
  """(device, wall) microseconds per call of a k-call program: bench_chained._time_jax
  (common.time_jax_device) on a GPU, fewer repeats with --quick; wall time on the CPU backend
  (where the host is the device, and the 4096^2 matmul head would take seconds)."""
  if _cpu():
    ms = common.time_fn(prog, *args, warmup=1, repeat=3 if _STATE["quick"] else 10)
    return ms * 1e3 / k, ms * 1e3 / k
  return common.time_jax_device(prog, args, k, repeat=7 if _STATE["quick"] else None)


def _normal(seed: int, shape, dtype):
  """A standard normal array made on the device (no host copy); one compile per shape/dtype."""
  import jax

  return _normal_fn(tuple(shape), str(dtype))(jax.random.key(seed))


_NORMAL = {}


def _normal_fn(shape, dtype):
  import jax
  import jax.numpy as jnp

  if (shape, dtype) not in _NORMAL:
    _NORMAL[shape, dtype] = jax.jit(
      lambda key: jax.random.normal(key, shape, jnp.float32).astype(dtype)
    )
  return _NORMAL[shape, dtype]


# -- floors -----------------------------------------------------------------------------------
_GATHER = {}


def gather_floor_us(indices: np.ndarray, n: int, row_bytes: int):
  """Microseconds for benchmarks/gather_floor.py's kernel to gather the rows `indices` of an
  [n, row_bytes] array (16-byte lanes, 4 rows in flight, 64 warps/SM, as its --rmat mode), or
  None without cupy or a GPU."""
  try:
    import cupy as cp

    cp.cuda.runtime.getDeviceCount()
  except Exception:  # noqa: BLE001 - cupy is optional
    return None
  from benchmarks import gather_floor

  lanes, vb, u = max(1, row_bytes // 16), 16, 4
  if lanes not in _GATHER:
    _GATHER[lanes] = cp.RawKernel(
      f"#define L {lanes}\n#define VB {vb}\n#define U {u}\n" + gather_floor.SOURCE, "gather"
    )
  kern = _GATHER[lanes]
  props = cp.cuda.runtime.getDeviceProperties(0)
  threads = gather_floor.THREADS
  smem = props["sharedMemPerMultiprocessor"] // (64 * 32 // threads) - 1024
  if smem > 48 * 1024:
    kern.max_dynamic_shared_size_bytes = smem
  idx = cp.asarray(indices.astype(np.int32))
  x = cp.ones((n, lanes * vb // 4), cp.uint32)
  m, per_group = idx.size, 16
  groups = -(-m // per_group)
  blocks = -(-groups * lanes // threads)
  out = cp.empty(blocks * threads, cp.uint32)
  args = (x, idx, np.int64(m), np.int32(lanes * vb), np.int32(per_group), out)
  us = common.time_cupy(lambda i: kern((blocks,), (threads,), args, shared_mem=max(smem, 0)))
  del idx, x, out
  cp.get_default_memory_pool().free_all_blocks()
  return us


# -- the grid ---------------------------------------------------------------------------------
def graph_names(quick: bool, names=None) -> list[str]:
  """--graphs as given, else common.benchmark_graphs' list (sizes are checked when loaded)."""
  if names:
    return list(names)
  return [
    *common.real_graph_names(),
    *common.SYNTHETIC[: 1 if quick else 2],
    *common.DENSE_STANDINS[: 1 if quick else 2],
  ]


def _features(csr, A) -> dict:
  import jaxsparse_tc as jst
  from jaxsparse_tc.reorder import block_stats

  lens = np.diff(csr.indptr)
  f = jst.kernel_plan(A, 128).features  # the selector's own features
  st = block_stats(csr)
  k = np.arange(st.block_nnz_hist.size)
  return {
    "rows": int(csr.shape[0]),
    "nnz": int(A.nnz),
    "nnz_per_block": f.nnz_per_block,
    "cols_per_window": f.cols_per_window,
    # share of the nonzeros in blocks of more than 16 (the fill where tensor cores pay)
    "dense_block_nnz": float((k[17:] * st.block_nnz_hist[17:]).sum() / max(1, st.nnz)),
    "row_cv": float(lens.std() / max(lens.mean(), 1e-30)),
    "max_row": int(lens.max()) if lens.size else 0,
    # the window schedule's largest split piece (the builder's rule, or --split-blocks; 0: none)
    "split_blocks": int(np.asarray(A.pattern.schedule)[:, 3].max(initial=0)),
  }


def run(a, on_order=None) -> list[dict]:
  """The raw rows; on_order(rows) after every (graph, order)."""
  rows: list[dict] = []
  t_start = time.perf_counter()
  quick = a.quick
  _STATE["quick"] = quick
  named = a.graphs.split(",") if a.graphs else None
  dims = [int(x) for x in a.dims.split(",")]
  dtypes = a.dtypes.split(",")
  ops = set(a.ops.split(","))
  xla_dims = set(dims) if a.xla_dims == "all" else {int(x) for x in a.xla_dims.split(",") if x}
  att_dims = [int(x) for x in a.attention_dims.split(",") if x]
  try:
    import torch

    has_torch = torch.cuda.is_available()
  except Exception:  # noqa: BLE001 - torch is optional
    has_torch = False
  _STATE["flashsparse"] = None
  if getattr(a, "flashsparse", None):
    _STATE["flashsparse"] = flashsparse_peer.load(a.flashsparse)  # fails before any timing
  else:
    print("# flashsparse: no --flashsparse PATH, its peer rows are skipped", flush=True)

  for gname in graph_names(quick, named):
    try:
      csr = common.load_graph(gname).tocsr()
    except Exception as e:  # noqa: BLE001 - a missing graph ends only its rows
      rows.append({"graph": gname, "op": "load", "error": _first_line(e)})
      print(f"{gname}: {_first_line(e)}", flush=True)
      continue
    if named is None and not common.is_synthetic(gname) and csr.nnz <= MIN_EDGES:
      continue
    csr.sort_indices()
    k = a.chain or chain_length(csr.nnz, quick)
    for order in a.orders.split(","):
      base = {"graph": gname, "order": order}
      try:
        _one(a, rows, base, csr, order, k, dims, dtypes, ops, xla_dims, att_dims, has_torch)
      except Exception as e:  # noqa: BLE001 - keep the rest of the grid
        rows.append({**base, "op": "setup", "error": _first_line(e)})
        print(f"{gname} {order}: setup failed: {_first_line(e)}", flush=True)
      gc.collect()
      if has_torch:
        torch.cuda.empty_cache()
      print(f"# {gname} {order} done at {time.perf_counter() - t_start:.0f} s", flush=True)
      if on_order is not None:
        on_order(rows)
    del csr
  return rows


def chain_length(nnz: int, quick: bool = False) -> int:
  """Calls per program: 16 from 2^20 nonzeros, more on smaller graphs (16 x 2^20 / nnz, a power
  of 2, at most 128), so that a program's device time stays well above the jitter of the host's
  clock around it (16 calls of a few us each measured a 2-5 us SpMM on a 200k-edge graph at
  0.25-11 us in one grid); 4 with --quick."""
  if quick:
    return 4
  k = 16
  while k < 128 and k * nnz < 16 * (1 << 20):
    k *= 2
  return k


def _first_line(e: Exception) -> str:
  s = str(e).strip().splitlines()
  return f"{type(e).__name__}: {s[0] if s else ''}"[:300]


def _one(a, rows, base, csr, order, k, dims, dtypes, ops, xla_dims, att_dims, has_torch):
  """Every row of one (graph, order)."""
  csr, A, feats = _prepare(base, csr, order, a.split_blocks)
  add = _Recorder(rows, base, A, feats, k, set(a.skip.split(",")) if a.skip else set())
  if "spmm" in ops:
    _spmm_rows(add, csr, A, k, dims, dtypes, xla_dims, has_torch)
  if "sddmm" in ops:
    _sddmm_rows(add, csr, A, k, dims, dtypes, xla_dims)
  if "attention" in ops and att_dims:
    _attention_rows(add, csr, A, k, att_dims)
  if _STATE.get("flashsparse") is not None:
    flashsparse_peer.peer_rows(add, _STATE["flashsparse"], csr, ops, dims, dtypes)


def _prepare(base, csr, order, split_blocks=None):
  """The (graph, order)'s matrix: csr reordered by `order` (P A P^T) unless "none", built as a
  SparseMatrix (its window schedule cut into pieces of `split_blocks` where given), and its
  features (with the reordering's and the build's seconds)."""
  import jax

  import jaxsparse_tc as jst

  t0 = time.perf_counter()
  reorder_s = 0.0
  if order != "none":
    r = jst.reorder(csr, order, seed=0)
    reorder_s = r.seconds  # the C++ reordering's wall time (block statistics not included)
    csr = csr[r.perm][:, r.perm].tocsr()
    csr.sort_indices()
    del r
  t1 = time.perf_counter()
  fmt = None if split_blocks is None else jst.FormatOptions(split_blocks=split_blocks)
  A = jst.SparseMatrix.from_scipy(csr, format_options=fmt)
  jax.block_until_ready(A.values)
  build_s = time.perf_counter() - t1
  feats = {**_features(csr, A), "reorder_s": reorder_s, "build_s": build_s}
  print(
    f"{base['graph']} {order}: {csr.shape[0]} rows, {csr.nnz} nnz, reorder {reorder_s:.2f} s, "
    f"build {build_s:.2f} s, nnz/block {feats['nnz_per_block']:.2f} "
    f"(setup {time.perf_counter() - t0:.1f} s)",
    flush=True,
  )
  return csr, A, feats


# The operators whose kernel the launch plan chooses, and the KernelPlan field naming it.
_PLANNED = {"spmm": "spmm", "sddmm": "sddmm", "attention fwd+bwd": "attention_backward"}


class _Recorder:
  """Times one configuration and appends its row to `rows`, with the (graph, order)'s features;
  impls or op:impl pairs in `skip` are not timed."""

  def __init__(self, rows, base, A, feats, k, skip):
    self.rows, self.base, self.A, self.feats, self.k, self.skip = rows, base, A, feats, k, skip

  def __call__(self, op, d, dtype, impl, fn, how="jit chain", kk=None, h=None):
    """fn() gives us per call, (us, wall us) or a dict of row fields; where it raises, the row
    records the error."""
    import jax.numpy as jnp

    import jaxsparse_tc as jst

    if f"{op}:{impl}" in self.skip or impl in self.skip:
      return
    row = {**self.base, "op": op, "d": d, "dtype": dtype, "H": h, "impl": impl, "K": kk or self.k}
    if op in _PLANNED:  # what the launch plan picks for this config (kernel_plan)
      plan = jst.kernel_plan(self.A, d, jnp.dtype(DTYPES[dtype][0]), heads=h or 1)
      row["plan"] = getattr(plan, _PLANNED[op])
    try:
      res = fn()
    except Exception as e:  # noqa: BLE001 - a kernel that refuses a config gets an error row
      row.update(us_per_call=None, wall_us=None, how=how, error=_first_line(e))
      print(f"  {op} d={d} {dtype} {impl}: {row['error']}", flush=True)
    else:
      if isinstance(res, dict):
        row.update(res)
      else:
        us, wall = res if isinstance(res, tuple) else (res, None)
        row.update(us_per_call=us, wall_us=wall, how=how)
      if row["us_per_call"] is None:
        return
      print(f"  {op} d={d} {dtype} {impl}: {row['us_per_call']:.1f} us", flush=True)
    self.rows.append({**row, **self.feats})

  def failed(self, op, impl, e: Exception):
    """A row for a peer that could not be set up (its configurations are not timed)."""
    self.rows.append({**self.base, "op": op, "impl": impl, "error": _first_line(e)})


_KINDS = ("auto", "rows", "windows")


def _spmm_rows(add, csr, A, k, dims, dtypes, xla_dims, has_torch):
  """SpMM: the chain x <- A_norm x (A's values over the row's degree) of our kernels, cuSPARSE
  (torch CSR), XLA's segment_sum (at xla_dims), the bytes floor and the gather floor."""
  import jax.numpy as jnp
  import scipy.sparse as sp

  m = csr.shape[0]
  deg = np.maximum(np.diff(csr.indptr), 1).astype(np.float32)
  A_n = A.with_values(A.values / jnp.asarray(deg)[A.rows])  # format order on the device
  norm = (sp.diags(1.0 / deg) @ csr).tocsr()
  norm.sort_indices()
  r_idx = jnp.asarray(np.repeat(np.arange(m, dtype=np.int32), np.diff(norm.indptr)))
  c_idx = jnp.asarray(norm.indices.astype(np.int32))
  gathered = {}
  tA = None
  if has_torch:
    import torch

    try:
      tA = common.torch_csr(norm.astype(np.float32))
    except Exception as e:  # noqa: BLE001 - no cuSPARSE rows then, the rest goes on
      add.failed("spmm", "cusparse", e)
  for name in dtypes:
    dt = DTYPES[name][0]
    Ad = A_n.with_values(A_n.values.astype(dt))  # cast once, not per call
    vals = jnp.asarray(norm.data.astype(dt))
    tAd = tA.to(getattr(torch, dt)) if tA is not None else None
    for d in dims:
      _spmm_width(add, csr, k, name, d, Ad, tAd, (r_idx, c_idx, vals), d in xla_dims, gathered)
    del Ad, vals, tAd


def _spmm_width(add, csr, k, name, d, Ad, tAd, coo, xla, gathered):
  """SpMM rows of one dtype and width: ours (auto and forced), cuSPARSE (tAd, where torch is
  there), XLA's segment_sum on `coo` (rows, cols, values) where `xla`, and the floors."""
  import functools

  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst
  from benchmarks import bench_chained

  m, n = csr.shape
  dt, isz = DTYPES[name]
  x0 = _normal(0, (n, d), dt)
  for kind in _KINDS:
    f = functools.partial(jst.spmm, options=jst.KernelOptions(spmm=kind))
    add("spmm", d, name, f"ours-{kind}", lambda: _time(bench_chained._chain(f, k), (Ad, x0), k))
  if tAd is not None:
    import torch

    tx = torch.randn(n, d, device="cuda", dtype=getattr(torch, dt))
    add(
      "spmm",
      d,
      name,
      "cusparse",
      lambda: dict(
        zip(
          ("us_per_call", "how"),
          bench_chained._time_torch(lambda x: torch.sparse.mm(tAd, x), tx, k),
        )
      ),
    )
    del tx
  if xla:

    def seg(r_, c_, v_, x):
      p = v_[:, None].astype(jnp.float32) * x[c_].astype(jnp.float32)
      s = jax.ops.segment_sum(p, r_, num_segments=m, indices_are_sorted=True)
      return s.astype(x.dtype)

    add("spmm", d, name, "xla", lambda: _time(bench_chained._chain(seg, k), (*coo, x0), k))
  nbytes = common.min_bytes(csr, d, isz)
  add(
    "spmm",
    d,
    name,
    "floor-bytes",
    lambda: {
      "us_per_call": nbytes / common.copy_bandwidth() * 1e6,
      "how": f"{nbytes / 1e6:.1f} MB at {common.copy_bandwidth() / 1e9:.0f} GB/s",
    },
    kk=1,
  )
  rb = d * isz

  def gather_floor():
    if rb not in gathered:  # once per row size: d=64 fp32 and d=128 fp16 share it
      gathered[rb] = gather_floor_us(csr.indices, n, rb)
    return {"us_per_call": gathered[rb], "how": f"gather_floor {rb} B rows"}

  add("spmm", d, name, "floor-gather", gather_floor, kk=1)


def _sddmm_rows(add, csr, A, k, dims, dtypes, xla_dims):
  """SDDMM: fans of calls on distinct operand pairs, all outputs returned, of our kernels; at
  xla_dims XLA's gather, the serial fans of both, and the gather floors."""
  import jax.numpy as jnp

  coo_r = jnp.asarray(np.repeat(np.arange(csr.shape[0], dtype=np.int32), np.diff(csr.indptr)))
  coo_c = jnp.asarray(csr.indices.astype(np.int32))
  for name in dtypes:
    for d in dims:
      _sddmm_width(add, csr, A, k, name, d, (coo_r, coo_c), d in xla_dims)


def _sddmm_width(add, csr, A, k, name, d, coo, xla):
  """SDDMM rows of one dtype and width: ours (auto and forced); where `xla`, XLA's gather on
  `coo` (rows, cols), the serial fans and the gather floors."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst
  from benchmarks import bench_chained

  m, n = csr.shape
  dt, isz = DTYPES[name]
  # ks calls on distinct operands (q_i, y_i), all outputs returned (bench_chained)
  ks = max(4, min(k, int(4e9 // ((m + n) * d * isz))))
  qs = tuple(_normal(1 + 2 * i, (m, d), dt) for i in range(ks))
  ys = tuple(_normal(2 + 2 * i, (n, d), dt) for i in range(ks))
  for kind in _KINDS:
    opts = jst.KernelOptions(sddmm=kind)
    prog = jax.jit(
      lambda G, qs, ys: tuple(jst.sddmm(G, q, y, options=opts).values for q, y in zip(qs, ys))
    )
    add("sddmm", d, name, f"ours-{kind}", lambda: _time(prog, (A, qs, ys), ks), "jit fan", ks)
  if xla:

    def gather_one(r_, c_, q, y):
      return jnp.sum(q[r_].astype(jnp.float32) * y[c_].astype(jnp.float32), -1).astype(q.dtype)

    def gather(r_, c_, qs, ys):
      return tuple(gather_one(r_, c_, q, y) for q, y in zip(qs, ys))

    add(
      "sddmm",
      d,
      name,
      "xla",
      lambda: _time(jax.jit(gather), (*coo, qs, ys), ks),
      "jit fan",
      ks,
    )
    # The same fans with each call ordered after the previous one's output (bench_chained's
    # serial fans): XLA can no longer fuse the K calls, which share their index operands,
    # into one kernel; each call stands alone, as in a model.
    serial_xla = bench_chained._serial(lambda G, q, y: gather_one(*G, q, y))
    serial_ours = bench_chained._serial(lambda G, q, y: jst.sddmm(G, q, y).values)
    add(
      "sddmm",
      d,
      name,
      "xla-serial",
      lambda: _time(jax.jit(serial_xla), (coo, qs, ys), ks),
      "jit serial fan",
      ks,
    )
    add(
      "sddmm",
      d,
      name,
      "ours-auto-serial",
      lambda: _time(jax.jit(serial_ours), (A, qs, ys), ks),
      "jit serial fan",
      ks,
    )
    # Gather floors of an SDDMM: X's rows once each plus, per nonzero, Y's row (what a
    # row-wise SDDMM and XLA's gather read), or per 8-row window each distinct column's
    # Y row once (what a window kernel that reuses rows reads at least).
    rb = d * isz
    for impl, y_rows in (
      ("floor-gather", csr.indices),
      ("floor-gather-windows", np.asarray(A.pattern.window_cols)),
    ):
      idx = np.concatenate([y_rows, np.arange(m)]).astype(np.int32)
      add(
        "sddmm",
        d,
        name,
        impl,
        lambda idx=idx, rb=rb: {
          "us_per_call": gather_floor_us(idx, max(m, n), rb),
          "how": f"gather_floor {idx.size} rows of {rb} B",
        },
        kk=1,
      )


def _attention_rows(add, csr, A, k, att_dims):
  """Attention (fp16, H_ATT heads): the fused forward against XLA unfused, and (square graphs)
  forward + backward with attention_backward auto, fused and composed against XLA."""
  import jax.numpy as jnp

  from benchmarks import bench_attention

  rows_e, cols_e = bench_attention.csr_edges(csr)
  edges = (jnp.asarray(rows_e), jnp.asarray(cols_e))
  # bench_chained's K (XLA's temps), at most 32: the unrolled backward's compile time
  ka = max(2, min(k, 32, int(2e9 // (csr.nnz * H_ATT * 4 * 8))))
  for d in att_dims:
    _attention_width(add, csr, A, edges, ka, d)


def _attention_width(add, csr, A, edges, ka, d):
  """Attention rows of one width, in programs of `ka` calls; XLA's on `edges` (rows, cols)."""
  import jaxsparse_tc as jst
  from benchmarks import bench_attention, bench_chained

  m, n = csr.shape
  h = H_ATT
  qa, kv, vv = (_normal(10 + i, (h, s, d), "float16") for i, s in enumerate((m, n, n)))
  scale = 1.0 / math.sqrt(d)
  xla = bench_attention.methods(scale)["xla"]

  def ours(kind):
    opts = jst.KernelOptions(attention_backward=kind)
    return lambda G, q, k_, v: jst.sparse_attention(G, q, k_, v, scale=scale, options=opts)

  for impl, f, graph in (("ours-fused", ours("auto"), A), ("xla", xla, edges)):
    fwd = bench_chained._chain(lambda G, k_, v, q: f(G, q, k_, v), ka)
    add(
      "attention fwd",
      d,
      "fp16",
      impl,
      lambda: _time(fwd, (graph, kv, vv, qa), ka),
      kk=ka,
      h=h,
    )
  if m == n:
    w = _normal(20, (h, m, d), "float32")
    for impl, f, graph in (
      ("ours-auto", ours("auto"), A),
      ("ours-fused", ours("fused"), A),
      ("ours-composed", ours("composed"), A),
      ("xla", xla, edges),
    ):
      step = bench_chained.grad_step(f)
      add(
        "attention fwd+bwd",
        d,
        "fp16",
        impl,
        lambda: _time(bench_chained._chain(step, ka), (graph, kv, vv, w, qa), ka),
        kk=ka,
        h=h,
      )


# -- derived columns and the summary -----------------------------------------------------------
def _index(rows):
  t = {}
  for r in rows:
    us = r.get("us_per_call")
    if us is not None and np.isfinite(us) and us > 0 and not r.get("error"):
      t[r["graph"], r["order"], r["op"], r["d"], r["dtype"], r["impl"]] = us
  return t


def _feature_of(rows):
  out = {}
  for r in rows:
    if "nnz_per_block" in r:
      out.setdefault((r["graph"], r["order"]), {c: r.get(c) for c in FEATURES})
  return out


def derive(rows: list[dict]) -> list[dict]:
  """Per (graph, order, op, d, dtype) of spmm, sddmm and attention fwd+bwd: our three kernels'
  times, the fastest forced one (`best`), whether auto is within 3% of it (`auto_hit`), the
  forced kernel auto's time is closest to (`auto_like`), the floors' fractions (floor time /
  ours-auto), speedups (peer / ours-auto) over cuSPARSE on this order and on the caller's
  (`none`) order and over XLA, and the reordering's payback in SpMM calls."""
  t = _index(rows)
  feats = _feature_of(rows)
  keys = sorted(
    {
      (r["graph"], r["order"], r["op"], r["d"], r["dtype"])
      for r in rows
      if r.get("op") in ("spmm", "sddmm", "attention fwd+bwd") and r.get("d") is not None
    },
    key=lambda x: (x[0], x[1] != "none", x[1], x[2], x[3], x[4]),
  )
  out = []
  for g, o, op, d, dt in keys:
    get = lambda impl, o=o: t.get((g, o, op, d, dt, impl))  # noqa: E731
    auto = get("ours-auto")
    forced = (
      ("ours-fused", "ours-composed")
      if op == "attention fwd+bwd"
      else (
        "ours-rows",
        "ours-windows",
      )
    )
    times = {f.split("-", 1)[1]: get(f) for f in forced if get(f)}
    best = min(times, key=times.get) if times else None
    like = min(times, key=lambda f: abs(math.log(auto / times[f]))) if times and auto else None
    row = {
      "graph": g,
      "order": o,
      "op": op,
      "d": d,
      "dtype": dt,
      "auto_us": auto,
      "rows_us": times.get("rows"),
      "windows_us": times.get("windows"),
      "fused_us": times.get("fused"),
      "composed_us": times.get("composed"),
      "best": best,
      "best_us": times.get(best),
      "auto_hit": (auto <= HIT * times[best]) if auto and best else None,
      "auto_like": like,
      "floor_bytes": _ratio(get("floor-bytes"), auto),
      "floor_gather": _ratio(get("floor-gather"), auto),
      "x_cusparse": _ratio(get("cusparse"), auto),
      "x_cusparse_orig": _ratio(t.get((g, "none", op, d, dt, "cusparse")), auto),
      "x_xla": _ratio(get("xla"), auto),
      "payback_calls": None,
      **feats.get((g, o), {}),
    }
    if op == "spmm" and o != "none":
      before = t.get((g, "none", op, d, dt, "ours-auto"))
      secs = (feats.get((g, o)) or {}).get("reorder_s")
      if before and auto and secs is not None:
        gain = (before - auto) * 1e-6
        row["payback_calls"] = secs / gain if gain > 0 else "never"
    out.append(row)
  return out


def _ratio(a, b):
  return a / b if a and b else None


def plan_rows(rows: list[dict]) -> list[dict]:
  """rows plus, where `ours-auto` was not timed (--skip), an `ours-auto` row per config whose
  time is that of the forced kernel the launch plan picks (each forced row records the plan's
  pick in `plan`): the same kernel on the same inputs in the same run."""
  have = {
    (r["graph"], r["order"], r["op"], r["d"], r["dtype"])
    for r in rows
    if r.get("impl") == "ours-auto"
  }
  out = list(rows)
  for r in rows:
    key = (r.get("graph"), r.get("order"), r.get("op"), r.get("d"), r.get("dtype"))
    if r.get("plan") and r.get("impl") == f"ours-{r['plan']}" and key not in have:
      out.append({**r, "impl": "ours-auto", "how": f"plan: {r['plan']}"})
      have.add(key)
  return out


def replan_rows(rows: list[dict]) -> list[dict]:
  """rows with the SpMM, SDDMM and attention fwd+bwd forced rows' `plan` set to the kernel (the
  backward, for attention) today's selector picks
  (csrc/plan/select.h through the CPU extension, on the pattern features each row records) and
  their timed `ours-auto` rows dropped, so that plan_rows (summarize) takes auto's time from the
  picked forced kernel: a saved grid then shows the hit rate of rules fit after it ran. The
  grid's fp32 is the default precision (tf32 allowed), so the picks are for inexact fp32."""
  from jaxsparse_tc._src import select

  def pick(r):
    m, nnz = int(r["rows"]), int(r["nnz"])
    windows = -(-m // 8)
    counts = {
      "rows": m,
      "nnz": nnz,
      "windows": windows,
      "blocks": round(nnz / r["nnz_per_block"]) if r["nnz_per_block"] else 0,
      "condensed_cols": round(r["cols_per_window"] * windows),
    }
    esize = DTYPES[r["dtype"]][1]
    return select.choices(counts, r["d"], esize, heads=r.get("H") or 1)[_PLANNED[r["op"]]]

  out = []
  for r in rows:
    if r.get("op") in _PLANNED and r.get("impl", "").startswith("ours-") and r.get("d"):
      if r["impl"] == "ours-auto":
        continue
      r = {**r, "plan": pick(r)}
    out.append(r)
  return out


def summarize(rows: list[dict], device: str | None = None) -> dict:
  """Prints and returns the summary tables: per (graph, order) at d=128, the geomeans, the
  selector's hit rate. Needs the raw rows only (a saved JSON's, without a GPU)."""
  rows = plan_rows(rows)
  t = _index(rows)
  graphs = sorted({r["graph"] for r in rows if "order" in r})
  orders = sorted({r["order"] for r in rows if "order" in r}, key=lambda o: (o != "none", o))
  dims = sorted({r["d"] for r in rows if r.get("d") is not None})
  dev = f" ({device})" if device else ""
  per = _per_graph_table(t, _feature_of(rows), graphs, orders, dims, dev)
  geo = _geomean_table(t, graphs, orders, dims, dev)
  sel = _selector_table(derive(rows), orders, dev)
  return {"per_graph": per, "geomeans": geo, "selector": sel}


def _per_graph_table(t, feats, graphs, orders, dims, dev) -> list[dict]:
  """Per (graph, order) at d=128 (or the widest measured), fp16: our SpMM against cuSPARSE and
  the gather floor, the SDDMM against XLA, attention fwd+bwd against XLA, the reorder's payback."""
  dsum = 128 if 128 in dims or not dims else max(dims)
  per = []
  for g in graphs:
    for o in orders:
      if (g, o) not in feats:
        continue
      f = feats[g, o]
      get = lambda op, impl, dt="fp16", o=o, d=dsum: t.get((g, o, op, d, dt, impl))  # noqa: E731
      auto = get("spmm", "ours-auto")
      cs_orig = t.get((g, "none", "spmm", dsum, "fp16", "cusparse"))
      before = t.get((g, "none", "spmm", dsum, "fp16", "ours-auto"))
      pay = None
      if o != "none" and before and auto:
        gain = (before - auto) * 1e-6
        pay = f["reorder_s"] / gain if gain > 0 else "never"
      per.append(
        {
          "graph": g,
          "order": o,
          "reorder_s": f["reorder_s"],
          "nnz/blk": f["nnz_per_block"],
          "spmm16 auto": auto,
          "rows": get("spmm", "ours-rows"),
          "tc": get("spmm", "ours-windows"),
          "cusp orig": cs_orig,
          "cusp this": get("spmm", "cusparse"),
          "x cusp orig": _ratio(cs_orig, auto),
          "x cusp this": _ratio(get("spmm", "cusparse"), auto),
          "gather fl": _ratio(get("spmm", "floor-gather"), auto),
          "sddmm16": get("sddmm", "ours-auto"),
          "sddmm xla": get("sddmm", "xla"),
          "x xla": _ratio(get("sddmm", "xla"), get("sddmm", "ours-auto")),
          "attn f+b x xla": _ratio(
            get("attention fwd+bwd", "xla"), get("attention fwd+bwd", "ours-auto")
          ),
          "payback": pay,
        }
      )
  if per:
    common.print_table(per, list(per[0]), f"per graph and order, d={dsum}, fp16, us per call{dev}")

  return per


def _geomean_table(t, graphs, orders, dims, dev) -> list[dict]:
  """Geomeans of peer / ours-auto over graphs, overall and per d."""

  def pairs(op, dt, o, peer, peer_order=None, ours="ours-auto", ours_order=None):
    out = {}
    for g in graphs:
      for d in dims:
        a = t.get((g, ours_order or o, op, d, dt, ours))
        b = t.get((g, peer_order or o, op, d, dt, peer))
        if a and b:
          out.setdefault(d, []).append(b / a)
    return out

  specs = []
  for o in orders:
    specs += [
      (
        f"SpMM fp16 ours[{o}] vs cuSPARSE fp16 [none]",
        pairs("spmm", "fp16", o, "cusparse", "none"),
      ),
      (f"SpMM fp16 ours[{o}] vs cuSPARSE fp16 [{o}]", pairs("spmm", "fp16", o, "cusparse")),
      (
        f"SpMM fp32 ours[{o}] vs cuSPARSE fp32 [none]",
        pairs("spmm", "fp32", o, "cusparse", "none"),
      ),
      (f"SpMM fp32 ours[{o}] vs cuSPARSE fp32 [{o}]", pairs("spmm", "fp32", o, "cusparse")),
      (f"SpMM fp16 ours[{o}] vs XLA segment_sum", pairs("spmm", "fp16", o, "xla")),
      (f"SpMM fp32 ours[{o}] vs XLA segment_sum", pairs("spmm", "fp32", o, "xla")),
      (f"SDDMM fp16 ours[{o}] vs XLA gather", pairs("sddmm", "fp16", o, "xla")),
      (f"SDDMM fp32 ours[{o}] vs XLA gather", pairs("sddmm", "fp32", o, "xla")),
      (
        f"SDDMM fp16 ours[{o}] vs XLA gather, serial fans",
        pairs("sddmm", "fp16", o, "xla-serial", ours="ours-auto-serial"),
      ),
      (
        f"SDDMM fp32 ours[{o}] vs XLA gather, serial fans",
        pairs("sddmm", "fp32", o, "xla-serial", ours="ours-auto-serial"),
      ),
      (
        f"SDDMM fp16 XLA gather vs the window gather floor [{o}] (the most a kernel could gain)",
        pairs("sddmm", "fp16", o, "xla", ours="floor-gather-windows"),
      ),
      (
        f"SDDMM fp16 XLA gather, serial fans, vs the window gather floor [{o}]",
        pairs("sddmm", "fp16", o, "xla-serial", ours="floor-gather-windows"),
      ),
      (
        f"attention fwd ours[{o}] vs XLA",
        pairs("attention fwd", "fp16", o, "xla", ours="ours-fused"),
      ),
      (f"attention fwd+bwd ours-auto[{o}] vs XLA", pairs("attention fwd+bwd", "fp16", o, "xla")),
    ]
    specs += [  # rows only with --flashsparse; its own timer (flashsparse_peer.HOW)
      (f"{label} {dt} ours[{o}] vs FlashSparse [{o}]", pairs(op, dt, o, "flashsparse"))
      for op, label in (("spmm", "SpMM"), ("sddmm", "SDDMM"))
      for dt in ("fp16", "fp32")
    ]
    if o != "none":
      for dt in ("fp16", "fp32"):
        specs.append(
          (
            f"SpMM {dt} ours[{o}] vs ours[none] (reorder gain)",
            pairs("spmm", dt, o, "ours-auto", "none"),
          )
        )
  geo, seen = [], set()
  for label, by_d in specs:
    if not by_d or label in seen:  # for order none, [o] and [none] are one comparison
      continue
    seen.add(label)
    allv = [v for vs in by_d.values() for v in vs]
    row = {"speedup (peer / ours)": label, "geomean": common.geomean(allv), "n": len(allv)}
    row.update({f"d={d}": common.geomean(by_d[d]) if d in by_d else None for d in dims})
    geo.append(row)
  if geo:
    common.print_table(geo, list(geo[0]), f"geomeans over graphs and dims{dev}")

  return geo


def _near_far(ds) -> dict:
  """How many configurations have auto within NEAR of the best forced kernel (and that share),
  and how many past FAR."""
  ratios = [r["auto_us"] / r["best_us"] for r in ds]
  near = sum(x <= NEAR for x in ratios)
  return {
    f"within {NEAR - 1:.0%}": near,
    f"share within {NEAR - 1:.0%}": near / len(ds),
    f"past {FAR - 1:.0%}": sum(x > FAR for x in ratios),
  }


def _selector_table(der, orders, dev) -> list[dict]:
  """The selector's hit rate (auto within 3% of the best forced kernel) per op and order, and
  where tensor cores were fastest on the reordered graphs."""
  sel = []
  for op in ("spmm", "sddmm", "attention fwd+bwd"):
    for o in [*orders, "all"]:
      ds = [
        r
        for r in der
        if r["op"] == op and (o == "all" or r["order"] == o) and r["auto_hit"] is not None
      ]
      if not ds:
        continue
      fast2 = "windows" if op != "attention fwd+bwd" else "fused"
      tc = [r for r in ds if r["best"] == fast2]
      sel.append(
        {
          "op": op,
          "order": o,
          "configs": len(ds),
          "auto hit": sum(bool(r["auto_hit"]) for r in ds),
          "hit rate": sum(bool(r["auto_hit"]) for r in ds) / len(ds),
          "tc/fused fastest": len(tc),
          "auto took it": sum(bool(r["auto_hit"]) for r in tc),
          **_near_far(ds),
          "worst auto/best": max(r["auto_us"] / r["best_us"] for r in ds),
        }
      )
  alld = [r for r in der if r["auto_hit"] is not None]
  if alld:
    sel.append(
      {
        "op": "all",
        "order": "all",
        "configs": len(alld),
        "auto hit": sum(bool(r["auto_hit"]) for r in alld),
        "hit rate": sum(bool(r["auto_hit"]) for r in alld) / len(alld),
        **_near_far(alld),
        "worst auto/best": max(r["auto_us"] / r["best_us"] for r in alld),
      }
    )
    common.print_table(sel, list(sel[0]), f"selector: auto within 3% of the best forced{dev}")
  for kind, label in (
    ("real", "real graphs"),
    ("communities", "dense-community graphs"),
    ("dense", "dense-community stand-ins"),
  ):
    of_kind = [
      r
      for r in alld
      if common.graph_kind(r["graph"]) == kind
      and r["order"] != "none"
      and r["op"] in ("spmm", "sddmm")
    ]
    if kind != "real" and not of_kind:
      continue
    tc_fast = [r for r in of_kind if r["best"] == "windows"]
    tc_sel = [r for r in tc_fast if r["auto_hit"]]
    print(
      f"\n{label}, reordered (spmm + sddmm): tensor cores fastest in {len(tc_fast)} of "
      f"{len(of_kind)} configs, selected by auto (within 3%) in {len(tc_sel)}: "
      + ", ".join(f"{r['graph']}/{r['op']}/d{r['d']}/{r['dtype']}" for r in tc_sel)
    )
  return sel


# -- CLI --------------------------------------------------------------------------------------
def _load_json(paths):
  """The rows of saved runs, older runs' kernel names as they are called now."""
  rows, device = [], None
  for p in paths:
    with open(p) as f:
      z = json.load(f)
    for r in z["rows"]:
      r["impl"] = compare.RENAMED_IMPLS.get(r.get("impl"), r.get("impl"))
      if "plan" in r:
        r["plan"] = compare.RENAMED_PLANS.get(r["plan"], r["plan"])
      rows.append(r)
    device = device or z.get("device")
  return rows, device


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--graphs", default=None, help="comma-separated names (default: all > 80k)")
  ap.add_argument("--orders", default="none,affinity")
  ap.add_argument("--dims", default="32,64,128,256")
  ap.add_argument("--dtypes", default="fp16,bf16,fp32")
  ap.add_argument("--ops", default="spmm,sddmm,attention")
  ap.add_argument(
    "--chain",
    type=int,
    default=None,
    help="K calls per program (default: chain_length, 16 to 128 by the graph's nonzeros; quick 4)",
  )
  ap.add_argument(
    "--split-blocks",
    type=int,
    default=None,
    help="window schedule piece size, FormatOptions.split_blocks (default: the builder's rule)",
  )
  ap.add_argument("--xla-dims", default="128", help="widths with XLA peers ('all': every d)")
  ap.add_argument("--attention-dims", default="64,128")
  ap.add_argument("--json", default=None, help="write the rows here after every (graph, order)")
  ap.add_argument("--quick", action="store_true", help="K=4, few repeats")
  ap.add_argument(
    "--skip",
    default="",
    help="comma-separated impls (or op:impl) not to time, e.g. spmm:ours-auto,sddmm:ours-auto "
    "(the plan's pick is recorded in each row's `plan` field)",
  )
  ap.add_argument(
    "--flashsparse",
    default=None,
    metavar="PATH",
    help="a built FlashSparse (benchmarks/flashsparse_peer.py): its SpMM/SDDMM as peer rows",
  )
  ap.add_argument("--summarize", nargs="+", default=None, metavar="JSON", help="offline summary")
  ap.add_argument(
    "--replan",
    action="store_true",
    help="with --summarize: SpMM/SDDMM auto = the forced kernel today's selector picks",
  )
  a = ap.parse_args()

  if a.summarize:
    rows, device = _load_json(a.summarize)
    summarize(replan_rows(rows) if a.replan else rows, device)
    return

  device = common.device_name()
  print(f"# device: {device}; argv: {' '.join(sys.argv[1:])}", flush=True)

  def save(rows):
    if a.json:
      tmp = a.json + ".tmp"
      bw = common.copy_bandwidth(measure=False)
      with open(tmp, "w") as f:
        json.dump(
          {
            "device": device,
            "argv": sys.argv[1:],
            "copy_GBps": bw / 1e9 if bw else None,
            "rows": rows,
            "derived": derive(rows),
          },
          f,
          indent=1,
          default=float,
        )
      os.replace(tmp, a.json)

  rows = run(a, on_order=save)
  save(rows)
  der = derive(rows)
  if der:
    common.print_table(der, DERIVED_COLUMNS, "derived (speedups: peer / ours-auto)")
  summarize(rows, device)


if __name__ == "__main__":
  main()
