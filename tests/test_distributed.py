"""jaxsparse_tc.distributed on 4 CPU devices: sharded results equal unsharded ones (every operator
and its gradients), uneven partitions, empty shards, a shard with no halo, both exchanges,
sharded GCN/GAT training (Flax nnx and Equinox), the sharding rules of plain jit and the
primitives inside a user's shard_map.

The host platform's device count is fixed when jax starts, and the rest of the suite runs in
one process with one device; so the multi-device cases run in a child process (this file, run
as a script with `--cpu-devices 4`: jax's `jax_num_cpu_devices` option; it is started with
PJRT_NPROC=8 in its environment, the threads XLA's CPU client needs for a 4-device mesh, which
XLA reads nowhere else: conftest.host_devices_env), once per session, each
reporting PASS or FAIL with its message; every case is one test here. Cases that need no
second device (padding) run in-process.

    python -m pytest -q tests/test_distributed.py
    PJRT_NPROC=8 python tests/test_distributed.py --cpu-devices 4 [case ...]

On a machine with several GPUs the same cases run on them (`--devices N`: the partitions and
meshes adapt to 1, 2, 4 or 8):

    python tests/test_distributed.py --devices 2        # prints CASE <name> PASS|FAIL
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import pytest

DEVICES = 4  # the child process's device count (its command line sets it)
RTOL = 1e-5
HIGHEST = "highest"  # exact float32 SpMM/SDDMM on GPU too (no tf32 tensor cores)


# ----------------------------------------------------------------------------------------------
# Cases run in the child process (4 devices).
# ----------------------------------------------------------------------------------------------
def _rel(a, b) -> float:
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  den = np.linalg.norm(b)
  return float(np.linalg.norm(a - b) / (den if den else 1.0))


def _close(name, a, b, tol=RTOL):
  r = _rel(a, b)
  if not r <= tol:
    raise AssertionError(f"{name}: relative error {r:.3e} > {tol:.0e}")


def _graph(n=150, density=0.05, seed=1, loops=True):
  import scipy.sparse as sp

  m = sp.random(n, n, density=density, format="csr", random_state=seed, dtype=np.float32)
  if loops:
    m = (m + sp.eye(n, dtype=np.float32)).tocsr()
  return m


def _matrix(m):
  import jaxsparse_tc as jst

  return jst.SparseMatrix.from_scipy(m)


# Partitions of 150 rows: balanced, uneven with an empty shard, and one with the empty shard
# last (for DEVICES shards).
def _bounds(name, n=150):
  P = DEVICES
  if name == "balanced" or P == 1:
    return None
  if name == "uneven_empty":  # a tiny shard, an empty one, then uneven ones (4: 90 and 50 rows)
    return [0, 0, n] if P == 2 else [0, 10, 10] + _tail(P, n)
  return np.linspace(0, n, P).astype(int).tolist() + [n]  # empty_last


def _tail(P, n):
  """P - 2 increasing cut points after row 10 ending at n (P = 4: 100, 150)."""
  return np.linspace(10, n, P - 1).astype(int).tolist()[1:] if P != 4 else [100, n]


def _sharded(A, exchange, bounds_name, mesh=None):
  from jaxsparse_tc import distributed as dist

  mesh = mesh or dist.make_mesh(DEVICES)
  return dist.shard_matrix(A, mesh, exchange=exchange, bounds=_bounds(bounds_name))


def _ops_case(exchange, bounds_name, heads):
  """spmm, sddmm, edge_softmax, sparse_attention and their gradients, sharded vs unsharded."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst

  rng = np.random.default_rng(0)
  A = _matrix(_graph())
  SA = _sharded(A, exchange, bounds_name)
  want = exchange if SA.layout.max_real_halo else "none"  # one device, or nobody reads others
  assert SA.layout.exchange == want, SA.layout
  n, d = A.shape[0], 8
  lead = (heads,) if heads else ()
  x, y, v = (rng.standard_normal(lead + (n, d)).astype(np.float32) for _ in range(3))
  vals = rng.standard_normal(lead + (A.nnz,)).astype(np.float32)
  bias = rng.standard_normal(lead + (A.nnz,)).astype(np.float32)

  def run(M, x, y, v, vals, bias):
    B = M.with_values(vals)
    out1 = jst.spmm(B, x, precision=HIGHEST)
    s = jst.sddmm(B, x, y, scale_by_values=True, precision=HIGHEST)
    p = jst.edge_softmax(s)
    out2 = jst.spmm(p, v, precision=HIGHEST)
    out3 = jst.sparse_attention(M, x, y, v, bias=bias)
    loss = jnp.sum(out1**2) + jnp.sum(jnp.sin(s.values)) + jnp.sum(out2 * 1.3) + jnp.sum(out3**2)
    return loss, (out1, s.values, p.values, out2, out3)

  grad = lambda M: jax.value_and_grad(  # noqa: E731
    lambda *a: run(M, *a), argnums=(0, 1, 2, 3, 4), has_aux=True
  )
  (l0, outs0), g0 = jax.jit(grad(A))(*map(jnp.asarray, (x, y, v, vals, bias)))
  X, Y, V = (SA.shard_rows(t) for t in (x, y, v))
  Vals, Bias = SA.values_from_input(vals), SA.values_from_input(bias)
  (l1, outs1), g1 = jax.jit(grad(SA))(X, Y, V, Vals, Bias)
  _close("loss", l1, l0)
  for name, o1, o0 in zip(("spmm", "sddmm", "edge_softmax", "spmm(P)", "attention"), outs1, outs0):
    if o1.shape[-1] == SA.nnz:  # values: sharded layout -> A's format order (the input order)
      assert float(jnp.max(jnp.abs(jnp.where(SA.value_mask(), 0, o1)))) == 0, f"{name} pads"
      o1 = SA.values_to_input(o1)
    else:
      o1 = SA.unshard_rows(o1)
    _close(name, o1, o0)
  for name, a, b in zip(("dx", "dy", "dv"), g1[:3], g0[:3]):
    _close(name, SA.unshard_rows(a), b)
  for name, a, b in zip(("dvalues", "dbias"), g1[3:], g0[3:]):
    assert float(jnp.max(jnp.abs(jnp.where(SA.value_mask(), 0, a)))) == 0, f"{name} pads"
    _close(name, SA.values_to_input(a), b)


