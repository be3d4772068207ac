"""Locality reordering (jaxsparse_tc.reorder, csrc/cpu/reorder.cc): valid and deterministic
permutations, block statistics that agree with the format, and explicit / transparent modes that
give the unreordered results (float64 references) and gradients, in the operators, the GNN
layers and the training example."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import rel_err
from jax.test_util import check_grads

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix
from jaxsparse_tc.reorder import METHODS, BlockStats, ReorderedMatrix, Reordering, block_stats

pytestmark = pytest.mark.usefixtures("on_cpu")


def random_graph(rng, n, avg_degree=4.0, symmetric=False, isolated=0.1):
  """COO of a graph with communities (dense diagonal blocks, shuffled ids), some isolated
  nodes, self-loops and duplicate entries."""
  count = int(n * avg_degree)
  block = max(2, n // 8)
  src = rng.integers(0, n, count)
  near = np.clip(src // block * block + rng.integers(0, block, count), 0, n - 1)
  far = rng.integers(0, n, count)
  dst = np.where(rng.random(count) < 0.8, near, far)
  keep = rng.random(count) >= isolated
  rows, cols = src[keep], dst[keep]
  if symmetric:
    rows, cols = np.concatenate([rows, cols]), np.concatenate([cols, rows])
  dup = rng.random(rows.size) < 0.05
  rows, cols = np.concatenate([rows, rows[dup], [0]]), np.concatenate([cols, cols[dup], [0]])
  ids = rng.permutation(n)
  return ids[rows], ids[cols]


def matrix(rng, n, heads=None, **kw):
  rows, cols = random_graph(rng, n, **kw)
  vals = rng.standard_normal(rows.size if heads is None else (heads, rows.size))
  return SparseMatrix.from_coo(rows, cols, vals.astype(np.float32), shape=(n, n))


def dense64(A):
  return np.asarray(A.todense(), np.float64)


def format_stats(A: SparseMatrix) -> tuple:
  """(windows, condensed columns, blocks, nnz) read off A's built format."""
  p = A.pattern
  return (p.window_col_ptr.shape[0] - 1, p.window_cols.shape[0], p.num_blocks, A.nnz)


# -- the permutation -------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [1, 7, 64, 301, 5000])
def test_valid_permutation(rng, method, n):
  rows, cols = random_graph(rng, n)
  r = jst.reorder((rows, cols), method, num_nodes=n)
  assert isinstance(r, Reordering) and r.method == method
  assert r.perm.dtype == np.int64 and r.perm.shape == (n,)
  np.testing.assert_array_equal(np.sort(r.perm), np.arange(n))
  np.testing.assert_array_equal(r.inverse[r.perm], np.arange(n))
  if method == "identity":
    np.testing.assert_array_equal(r.perm, np.arange(n))


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_for_a_seed_and_any_thread_count(rng, method):
  rows, cols = random_graph(rng, 40000, avg_degree=6)  # large enough for two threads
  a = jst.reorder((rows, cols), method, seed=7, threads=2)
  b = jst.reorder((rows, cols), method, seed=7, threads=2)
  c = jst.reorder((rows, cols), method, seed=7, threads=1)
  np.testing.assert_array_equal(a.perm, b.perm)
  np.testing.assert_array_equal(a.perm, c.perm)
  if method in ("affinity", "rabbit", "rcm"):  # the seed breaks ties
    d = jst.reorder((rows, cols), method, seed=8)
    assert not np.array_equal(a.perm, d.perm)


def test_graphs_without_edges():
  r = jst.reorder((np.zeros(0, np.int64), np.zeros(0, np.int64)), "affinity", num_nodes=20)
  np.testing.assert_array_equal(np.sort(r.perm), np.arange(20))
  assert r.before.blocks == r.after.blocks == 0 and r.after.nnz_per_block == 0.0
  r = jst.reorder((np.arange(9), np.arange(9)), "affinity")  # self-loops only
  np.testing.assert_array_equal(np.sort(r.perm), np.arange(9))
  r = jst.reorder((np.zeros(0, np.int64), np.zeros(0, np.int64)), "rcm", num_nodes=0)
  assert r.perm.shape == (0,)


def test_inputs_accepted_and_refused(rng):
  rows, cols = random_graph(rng, 200, symmetric=True)
  A = SparseMatrix.from_coo(rows, cols, shape=(200, 200))
  ref = jst.reorder(A, "affinity").perm
  coo = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(200, 200))
  np.testing.assert_array_equal(jst.reorder(coo, "affinity").perm, ref)
  np.testing.assert_array_equal(jst.reorder(coo.tocsr(), "affinity").perm, ref)
  ei = np.stack([cols, rows])  # edge_index: rows of the message-passing matrix are targets
  np.testing.assert_array_equal(jst.reorder(ei, "affinity", num_nodes=200).perm, ref)
  with pytest.raises(ValueError, match="method"):
    jst.reorder(A, "metis")
  with pytest.raises(ValueError, match="square"):
    jst.reorder(SparseMatrix.from_coo([0, 1], [0, 5], shape=(2, 6)))
  with pytest.raises(ValueError, match="out of range"):
    jst.reorder((np.array([0, 3]), np.array([1, 2])), num_nodes=3)
  with pytest.raises(ValueError, match="seed"):
    jst.reorder(A, seed=-1)
  with pytest.raises(TypeError):
    jst.reorder("graph")


# -- block statistics ------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["affinity", "rcm"])
def test_stats_agree_with_the_format(rng, method):
  A = matrix(rng, 1003)
  r = jst.reorder(A, method)
  for stats, M in (
    (r.before, A),
    (r.after, r.permute_matrix(A)),
    (r.before_t, A.T),
    (r.after_t, r.permute_matrix(A).T),
  ):
    assert isinstance(stats, BlockStats)
    assert (stats.windows, stats.condensed_cols, stats.blocks, stats.nnz) == format_stats(M)
    hist = stats.block_nnz_hist
    assert hist.shape == (65,) and hist[0] == 0 and hist.sum() == stats.blocks
    assert (np.arange(65) * hist).sum() == stats.nnz
    # The histogram is the format's: popcounts of the block bitmaps.
    bits = np.asarray(M.pattern.block_bitmap).astype(np.uint64)
    pop = np.array([bin(int(lo) | (int(hi) << 32)).count("1") for lo, hi in bits])
    np.testing.assert_array_equal(np.bincount(pop, minlength=65), hist)
  assert r.after.nnz == r.before.nnz
  np.testing.assert_allclose(r.after.fill * 64, r.after.nnz_per_block)
  assert str(r.after) and repr(r)
  direct = block_stats(A, r.perm)
  assert direct.blocks == r.after.blocks and direct.condensed_cols == r.after.condensed_cols


def test_affinity_packs_blocks_on_real_graphs(cora):
  A = SparseMatrix.from_scipy(cora)
  results = {m: jst.reorder(A, m) for m in ("affinity", "rabbit", "rcm")}
  before = results["affinity"].before
  assert results["affinity"].after.nnz_per_block > 1.3 * before.nnz_per_block
  assert results["affinity"].after.cols_per_window < 0.75 * before.cols_per_window
  for r in results.values():  # every locality order beats Cora's own
    assert r.after.blocks < before.blocks


# -- explicit mode ---------------------------------------------------------------------------
def test_explicit_mode_equals_unreordered(rng, x64):
  n, d = 500, 9
  A = matrix(rng, n, symmetric=True)
  A = A.with_values(A.values.astype(jnp.float64))
  r = jst.reorder(A, "affinity")
  B = r.permute_matrix(A)
  assert type(B) is SparseMatrix and B.nnz == A.nnz
  a = dense64(A)
  np.testing.assert_array_equal(dense64(B), a[r.perm][:, r.perm])
  x = jnp.asarray(rng.standard_normal((n, d)))
  y = jnp.asarray(rng.standard_normal((n, d)))
  # SpMM, chained twice in the reordered space, mapped back once.
  out = r.restore(B @ (B @ r.permute(x)))
  assert rel_err(out, a @ (a @ np.asarray(x))) < 1e-12
  # SDDMM: per-edge values, compared entry by entry.
  S = jst.sddmm(B, r.permute(x), r.permute(y))
  ref = (np.asarray(x) @ np.asarray(y).T)[r.perm[np.asarray(B.rows)], r.perm[np.asarray(B.cols)]]
  assert rel_err(S.values, ref) < 1e-12
  # Values travel with their entries: input order is kept.
  np.testing.assert_array_equal(np.asarray(B.values_to_input()), np.asarray(A.values_to_input()))
  np.testing.assert_array_equal(np.asarray(r.permute(x, axis=0)), np.asarray(x)[r.perm])
  np.testing.assert_array_equal(np.asarray(r.restore(r.permute(x))), np.asarray(x))