def case_ops_allgather_balanced():
  _ops_case("allgather", "balanced", 0)


def case_ops_halo_balanced():
  _ops_case("halo", "balanced", 0)


def case_ops_allgather_uneven_empty_shard_heads():
  _ops_case("allgather", "uneven_empty", 2)


def case_ops_halo_uneven_empty_shard_heads():
  _ops_case("halo", "uneven_empty", 2)


def case_ops_halo_empty_last_shard():
  _ops_case("halo", "empty_last", 0)


def case_overlap_parts():
  """overlap=True (own and remote parts): SpMM and SDDMM and their gradients equal the
  unsharded ones for both exchanges and an uneven partition; row-wise operators refuse it."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst

  rng = np.random.default_rng(8)
  A = _matrix(_graph())
  x = rng.standard_normal((2, 150, 8)).astype(np.float32)
  vals = rng.standard_normal(A.nnz).astype(np.float32)

  def loss(M, v, x):
    B = M.with_values(v)
    return jnp.sum(jst.spmm(B, x, precision=HIGHEST) ** 2) + jnp.sum(
      jnp.sin(jst.sddmm(B, x, x, precision=HIGHEST).values)
    )

  g = lambda M: jax.value_and_grad(loss, argnums=(1, 2))  # noqa: E731
  l0, (gv0, gx0) = g(A)(A, jnp.asarray(vals), jnp.asarray(x))
  from jaxsparse_tc import distributed as dist

  if DEVICES == 1:
    return
  uneven = _bounds("uneven_empty") if DEVICES > 2 else [0, 40, 150]
  for exchange, bounds in (("allgather", None), ("halo", uneven)):
    SA = dist.shard_matrix(
      A, dist.make_mesh(DEVICES), exchange=exchange, overlap=True, bounds=bounds
    )
    assert [p.kind for p in SA.layout.parts] == ["own", "remote"], SA.layout.parts
    own, remote = SA.layout.parts
    assert own.cols == SA.layout.rows_per_shard, own
    # The remote part reads what the collective returns, as it is (no join with own rows).
    want_cols = SA.layout.padded_rows if exchange == "allgather" else DEVICES * SA.layout.halo_rows
    assert remote.cols == want_cols, (remote, want_cols)
    l1, (gv1, gx1) = jax.jit(g(SA))(SA, SA.values_from_input(vals), SA.shard_rows(x))
    _close(f"{exchange} loss", l1, l0)
    _close(f"{exchange} dvalues", SA.values_to_input(gv1), gv0)
    _close(f"{exchange} dx", SA.unshard_rows(gx1), gx0)
    assert abs(SA.to_scipy() - A.to_scipy()).max() == 0
    mask = np.asarray(SA.value_mask())
    assert np.array_equal(np.asarray(SA.rows)[~mask], np.asarray(SA.cols)[~mask])
    for fn in (
      lambda: jst.edge_softmax(SA),
      lambda: jst.sparse_attention(SA, *(SA.shard_rows(x),) * 3),
    ):
      try:
        fn()
      except NotImplementedError as e:
        assert "overlap=True" in str(e), str(e)
      else:
        raise AssertionError("expected NotImplementedError")


def case_spmm_max_min():
  """spmm(SA, X, reduce="max" / "min") and its gradients equal the single-device ones: both
  exchanges, an uneven partition with an empty shard, and overlap=True (a row's entries in two
  parts, combined); negative products (a part's empty row must not give its 0) and a NaN."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist

  rng = np.random.default_rng(11)
  A = _matrix(_graph(seed=3))
  x = rng.standard_normal((2, 150, 5)).astype(np.float32)
  x[1, 7, 2] = np.nan
  vals = -rng.uniform(0.5, 1.5, A.nnz).astype(np.float32)  # mostly negative products

  def f(M, v, x, reduce):
    return jst.spmm(M.with_values(v), x, reduce=reduce)

  def both(M, v, x, reduce):
    loss = lambda v, x: jnp.sum(jnp.nan_to_num(f(M, v, x, reduce)) * 1.7)  # noqa: E731
    return f(M, v, x, reduce), jax.grad(loss, argnums=(0, 1))(v, x)

  uneven = _bounds("uneven_empty")
  for reduce in ("max", "min"):
    out0, (gv0, gx0) = both(A, jnp.asarray(vals), jnp.asarray(x), reduce)
    for exchange, overlap in (
      ("allgather", False),
      ("halo", False),
      ("allgather", True),
      ("halo", True),
    ):
      if overlap and DEVICES == 1:
        continue
      SA = dist.shard_matrix(
        A, dist.make_mesh(DEVICES), exchange=exchange, overlap=overlap, bounds=uneven
      )
      tag = f"{reduce} {exchange} overlap={overlap}"
      out1, (gv1, gx1) = jax.jit(lambda v, x, SA=SA: both(SA, v, x, reduce))(
        SA.values_from_input(vals), SA.shard_rows(x)
      )
      np.testing.assert_array_equal(np.asarray(SA.unshard_rows(out1)), np.asarray(out0), tag)
      # NaN where the NaN's product won, in both
      for name, a, b in (
        ("dvalues", SA.values_to_input(gv1), gv0),
        ("dx", SA.unshard_rows(gx1), gx0),
      ):
        np.testing.assert_allclose(
          np.asarray(a), np.asarray(b), rtol=RTOL, atol=0, err_msg=f"{tag} {name}"
        )


def case_pre_exchanged_operands():
  """spmm(SA, exchange(SA, X)) and sddmm(SA, X, exchange(SA, Y)) equal the operators on X and
  Y, with gradients through the exchange, for every layout (allgather, halo, uneven halo with
  an empty shard, both with own/remote parts); gcn_conv takes exchanged features; the halo
  send's transpose is an SpMM (no scatter-add in the gradient); a wrongly
  shaped operand is refused naming both layouts; integer rows are exchanged by a gather."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist
  from jaxsparse_tc._src import checks
  from jaxsparse_tc.nn import functional as F

  if DEVICES == 1:
    return
  rng = np.random.default_rng(11)
  A = _matrix(_graph())
  x, y = (rng.standard_normal((150, 8)).astype(np.float32) for _ in range(2))
  w = rng.standard_normal((8, 5)).astype(np.float32)
  uneven = _bounds("uneven_empty") if DEVICES > 2 else [0, 40, 150]
  mesh = dist.make_mesh(DEVICES)
  for exchange, bounds, overlap in (
    ("allgather", None, False),
    ("halo", None, False),
    ("halo", uneven, False),
    ("allgather", None, True),
    ("halo", uneven, True),
  ):
    SA = dist.shard_matrix(A, mesh, exchange=exchange, bounds=bounds, overlap=overlap)
    tag = f"{exchange} bounds={bounds} overlap={overlap}"
    assert SA.exchanged_rows == DEVICES * SA.layout.ext_cols != SA.layout.padded_rows, tag
    X, Y = SA.shard_rows(x), SA.shard_rows(y)

    def loss(X, Y, pre):
      Xe = dist.exchange(SA, X) if pre else X
      Ye = dist.exchange(SA, Y) if pre else Y
      out = jst.spmm(SA, Xe, precision=HIGHEST)
      s = jst.sddmm(SA, X, Ye, precision=HIGHEST).values
      return jnp.sum(out**2) + jnp.sum(jnp.sin(s)), (out, s)

    g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
    (l0, (o0, s0)), d0 = g(X, Y, False)
    (l1, (o1, s1)), d1 = g(X, Y, True)
    _close(f"{tag} loss", l1, l0)
    _close(f"{tag} spmm", SA.unshard_rows(o1), SA.unshard_rows(o0))
    _close(f"{tag} sddmm", SA.values_to_input(s1), SA.values_to_input(s0))
    for name, a, b in zip(("dX", "dY"), d1, d0):
      _close(f"{tag} {name}", SA.unshard_rows(a), SA.unshard_rows(b))
    # against one device, too
    _close(f"{tag} spmm vs A", SA.unshard_rows(o1), jst.spmm(A, x, precision=HIGHEST))
    # gcn_conv on exchanged features: both propagation orders (out wider, then narrower)
    for k in (np.concatenate([w, w], axis=1), w[:, :3]):
      ref = F.gcn_conv(A, jnp.asarray(x), jnp.asarray(k))
      got = jax.jit(lambda X: F.gcn_conv(SA, dist.exchange(SA, X), jnp.asarray(k)))(X)
      _close(f"{tag} gcn_conv {k.shape}", SA.unshard_rows(got), ref, tol=1e-4)
    if exchange == "halo" and not overlap:
      S_halo = SA
  try:
    jst.spmm(SA, jnp.zeros((SA.exchanged_rows + DEVICES, 8)))
  except checks.OperandError as e:
    assert str(SA.exchanged_rows) in str(e) and str(SA.layout.padded_rows) in str(e), str(e)
  else:
    raise AssertionError("expected OperandError")
  # The halo send's transpose is an SpMM with the selection matrix, not XLA's scatter-add.
  jaxpr = str(
    jax.make_jaxpr(jax.grad(lambda X: jnp.sum(jst.spmm(S_halo, X) ** 2)))(S_halo.shard_rows(x))
  )
  assert "scatter-add" not in jaxpr and "scatter_add" not in jaxpr, "halo transpose scatters"
  # Integer rows (no SpMM): gathered; every ext slot a column reads holds its node's row.
  SA = S_halo
  ids = SA.shard_rows(np.arange(150, dtype=np.int32)[:, None] * np.ones((1, 3), np.int32))
  got = np.asarray(dist.exchange(SA, ids)).reshape(DEVICES, -1, 3)
  e2g = np.asarray(SA.arrays.ext_to_global)
  src, _ = SA._row_source()
  cols = np.asarray(SA.arrays.parts[0].a.cols)
  for p in range(DEVICES):
    c = cols[p, : int(np.asarray(SA.arrays.parts[0].nnz)[p])]
    assert np.array_equal(got[p][c, 0], src[e2g[p][c]]), p
    assert np.array_equal(got[p][c, 2], src[e2g[p][c]]), p


def case_train_gcn_overlap():
  from jaxsparse_tc.examples import train_sharded

  r = train_sharded.check("gcn", "flax", DEVICES, steps=4, verbose=False, overlap=True)
  if not train_sharded.passes(r, RTOL):
    raise AssertionError(f"gcn overlap: {r}")


def case_no_halo_shard():
  """A shard whose rows read only its own rows (its halo lists are empty) next to shards that
  exchange; and a block-diagonal graph (no exchange at all)."""
  import jax
  import jax.numpy as jnp
  import scipy.sparse as sp

  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist

  if DEVICES == 1:
    return
  rng = np.random.default_rng(2)
  n = 30 * DEVICES
  bounds = list(range(0, n + 1, 30))
  m = _graph(n, 0.08, seed=3).tolil()
  m[0:30, 30:] = 0  # shard 0 reads nobody
  m = m.tocsr()
  m.eliminate_zeros()
  blocks = sp.block_diag([_graph(30, 0.2, seed=s) for s in range(DEVICES)]).tocsr()
  mesh = dist.make_mesh(DEVICES)
  for graph, want in ((m, "halo"), (blocks, "none")):
    A = _matrix(graph)
    SA = dist.shard_matrix(A, mesh, bounds=bounds, exchange="halo")
    assert SA.layout.exchange == want, (want, SA.layout)
    if want == "halo":
      send = np.asarray(SA.arrays.send).reshape(DEVICES, DEVICES, -1)
      e2g = np.asarray(SA.arrays.ext_to_global)[0, SA.layout.rows_per_shard :]
      assert np.all(e2g == SA.layout.rows_per_shard - 1), "shard 0 should receive nothing"
      del send
    x = rng.standard_normal((n, 16)).astype(np.float32)

    def loss(M, x):
      return jnp.sum(jst.spmm(M, x, precision=HIGHEST) ** 2) + jnp.sum(
        jst.sddmm(M, x, x, precision=HIGHEST).values
      )

    l0, g0 = jax.value_and_grad(loss, argnums=1)(A, jnp.asarray(x))
    l1, g1 = jax.jit(jax.value_and_grad(loss, argnums=1))(SA, SA.shard_rows(x))
    _close(f"{want} loss", l1, l0)
    _close(f"{want} dx", SA.unshard_rows(g1), g0)


def case_total_past_entry_limit():
  """With the format's entry limit lowered below the graph's entries: one SparseMatrix is
  refused, the sharded graph (each shard under the limit) is built and its SpMM equals a float64
  reference; bounds giving one shard more than the limit are refused, naming the shard."""
  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist
  from jaxsparse_tc._src import integrity
  from jaxsparse_tc._src import sparse_matrix as sm

  if DEVICES == 1:
    return
  rng = np.random.default_rng(5)
  g = _graph(40 * DEVICES, 0.1, seed=4).tocoo()
  limit = g.nnz // DEVICES + g.nnz // (4 * DEVICES)  # under the total, over each shard's share
  saved = sm._MAX_ENTRIES, integrity.MAX_ENTRIES
  sm._MAX_ENTRIES = integrity.MAX_ENTRIES = limit
  try:
    try:
      jst.SparseMatrix.from_scipy(g)
      raise AssertionError(f"a matrix of {g.nnz} entries passed the limit {limit}")
    except ValueError as e:
      assert f"at most {limit} entries" in str(e), e
    mesh = dist.make_mesh(DEVICES)
    SA = dist.shard_scipy(g, mesh, bounds=list(range(0, g.shape[0] + 1, 40)))
    x = rng.standard_normal((g.shape[0], 8)).astype(np.float32)
    want = g.astype(np.float64) @ x.astype(np.float64)
    _close("spmm", SA.unshard_rows(jst.spmm(SA, SA.shard_rows(x), precision=HIGHEST)), want)
    try:
      dist.shard_scipy(g, mesh, bounds=[0] * DEVICES + [g.shape[0]])
      raise AssertionError("a shard over the entry limit was accepted")
    except ValueError as e:
      assert f"shard {DEVICES - 1} of {DEVICES} holds {g.nnz} entries" in str(e), e
      assert f"per-shard limit of {limit}" in str(e), e
  finally:
    sm._MAX_ENTRIES, integrity.MAX_ENTRIES = saved


def case_auto_exchange_and_bytes():
  """auto picks halo for a local (banded) graph and allgather for a random one; exchange_bytes
  counts rows received."""
  import scipy.sparse as sp

  from jaxsparse_tc import distributed as dist

  if DEVICES == 1:
    return
  n = 400
  band = sp.diags([np.ones(n - k, np.float32) for k in (0, 1, 2)], [0, 1, 2], shape=(n, n))
  mesh = dist.make_mesh(DEVICES)
  S_band = dist.shard_scipy(band.tocsr(), mesh)
  S_rand = dist.shard_scipy(_graph(n, 0.05), mesh)
  assert S_band.layout.exchange == "halo", S_band.layout
  assert S_rand.layout.exchange == "allgather", S_rand.layout
  assert S_band.exchange_bytes(128, 4) == (DEVICES - 1) * S_band.layout.halo_rows * 512
  assert S_rand.exchange_bytes(64, 2) == (DEVICES - 1) * S_rand.layout.rows_per_shard * 128
  # A forced exchange is honoured either way.
  assert dist.shard_scipy(band.tocsr(), mesh, exchange="allgather").layout.exchange == "allgather"
  b = dist.partition_rows(np.diff(_graph(n, 0.05).indptr), DEVICES)
  assert b[0] == 0 and b[-1] == n and np.all(np.diff(b) > 0)


def case_layout_roundtrips():
  """shard_rows / unshard_rows, values_from_input / values_to_input, to_scipy, rows/cols."""
  import jax.numpy as jnp

  from jaxsparse_tc import distributed as dist

  g = _graph(97, 0.06)
  for exchange in ("allgather", "halo"):
    SA = dist.shard_scipy(g, dist.make_mesh(DEVICES), exchange=exchange)
    x = np.arange(97 * 3, dtype=np.float32).reshape(97, 3)
    assert np.array_equal(np.asarray(SA.unshard_rows(SA.shard_rows(x))), x)
    assert np.array_equal(np.asarray(SA.unshard_rows(SA.shard_rows(jnp.asarray(x)))), x)
    assert abs(SA.to_scipy() - g).max() == 0
    coo = g.tocoo()
    vals = SA.values_from_input(coo.data)
    assert np.array_equal(np.asarray(SA.values_to_input(vals)), coo.data)
    pos_r = SA.node_positions(coo.row)
    pos_c = SA.node_positions(coo.col)
    p = np.asarray(SA.layout.input_positions)
    assert np.array_equal(np.asarray(SA.rows)[p], pos_r)
    assert np.array_equal(np.asarray(SA.cols)[p], pos_c)
    mask = np.asarray(SA.value_mask())
    assert np.array_equal(np.asarray(SA.rows)[~mask], np.asarray(SA.cols)[~mask])


def case_vmap_and_eager():
  """vmap over value sets through a sharded SpMM; eager (unjitted) calls."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist

  rng = np.random.default_rng(4)
  A = _matrix(_graph())
  SA = dist.shard_matrix(A, dist.make_mesh(DEVICES))
  x = rng.standard_normal((150, 4)).astype(np.float32)
  vals = rng.standard_normal((3, A.nnz)).astype(np.float32)
  ref = jax.vmap(lambda v: jst.spmm(A.with_values(v), jnp.asarray(x)))(vals)
  V = jnp.stack([SA.values_from_input(v) for v in vals])
  out = jax.vmap(lambda v: jst.spmm(SA.with_values(v), SA.shard_rows(x)))(V)
  _close("vmap", SA.unshard_rows(out), ref)
  _close("eager", SA.unshard_rows(SA @ SA.shard_rows(x)), A @ jnp.asarray(x))


def _train_case(model, framework):
  from jaxsparse_tc.examples import train_sharded

  r = train_sharded.check(model, framework, DEVICES, steps=4, verbose=False)
  if not train_sharded.passes(r, RTOL):
    raise AssertionError(f"{model}/{framework}: {r}")


def case_train_gcn_flax():
  _train_case("gcn", "flax")


def case_train_gcn_equinox():
  _train_case("gcn", "equinox")


def case_train_gat_flax():
  _train_case("gat", "flax")


def case_train_gat_equinox():
  _train_case("gat", "equinox")


# A 4-CPU-device step of the graph below runs some 8x slower than it is dispatched: a loop that
# never waits is 32 steps ahead (XLA:CPU's limit in flight) after ~40, and every step after can
# deadlock a CPU client of too few threads (with 4 threads: 3 aborts in 3 runs of 200 steps).
UNBLOCKED_STEPS = 200


def case_train_gcn_steps_without_blocking():
  """UNBLOCKED_STEPS jitted GCN training steps (forward, gradients, SGD update; edge values and
  features on the mesh) dispatched one after the other with nothing waiting on their results,
  as a training loop is written, give the losses and parameters of the same steps on one device.
  On host devices such a loop used to abort the process ("Termination timeout for all gather"):
  XLA's CPU client needs 2 threads per device of the mesh (distributed.check_host_mesh)."""
  import jax
  import jax.numpy as jnp
  import scipy.sparse as sp

  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist

  seed = int(np.random.SeedSequence().entropy % (2**32))
  rng = np.random.default_rng(seed)
  n, d, hidden, classes = 3000, 16, 16, 4
  g = _graph(n, 8 / n, seed=int(rng.integers(1 << 30)))
  g.data = rng.uniform(0.5, 1.0, g.nnz).astype(np.float32)
  g = sp.diags(1.0 / np.asarray(g.sum(axis=1)).ravel()).astype(np.float32) @ g  # rows average
  A = _matrix(g.tocsr())
  SA = dist.shard_matrix(A, dist.make_mesh(DEVICES))
  x = rng.standard_normal((n, d)).astype(np.float32)
  # Labels a GCN can learn: a random teacher GCN's classes.
  teacher = g @ np.maximum(g @ x @ rng.standard_normal((d, hidden)), 0)
  labels = np.argmax(teacher @ rng.standard_normal((hidden, classes)), axis=1).astype(np.int32)
  train = rng.random(n) < 0.5
  p0 = {
    "w1": rng.standard_normal((d, hidden)).astype(np.float32) / np.sqrt(d),
    "b1": np.zeros(hidden, np.float32),
    "w2": rng.standard_normal((hidden, classes)).astype(np.float32) / np.sqrt(hidden),
  }

  def loss_fn(p, M, x, labels, mask):
    dot = lambda a, b: jnp.dot(a, b, precision=HIGHEST)  # noqa: E731
    h = jnp.tanh(jst.spmm(M, dot(x, p["w1"]), precision=HIGHEST) + p["b1"])
    logits = jst.spmm(M, dot(h, p["w2"]), precision=HIGHEST)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)[:, 0]
    return jnp.sum(jnp.where(mask, ce, 0.0)) / jnp.sum(mask)

  @jax.jit
  def step(p, M, x, labels, mask):
    loss, grads = jax.value_and_grad(loss_fn)(p, M, x, labels, mask)
    return jax.tree_util.tree_map(lambda w, g: w - 0.5 * g, p, grads), loss

  def train_loop(M, x, labels, mask):
    p, losses = jax.tree_util.tree_map(jnp.asarray, p0), []
    for _ in range(UNBLOCKED_STEPS):  # no float(), no block_until_ready: steps queue up
      p, loss = step(p, M, x, labels, mask)
      losses.append(loss)
    return p, jnp.stack(losses)

  p1, l1 = train_loop(A, jnp.asarray(x), jnp.asarray(labels), jnp.asarray(train))
  Ps, Ls = train_loop(
    SA, SA.shard_rows(x), SA.shard_rows(labels), SA.shard_rows(train) & SA.row_mask()
  )
  tag = f"seed {seed}"
  assert float(Ls[-1]) < 0.9 * float(Ls[0]), f"{tag}: the loss did not go down: {Ls}"
  _close(f"{tag} losses", Ls, l1, tol=1e-5)
  for k in p0:
    _close(f"{tag} {k}", Ps[k], p1[k], tol=1e-5)