def test_explicit_softmax_and_attention(rng):
  n, d, h = 300, 8, 2
  A = matrix(rng, n, symmetric=True)
  r = jst.reorder(A, "rabbit")
  B = r.permute_matrix(A)
  q, k, v = (jnp.asarray(rng.standard_normal((h, n, d)), jnp.float32) for _ in range(3))
  out = r.restore(
    jst.sparse_attention(B, r.permute(q, axis=1), r.permute(k, axis=1), r.permute(v, axis=1)),
    axis=1,
  )
  ref = jst.sparse_attention(A, q, k, v)
  assert rel_err(out, ref) < 1e-5
  # Row softmax of the same logits: compare densely in the caller's order.
  logits = jst.sddmm(A, q, k)
  Sa = jst.edge_softmax(logits)
  Sb = jst.edge_softmax(jst.sddmm(B, r.permute(q, axis=1), r.permute(k, axis=1)))
  inv = r.inverse
  assert rel_err(np.asarray(Sb.todense())[:, inv][:, :, inv], Sa.todense()) < 1e-6


def test_edge_index_and_dataset_helpers(rng):
  from jaxsparse_tc.datasets import load_cora
  from jaxsparse_tc.nn import graph

  ds = load_cora()
  A = graph.gcn_norm(ds.edge_index, ds.num_nodes)
  r = jst.reorder(ds.edge_index, "affinity", num_nodes=ds.num_nodes)
  # Renaming the edges and building from them gives the permuted matrix.
  B1 = graph.gcn_norm(r.permute_edge_index(ds.edge_index), ds.num_nodes)
  B2 = r.permute_matrix(A)
  np.testing.assert_allclose(np.asarray(B1.todense()), np.asarray(B2.todense()), rtol=1e-6)
  dp = r.permute_dataset(ds)
  np.testing.assert_array_equal(dp.features, ds.features[r.perm])
  np.testing.assert_array_equal(dp.labels[dp.train_idx], ds.labels[ds.train_idx])
  np.testing.assert_array_equal(dp.features[dp.test_idx], ds.features[ds.test_idx])
  np.testing.assert_array_equal(dp.adjacency.toarray(), ds.adjacency.toarray()[r.perm][:, r.perm])
  assert dp.train_idx.dtype == ds.train_idx.dtype


# -- transparent mode ------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["affinity", "rcm"])
def test_transparent_spmm_sddmm_equal_unreordered(rng, x64, method):
  n, d = 700, 5
  A = matrix(rng, n)  # directed: A and A^T differ
  A = A.with_values(A.values.astype(jnp.float64))
  R = jst.reorder(A, method).wrap(A)
  assert isinstance(R, ReorderedMatrix) and isinstance(R, SparseMatrix)
  a = dense64(A)
  np.testing.assert_array_equal(dense64(R), a)  # todense / rows / cols: the caller's order
  np.testing.assert_array_equal(R.to_scipy().toarray(), a)
  x = jnp.asarray(rng.standard_normal((n, d)))
  y = jnp.asarray(rng.standard_normal((n, d)))
  for out in (R @ x, jst.spmm(R, x)):
    assert rel_err(out, a @ np.asarray(x)) < 1e-12
  assert rel_err(R.T @ x, a.T @ np.asarray(x)) < 1e-12
  assert rel_err(x.T @ R, np.asarray(x).T @ a) < 1e-12  # __rmatmul__ through R.T
  xh = jnp.stack([x, 2 * x])  # heads
  assert rel_err(jst.spmm(R, xh), np.stack([a @ np.asarray(x), 2 * a @ np.asarray(x)])) < 1e-12
  S = jst.sddmm(R, x, y)
  assert isinstance(S, ReorderedMatrix)
  full = np.asarray(x) @ np.asarray(y).T
  assert rel_err(S.values, full[np.asarray(S.rows), np.asarray(S.cols)]) < 1e-12
  assert rel_err(S.todense(), np.where(a != 0, full, 0)) < 1e-12
  Ss = jst.sddmm(R, x, y, scale_by_values=True)
  assert rel_err(Ss.todense(), a * full) < 1e-12


def test_transparent_softmax_attention_equal_unreordered(rng):
  n, d, h = 400, 8, 3
  A = matrix(rng, n, symmetric=True)
  R = jst.ReorderedMatrix.from_matrix(A, "affinity")
  q, k, v = (jnp.asarray(rng.standard_normal((h, n, d)), jnp.float32) for _ in range(3))
  assert rel_err(jst.sparse_attention(R, q, k, v), jst.sparse_attention(A, q, k, v)) < 1e-5
  # A per-edge bias in each matrix's own format order: the same edges get the same bias.
  w = rng.standard_normal((n, n)).astype(np.float32)
  bias_a = jnp.asarray(w[np.asarray(A.rows), np.asarray(A.cols)])
  bias_r = jnp.asarray(w[np.asarray(R.rows), np.asarray(R.cols)])
  assert (
    rel_err(
      jst.sparse_attention(R, q, k, v, bias=bias_r), jst.sparse_attention(A, q, k, v, bias=bias_a)
    )
    < 1e-5
  )
  Pa = jst.edge_softmax(jst.sddmm(A, q, k))
  Pr = jst.edge_softmax(jst.sddmm(R, q, k))
  assert isinstance(Pr, ReorderedMatrix)
  assert rel_err(Pr.todense(), Pa.todense()) < 1e-6


def test_transparent_from_coo_keeps_input_order(rng):
  n = 600
  rows, cols = random_graph(rng, n, symmetric=True)
  vals = rng.standard_normal(rows.size).astype(np.float32)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=(n, n))
  R = ReorderedMatrix.from_coo(rows, cols, vals, shape=(n, n), method="affinity")
  assert R.pattern.num_blocks < A.pattern.num_blocks  # stored reordered
  np.testing.assert_allclose(np.asarray(R.todense()), np.asarray(A.todense()), rtol=1e-6)
  new = rng.standard_normal(rows.size).astype(np.float32)
  np.testing.assert_allclose(
    np.asarray(R.with_values(R.values_from_input(new)).todense()),
    np.asarray(A.with_values(A.values_from_input(new)).todense()),
    rtol=1e-6,
    atol=1e-6,
  )
  W = jst.reorder(A, "affinity").wrap(A)  # wrapping a built matrix keeps its input map too
  np.testing.assert_allclose(np.asarray(W.values_to_input()), np.asarray(A.values_to_input()))
  # The inherited constructors build reordered too.
  E = ReorderedMatrix.from_edge_index(np.stack([cols, rows]), n)
  assert isinstance(E, ReorderedMatrix)
  assert (
    rel_err(E.todense(), SparseMatrix.from_edge_index(np.stack([cols, rows]), n).todense()) == 0
  )


def test_transparent_is_a_pytree_for_jit_and_vmap(rng):
  n, d = 300, 4
  A = matrix(rng, n)
  R = jst.reorder(A, "affinity").wrap(A)
  x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
  leaves, tree = jax.tree_util.tree_flatten(R)
  R2 = jax.tree_util.tree_unflatten(tree, leaves)
  assert isinstance(R2, ReorderedMatrix)
  f = jax.jit(lambda M, x: M @ x)
  np.testing.assert_allclose(np.asarray(f(R, x)), np.asarray(A @ x), rtol=1e-5, atol=1e-5)
  xb = jnp.stack([x, -x, 3 * x])
  out = jax.vmap(lambda x: R @ x)(xb)
  np.testing.assert_allclose(
    np.asarray(out), np.asarray(jnp.stack([A @ v for v in xb])), rtol=1e-5, atol=1e-5
  )
  # Arithmetic on values keeps the wrapper.
  assert isinstance(2 * R, ReorderedMatrix) and isinstance(R + R, ReorderedMatrix)
  np.testing.assert_allclose(np.asarray((R + R) @ x), np.asarray(2 * (A @ x)), rtol=1e-5, atol=1e-5)


# -- gradients -------------------------------------------------------------------------------
def test_gradients_transparent_check_grads(rng, x64):
  n, d = 120, 3
  A = matrix(rng, n)
  R = jst.reorder(A, "affinity").wrap(A)
  R = R.with_values(R.values.astype(jnp.float64))
  x = jnp.asarray(rng.standard_normal((n, d)))
  y = jnp.asarray(rng.standard_normal((n, d)))
  check_grads(
    lambda v, x: jst.spmm(R.with_values(v), x), (R.values, x), order=1, modes=("fwd", "rev")
  )
  check_grads(lambda x, y: jst.sddmm(R, x, y).values, (x, y), order=1, modes=("fwd", "rev"))