def case_host_mesh_needs_two_threads_per_device():
  """A mesh of N host devices is refused, naming PJRT_NPROC=2N, where XLA's CPU client has fewer
  than 2 N threads (the check reads PJRT_NPROC, lowered here), by make_mesh and by shard_matrix
  on a mesh made by jax; with 2 N threads, or on half the devices, it is accepted."""
  import jax
  from jax.sharding import Mesh

  from jaxsparse_tc import distributed as dist

  if jax.devices()[0].platform != "cpu" or DEVICES < 2:
    return
  A = _matrix(_graph())
  mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
  saved = os.environ.get("PJRT_NPROC")
  try:
    os.environ["PJRT_NPROC"] = str(2 * DEVICES - 1)
    for build in (lambda: dist.make_mesh(DEVICES), lambda: dist.shard_matrix(A, mesh)):
      try:
        build()
      except ValueError as e:
        msg = str(e)
        assert f"PJRT_NPROC={2 * DEVICES}" in msg and f"it has {2 * DEVICES - 1}" in msg, msg
        assert "deadlock" in msg and f"{DEVICES} host (CPU) devices" in msg, msg
      else:
        raise AssertionError("expected a ValueError")
    os.environ["PJRT_NPROC"] = "1"  # the pool still has a thread per CPU device
    dist.check_host_mesh(dist.make_mesh(DEVICES // 2))
    os.environ["PJRT_NPROC"] = str(2 * DEVICES)
    dist.check_host_mesh(mesh)
  finally:
    if saved is None:
      os.environ.pop("PJRT_NPROC", None)
    else:
      os.environ["PJRT_NPROC"] = saved


def case_operands_on_other_devices():
  """Operands committed to devices other than the ShardedMatrix's mesh (or to its devices in
  another order) are refused by name, eagerly; the same arrays moved to the mesh are accepted."""
  import jax
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist
  from jaxsparse_tc._src import checks

  if DEVICES < 2:
    return
  SA = dist.shard_matrix(_matrix(_graph()), dist.make_mesh(DEVICES))
  X = SA.shard_rows(np.random.default_rng(12).standard_normal((150, 8)).astype(np.float32))
  reversed_mesh = Mesh(np.array(jax.devices()[:DEVICES][::-1]), ("shards",))
  on_other = (
    ("reversed", jax.device_put(X, NamedSharding(reversed_mesh, P("shards")))),
    ("one device", jax.device_put(X, jax.devices()[1])),
  )
  for tag, Xo in on_other:
    for op, fn in (
      ("spmm", lambda: jst.spmm(SA, Xo)),
      ("exchange", lambda: dist.exchange(SA, Xo)),
      ("sddmm", lambda: jst.sddmm(SA, X, Xo)),
    ):
      try:
        fn()
      except checks.OperandError as e:
        assert op in str(e) and "lives on devices" in str(e), (tag, str(e))
      else:
        raise AssertionError(f"{tag} {op}: expected an OperandError")
  v = jax.device_put(SA.values, jax.devices()[0])
  try:
    jst.edge_softmax(SA, v)
  except checks.OperandError as e:
    assert "values" in str(e) and "lives on devices" in str(e), str(e)
  else:
    raise AssertionError("edge_softmax: expected an OperandError")
  moved = jax.device_put(on_other[0][1], X.sharding)
  _close("moved", jst.spmm(SA, moved, precision=HIGHEST), jst.spmm(SA, X, precision=HIGHEST))


def case_train_main_job_devices_flag():
  """The main job's --devices N: a few sharded epochs train (the loss goes down)."""
  from jaxsparse_tc.examples import train

  r = train.train("gcn", "flax", 0, 15, verbose=False, devices=DEVICES)
  assert r["devices"] == DEVICES, r["devices"]
  assert r["loss_history"][-1] < r["loss_history"][0], r["loss_history"]


def case_spmd_heads_and_features():
  """Plain jit, replicated SparseMatrix, dense operands sharded along heads (every primitive)
  or SpMM's features: equal results and gradients, no all-gather in the program."""
  import warnings

  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxsparse_tc as jst

  rng = np.random.default_rng(5)
  A = _matrix(_graph(100))
  a = 2 if DEVICES >= 2 else 1
  mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(a, DEVICES // a), ("a", "b"))
  H = 4
  q, k, v = (rng.standard_normal((H, 100, 8)).astype(np.float32) for _ in range(3))
  b = rng.standard_normal((H, A.nnz)).astype(np.float32)

  def f(q, k, v, b):
    o = jst.sparse_attention(A, q, k, v, bias=b)
    s = jst.sddmm(A, q, k)
    p = jst.edge_softmax(s)
    return (
      jnp.sum(o**2) + jnp.sum(jnp.sin(s.values)) + jnp.sum(jst.spmm(p, v, precision=HIGHEST) * 1.3)
    )

  ref = jax.value_and_grad(f, argnums=(0, 1, 2, 3))(q, k, v, b)
  args = [jax.device_put(t, NamedSharding(mesh, P("a"))) for t in (q, k, v, b)]
  g = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    out = g(*args)
  _close("heads loss", out[0], ref[0])
  for a, r in zip(out[1], ref[1]):
    _close("heads grad", a, r)
    assert a.sharding.spec[0] == "a", a.sharding
  assert "all-gather" not in g.lower(*args).compile().as_text()
  x = rng.standard_normal((H, 100, 16)).astype(np.float32)
  for spec in (P(None, None, "a"), P("a", None, "b")):
    X = jax.device_put(x, NamedSharding(mesh, spec))
    sq = lambda X: jnp.sum(jst.spmm(A, X, precision=HIGHEST) ** 2)
    h = jax.jit(jax.value_and_grad(sq))
    (l1, g1), (l0, g0) = h(X), jax.value_and_grad(sq)(jnp.asarray(x))
    _close("features loss", l1, l0)
    _close("features grad", g1, g0)
    assert g1.sharding.spec == spec, (g1.sharding, spec)
    assert "all-gather" not in h.lower(X).compile().as_text(), spec


def case_spmd_rows_fallback_and_error():
  """X sharded along its rows under plain jit: gathered with a warning (correct result), or a
  PartitionError with set_fallback("error")."""
  import warnings

  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxsparse_tc as jst
  from jaxsparse_tc.distributed import spmd

  A = _matrix(_graph(128))
  mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("a",))
  x = np.random.default_rng(6).standard_normal((128, 16)).astype(np.float32)
  X = jax.device_put(x, NamedSharding(mesh, P("a")))
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    y = jax.jit(lambda X: jst.spmm(A, X) * 2.0)(X)
  _close("rows fallback", y, 2.0 * (A @ jnp.asarray(x)))
  assert any("sharded along dim 1" in str(m.message) for m in w), [str(m.message) for m in w]
  spmd.set_fallback("error")
  try:
    jax.jit(lambda X: jst.spmm(A, X) * 3.0)(X)
  except Exception as e:  # noqa: BLE001 (XLA wraps the callback's error)
    assert "PartitionError" in str(e) and "ShardedMatrix" in str(e), str(e)[:500]
  else:
    raise AssertionError("expected a PartitionError")
  finally:
    spmd.set_fallback("gather")


def case_user_shard_map_check_vma():
  """The primitives inside a user's shard_map (check_vma on and off): a replicated matrix with
  sharded features / heads, and per-shard matrices; gradients equal the unsharded ones."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  import jaxsparse_tc as jst
  from jaxsparse_tc.distributed import shard_map_compat

  mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
  A = _matrix(_graph(64, 0.1))
  rng = np.random.default_rng(7)
  X = jnp.asarray(rng.standard_normal((64, 16)).astype(np.float32))
  H = max(4, DEVICES)
  q, k, v = (jnp.asarray(rng.standard_normal((H, 64, 8)).astype(np.float32)) for _ in range(3))

  def f(vals, x, q, k, v):
    B = A.with_values(vals)
    p = jst.edge_softmax(jst.sddmm(B, q, k, precision=HIGHEST))
    return (
      jnp.sum(jst.spmm(B, x, precision=HIGHEST) ** 2)
      + jnp.sum(jst.spmm(p, v, precision=HIGHEST) ** 2)
      + jnp.sum(jst.sparse_attention(B, q, k, v) ** 2)
    )

  ref = jax.grad(f, argnums=(0, 1, 2, 3, 4))(A.values, X, q, k, v)
  specs = (P(), P(None, "x"), P("x"), P("x"), P("x"))
  sm = getattr(jax, "shard_map", None)
  for check in (True, False) if sm is not None else (False,):
    g = sm(
      lambda *a: jax.lax.psum(f(*a), "x"), mesh=mesh, in_specs=specs, out_specs=P(), check_vma=check
    )
    out = jax.jit(jax.grad(g, argnums=(0, 1, 2, 3, 4)))(A.values, X, q, k, v)
    for i, (a, r) in enumerate(zip(out, ref)):
      _close(f"check_vma={check} grad {i}", a, r)
  del shard_map_compat  # (per-shard matrices inside shard_map: every ShardedMatrix case)


def _cases():
  return {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def _child_main(names) -> int:
  import jax

  if len(jax.devices()) < DEVICES:
    print(f"SETUP FAIL {json.dumps(f'need {DEVICES} devices, have {len(jax.devices())}')}")
    return 1
  cases = _cases()
  failed = 0
  for name in names or list(cases):
    start = time.perf_counter()
    try:
      cases[name]()
      print(f"CASE {name} PASS", flush=True)
      print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001
      failed += 1
      print(f"CASE {name} FAIL {json.dumps(traceback.format_exc()[-3000:])}", flush=True)
  print(
    f"{len(names or cases) - failed} passed, {failed} failed on {DEVICES} "
    f"{jax.devices()[0].platform} devices",
    flush=True,
  )
  return 1 if failed else 0


# ----------------------------------------------------------------------------------------------
# pytest side
# ----------------------------------------------------------------------------------------------
_child = []  # the multi-device child process and its output files, once started


def start_child() -> None:
  """Starts the child process running every case (once). conftest.py starts it as soon as the
  tests are collected, so that it runs beside the rest of the suite (~2 minutes on 2 cores). Its
  output goes to files: a pipe that nobody reads yet could fill and stall it."""
  if not _child:
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    from conftest import host_devices_env

    cmd = [sys.executable, os.path.abspath(__file__), "--cpu-devices", str(DEVICES)]
    env = host_devices_env(DEVICES)
    _child.append((subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env), out, err))


@pytest.fixture(scope="session")
def child_results():
  start_child()
  proc, out, err = _child[0]
  try:
    proc.wait(timeout=3000)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
  out.seek(0)
  err.seek(0)
  stdout, stderr = out.read(), err.read()
  results = {}
  for line in stdout.splitlines():
    parts = line.split(" ", 3)
    if len(parts) >= 3 and parts[0] == "CASE":
      results[parts[1]] = (parts[2], json.loads(parts[3]) if len(parts) > 3 else "")
  if not results:
    pytest.fail(
      f"the multi-device child process reported nothing (exit {proc.returncode}):\n"
      f"{stdout[-2000:]}\n{stderr[-4000:]}"
    )
  return results, stderr[-3000:]


@pytest.mark.parametrize("name", sorted(_cases()))
def test_multi_device(child_results, name):
  results, stderr = child_results
  if name not in results:
    pytest.fail(f"case {name} did not report (the child process died?):\n{stderr}")
  status, message = results[name]
  assert status == "PASS", message


# In-process (one device): the padding of format arrays.
def test_padded_pattern_runs_like_the_original(rng):
  import jax.numpy as jnp

  import jaxsparse_tc as jst
  from jaxsparse_tc._src import padding
  from jaxsparse_tc._src.pattern import Pattern
  from jaxsparse_tc.sparse_matrix import SparseMatrix

  m, n = 37, 29
  rows = rng.integers(0, m, 150)
  cols = rng.integers(0, n, 150)
  A = SparseMatrix.from_coo(
    rows,
    cols,
    rng.standard_normal(150).astype(np.float32),
    shape=(m + 8 - m % 8 + 8, n + 8 - n % 8 + 8),
  )
  M, N = A.shape
  nnz_pad = A.nnz + 13

  def padded(p, rows_, spare):
    p = Pattern(*map(np.asarray, p))
    p = padding.reschedule(p, rows_, nnz_pad, False)
    s = padding.pattern_sizes(p)
    size = padding.PadSizes(nnz_pad, s.cols + 5, s.blocks + 3, s.items + 7, s.row_items + 9)
    return padding.pad_pattern(
      p, size, empty_window=rows_ // 8 - 1, empty_row=rows_ - 1, fill_col=spare
    )

  pa, pt = padded(A.pattern, M, N - 1), padded(A.pattern_t, N, M - 1)
  vals = jnp.concatenate([A.values, jnp.full((13,), 7.0)])
  B = SparseMatrix(
    vals,
    Pattern(*map(jnp.asarray, pa)),
    Pattern(*map(jnp.asarray, pt)),
    jnp.asarray(padding.pad_permutation(A.perm_t, nnz_pad)),
    jnp.asarray(padding.pad_permutation(A.perm_t_inv, nnz_pad)),
    A.input_to_format,
    A.shape,
    padded=True,
  )
  x = jnp.asarray(rng.standard_normal((N, 5)).astype(np.float32))
  y = jnp.asarray(rng.standard_normal((M, 5)).astype(np.float32))
  np.testing.assert_allclose(np.asarray(B @ x), np.asarray(A @ x), rtol=1e-6, atol=1e-6)
  mask = np.asarray(padding.valid_mask(A.nnz, nnz_pad))
  np.testing.assert_allclose(
    np.asarray(jst.sddmm(B, y, x).values)[mask],
    np.asarray(jst.sddmm(A, y, x).values),
    rtol=1e-6,
    atol=1e-6,
  )
  with pytest.raises(ValueError, match="not an empty window"):
    padding.pad_pattern(
      Pattern(*map(np.asarray, A.pattern)),
      padding.pattern_sizes(A.pattern),
      empty_window=int(np.asarray(A.rows)[0]) // 8,
      empty_row=M - 1,
      fill_col=0,
    )


def test_cpu_client_threads_counted_as_xla_does(monkeypatch):
  """XLA's CPU client pool: PJRT_NPROC, else NPROC (unparsable ones skipped), else the
  schedulable CPUs; never fewer threads than CPU devices."""
  from jaxsparse_tc._src.distributed.mesh import cpu_client_threads

  monkeypatch.delenv("PJRT_NPROC", raising=False)
  monkeypatch.delenv("NPROC", raising=False)
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  assert cpu_client_threads(1)[0] == cpus
  assert cpu_client_threads(cpus + 3)[0] == cpus + 3
  monkeypatch.setenv("NPROC", str(cpus + 5))
  assert cpu_client_threads(1)[0] == cpus + 5
  monkeypatch.setenv("PJRT_NPROC", "3")
  assert cpu_client_threads(1) == (3, "PJRT_NPROC=3, 1 CPU devices")
  assert cpu_client_threads(7)[0] == 7
  monkeypatch.setenv("PJRT_NPROC", "many")
  assert cpu_client_threads(1)[0] == cpus + 5


def test_sharded_matrix_refuses_wrong_operands(rng):
  """The layout helpers and operators of a ShardedMatrix refuse operands of the wrong length,
  dtype or layout by name (in jit too, at trace time), where they used to return wrong rows or
  values: unshard_rows, shard_rows, values_from_input, values_to_input, with_values,
  node_positions, edge_softmax's values, sparse_attention's bias, exchange_bytes; and bad
  build arguments (partition_rows' counts, halo_threshold)."""
  import jax
  import jax.numpy as jnp

  import jaxsparse_tc as jst
  from jaxsparse_tc import distributed as dist
  from jaxsparse_tc._src.checks import OperandError

  n = 61
  rows, cols = rng.integers(0, n, 300), rng.integers(0, n, 300)
  rows[1], cols[1] = rows[0], cols[0]  # a duplicate: fewer values in the layout than entries
  vals = rng.uniform(0.5, 1.5, 300).astype(np.float32)
  SA = dist.shard_coo(rows, cols, vals, num_nodes=n, mesh=dist.make_mesh(1))
  R, E = SA.layout.padded_rows, rows.size
  assert SA.nnz < E, (SA.nnz, E)
  x = rng.standard_normal((n, 4)).astype(np.float32)
  X = SA.shard_rows(x)
  np.testing.assert_array_equal(np.asarray(SA.unshard_rows(X)), x)  # the right ones pass
  cases = [
    (lambda: SA.unshard_rows(X[: R - 8]), rf"\[{R}, \.\.\.\].*\({R - 8}, 4\)"),
    (lambda: SA.unshard_rows(np.ones((R + 1, 4))), rf"got shape \({R + 1}, 4\)"),
    (lambda: SA.unshard_rows(jnp.ones((n, 4))), "already in global order"),
    (lambda: SA.unshard_rows(jnp.ones((2, R - 1, 4))), rf"\[H, {R}, d\]"),
    (lambda: jax.jit(SA.unshard_rows)(X[1:]), rf"got shape \({R - 1}, 4\)"),
    (lambda: SA.unshard_rows(np.float32(1)), r"got shape \(\)"),
    (lambda: SA.shard_rows(x[1:]), rf"\[{n}, \.\.\.\].*\({n - 1}, 4\)"),
    (lambda: SA.shard_rows(np.asarray(X)), "already sharded"),
    (lambda: SA.values_from_input(vals[:-1]), rf"\[{E}\] or \[H, {E}\].*\({E - 1},\)"),
    (lambda: SA.values_from_input(vals[:1]), r"\(1,\)"),
    (lambda: SA.values_from_input(SA.values), "already mapped"),
    (lambda: SA.values_to_input(SA.values[:-1]), rf"\[{SA.nnz}\].*\({SA.nnz - 1},\)"),
    (lambda: SA.values_to_input(jnp.asarray(vals)), "builder's input order"),
    (lambda: SA.with_values(jnp.ones(SA.nnz, jnp.int32)), "non-float dtype int32"),
    (lambda: SA.with_values(jnp.asarray(vals)), "values_from_input maps it"),
    (lambda: jst.edge_softmax(SA, jnp.asarray(vals)), rf"values \[{SA.nnz}\].*\({E},\)"),
    (lambda: jst.sparse_attention(SA, X, X, X, bias=jnp.asarray(vals)), rf"bias \[{SA.nnz}\]"),
  ]
  for fn, pattern in cases:
    with pytest.raises(OperandError, match=pattern):
      fn()
  with pytest.raises(ValueError, match=rf"node ids must be in \[0, {n}\).*from -1 to {n}"):
    SA.node_positions([0, -1, n])
  with pytest.raises(ValueError, match="must be integers; got dtype float64"):
    SA.node_positions(np.array([0.0, 1.5]))
  with pytest.raises(ValueError, match="exchange must be"):
    SA.exchange_bytes(8, 4, "all-gather")
  with pytest.raises(ValueError, match="finite counts >= 0"):
    dist.partition_rows(np.array([3, -1, 2]), 2)
  with pytest.raises(ValueError, match="halo_threshold must be >= 0"):
    dist.shard_coo(rows, cols, vals, num_nodes=n, mesh=dist.make_mesh(1), halo_threshold=-0.5)


def _main(argv) -> int:
  import argparse

  global DEVICES
  ap = argparse.ArgumentParser(description="the multi-device cases, one line each")
  where = ap.add_mutually_exclusive_group(required=True)
  where.add_argument("--cpu-devices", type=int, help="run on this many host (CPU) devices")
  where.add_argument("--devices", type=int, help="run on this many of the default backend's")
  ap.add_argument("cases", nargs="*")
  a = ap.parse_args(argv)
  if a.cpu_devices:  # before jax starts its backends
    from conftest import use_host_devices

    use_host_devices(a.cpu_devices)
  DEVICES = a.cpu_devices or a.devices
  return _child_main(a.cases)


if __name__ == "__main__":
  raise SystemExit(_main(sys.argv[1:]))


def test_sharded_operators_promote_and_check_like_single_device(rng):
  """dist.spmm / dist.sddmm(scale_by_values=True) compute in the promoted dtype of the values
  and the features (a float32 value of 1e5 times float16 features of 1e-3 stays finite), and
  attention without features raises OperandError, as the single-device operators do."""
  import jax.numpy as jnp

  from jaxsparse_tc import distributed as dist
  from jaxsparse_tc._src.checks import OperandError

  n = 40
  rows, cols = rng.integers(0, n, 200), rng.integers(0, n, 200)
  vals = rng.uniform(0.5, 1.5, 200).astype(np.float32) * 1e5
  SA = dist.shard_coo(rows, cols, vals, num_nodes=n, mesh=dist.make_mesh(1))
  x = np.full((n, 4), 1e-3, np.float16)
  X = SA.shard_rows(x)
  y = SA.unshard_rows(dist.spmm(SA, X))
  assert y.dtype == jnp.float32
  ref = np.zeros((n, 4))
  np.add.at(ref, rows, vals[:, None].astype(np.float64) * x[cols].astype(np.float64))
  np.testing.assert_allclose(np.asarray(y), ref, rtol=2e-3)
  S = dist.sddmm(SA, X, X, scale_by_values=True)
  assert S.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(S.values)))
  with pytest.raises(OperandError, match="no features"):
    dist.sparse_attention(SA, X[:, :0], X[:, :0], X)