def test_gradients_equal_unreordered(rng):
  n, d, h = 250, 8, 2
  A = matrix(rng, n, symmetric=True)
  r = jst.reorder(A, "affinity")
  R = r.wrap(A)
  B = r.permute_matrix(A)
  x, q, k, v = (jnp.asarray(rng.standard_normal((h, n, d)), jnp.float32) for _ in range(4))

  def loss(M, x, q, k, v, perm=None):
    if perm is not None:  # explicit mode: permute in, restore out
      x, q, k, v = (r.permute(a, axis=1) for a in (x, q, k, v))
    P = jst.edge_softmax(jst.sddmm(M, q, k))
    out = jst.spmm(P, v) + jst.sparse_attention(M, q, k, x) + jst.spmm(M, x)
    if perm is not None:
      out = r.restore(out, axis=1)
    return jnp.sum(jnp.sin(out))

  args = (x, q, k, v)
  ref = jax.grad(lambda *a: loss(A, *a), argnums=(0, 1, 2, 3))(*args)
  got_t = jax.grad(lambda *a: loss(R, *a), argnums=(0, 1, 2, 3))(*args)
  got_e = jax.grad(lambda *a: loss(B, *a, perm=True), argnums=(0, 1, 2, 3))(*args)
  for g0, gt, ge in zip(ref, got_t, got_e):
    assert rel_err(gt, g0) < 1e-5 and rel_err(ge, g0) < 1e-5
  # Gradient wrt the values: per edge, compared in the caller's (dense) layout.
  gva = jax.grad(lambda val: jnp.sum(jnp.sin(jst.spmm(A.with_values(val), x[0]))))(A.values)
  gvr = jax.grad(lambda val: jnp.sum(jnp.sin(jst.spmm(R.with_values(val), x[0]))))(R.values)
  assert rel_err(R.with_values(gvr).todense(), A.with_values(gva).todense()) < 1e-5


# -- GNN layers and the training example -------------------------------------------------------
def test_layers_accept_a_reordered_matrix(rng):
  from jaxsparse_tc.datasets import load_cora
  from jaxsparse_tc.nn import functional as F
  from jaxsparse_tc.nn import graph

  ds = load_cora(normalize_features=True)
  x = jnp.asarray(ds.features[:, :64])
  G = graph.gcn_norm(ds.edge_index, ds.num_nodes)
  M = graph.message_passing_matrix(ds.edge_index, ds.num_nodes, self_loops=True)
  Gr, Mr = (jst.reorder(X, "affinity").wrap(X) for X in (G, M))
  w = jnp.asarray(rng.standard_normal((64, 16)) * 0.1, jnp.float32)
  att = jnp.asarray(rng.standard_normal((4, 4)), jnp.float32)
  close = lambda a, b: rel_err(a, b) < 1e-5  # noqa: E731
  assert close(F.gcn_conv(Gr, x, w), F.gcn_conv(G, x, w))
  assert close(F.gat_conv(Mr, x, w, att, att, heads=4), F.gat_conv(M, x, w, att, att, heads=4))
  assert close(F.agnn_conv(Mr, x, 1.5), F.agnn_conv(M, x, 1.5))
  lin = (w, None)
  assert close(
    F.transformer_conv(Mr, x, lin, lin, lin, heads=4),
    F.transformer_conv(M, x, lin, lin, lin, heads=4),
  )
  assert close(graph.normalize_symmetric(Mr).todense(), graph.normalize_symmetric(M).todense())


@pytest.mark.parametrize("mode", ["transparent", "explicit"])
def test_train_with_reorder(mode):
  from jaxsparse_tc.examples.train import train

  base = train("gcn", "flax", seed=0, epochs=6, verbose=False)
  got = train("gcn", "flax", seed=0, epochs=6, verbose=False, reorder="affinity", reorder_mode=mode)
  if mode == "transparent":  # the same computation (dropout masks too), summed in another order
    np.testing.assert_allclose(got["loss_history"], base["loss_history"], rtol=1e-4)
  else:  # dropout draws land on other nodes: same model, other randomness
    assert np.all(np.isfinite(got["loss_history"]))
    assert got["loss_history"][-1] < got["loss_history"][0]
