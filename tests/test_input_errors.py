"""Bad inputs get a clear error or the correct result, never a silently wrong one.

Dtype promotion of spmm / sddmm(scale_by_values) (as jnp.matmul: nothing is rounded to the
narrower operand's dtype), what the layers do with it, and the checks of graph batching,
reordering, the graph helpers, BCOO conversion and the dataset loaders.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import random_coo, rel_err

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix
from jaxsparse_tc._src.checks import OperandError
from jaxsparse_tc.nn import functional as F
from jaxsparse_tc.nn import graph
from jaxsparse_tc.nn.batch import (
  Budget,
  Graph,
  GraphLoader,
  batch_graphs,
  masked_mean,
  unbatch_nodes,
)
from jaxsparse_tc.nn.pool import global_add_pool, global_mean_pool
from jaxsparse_tc.reorder import block_stats

pytestmark = pytest.mark.usefixtures("on_cpu")

FLOATS = [jnp.float32, jnp.float16, jnp.bfloat16]
# Relative error of a result rounded to its dtype (float32 accumulation throughout).
TOL = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.float16): 1e-2, jnp.dtype(jnp.bfloat16): 2e-2}


def _matrix(rng, m, n, scale=1.0):
  rows, cols, _ = random_coo(rng, m, n, 0.3)
  rows, cols = np.append(rows, m - 1), np.append(cols, n - 1)  # never empty
  vals = scale * rng.uniform(0.5, 1.5, rows.size) * rng.choice([-1, 1], rows.size)
  return SparseMatrix.from_coo(rows, cols, vals.astype(np.float32), shape=(m, n))


def _dense64(A):
  return np.asarray(A.todense().astype(jnp.float32), np.float64)


# -- 1. spmm / sddmm compute in the promoted dtype -------------------------------------------------


def test_large_values_times_small_float16_features_do_not_overflow(rng):
  """Values of 1e5 times float16 features of 1e-3: about 100 per term. Casting the values to
  float16 (65504 at most) gave inf; the product runs in float32."""
  A = _matrix(rng, 30, 20, scale=1e5)
  x = jnp.asarray(1e-3 * rng.uniform(0.5, 1.5, (20, 8)), jnp.float16)
  ref = _dense64(A) @ np.asarray(x, np.float64)
  for out in (jst.spmm(A, x), A @ x):
    assert out.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out)))
    assert rel_err(out, ref) < 1e-5
  xt = jnp.asarray(1e-3 * rng.uniform(0.5, 1.5, (8, 30)), jnp.float16)  # x @ A: [8, 30] @ [30, 20]
  out = xt @ A
  assert out.dtype == jnp.float32
  assert rel_err(out, np.asarray(xt, np.float64) @ _dense64(A)) < 1e-5


@pytest.mark.parametrize("vdt,xdt", list(itertools.product(FLOATS, FLOATS)))
def test_spmm_promotes_and_keeps_each_operands_gradient_dtype(rng, vdt, xdt):
  promoted = jnp.result_type(vdt, xdt)
  A = _matrix(rng, 24, 17).astype(vdt)
  x = jnp.asarray(rng.standard_normal((17, 5)), xdt)
  a64, x64 = _dense64(A), np.asarray(x.astype(jnp.float32), np.float64)
  for out, ref in ((jst.spmm(A, x), a64 @ x64), (A @ x, a64 @ x64)):
    assert out.dtype == promoted
    assert rel_err(out, ref) < TOL[promoted]
  xl = jnp.asarray(rng.standard_normal((6, 24)), xdt)
  out = xl @ A
  assert out.dtype == promoted
  assert rel_err(out, np.asarray(xl.astype(jnp.float32), np.float64) @ a64) < TOL[promoted]

  w = rng.standard_normal((24, 5))

  def loss(v, x):
    return jnp.sum(jst.spmm(A.with_values(v), x).astype(jnp.float32) * w)

  dv, dx = jax.grad(loss, argnums=(0, 1))(A.values, x)
  assert dv.dtype == jnp.dtype(vdt) and dx.dtype == jnp.dtype(xdt)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  dv_ref = np.einsum("ed,ed->e", w[r], x64[c])  # d/dA[r, c] of sum(w * (A x))
  tol = max(TOL[promoted], TOL[jnp.dtype(vdt)], TOL[jnp.dtype(xdt)])
  assert rel_err(dv, dv_ref) < tol
  assert rel_err(dx, a64.T @ w) < tol


@pytest.mark.parametrize("vdt,xdt", list(itertools.product(FLOATS, FLOATS)))
def test_sddmm_scale_by_values_promotes(rng, vdt, xdt):
  promoted = jnp.result_type(vdt, xdt)
  A = _matrix(rng, 19, 23).astype(vdt)
  x = jnp.asarray(rng.standard_normal((19, 6)), xdt)
  y = jnp.asarray(rng.standard_normal((23, 6)), xdt)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  x64, y64 = (np.asarray(a.astype(jnp.float32), np.float64) for a in (x, y))
  v64 = np.asarray(A.values.astype(jnp.float32), np.float64)
  S = jst.sddmm(A, x, y, scale_by_values=True)
  assert S.values.dtype == promoted
  prod = np.einsum("ed,ed->e", x64[r], y64[c])
  assert rel_err(S.values, prod * v64) < TOL[promoted]
  plain = jst.sddmm(A, x, y)  # without the scaling A's values play no part
  assert plain.values.dtype == jnp.dtype(xdt)

  w = rng.standard_normal(A.nnz)

  def loss(v, x, y):
    s = jst.sddmm(A.with_values(v), x, y, scale_by_values=True).values
    return jnp.sum(s.astype(jnp.float32) * w)

  dv, dx, dy = jax.grad(loss, argnums=(0, 1, 2))(A.values, x, y)
  assert (dv.dtype, dx.dtype, dy.dtype) == (jnp.dtype(vdt), jnp.dtype(xdt), jnp.dtype(xdt))
  tol = max(TOL[promoted], TOL[jnp.dtype(vdt)], TOL[jnp.dtype(xdt)])
  assert rel_err(dv, w * prod) < tol
  g = sp.csr_matrix((w * v64, (r, c)), shape=A.shape)
  assert rel_err(dx, g @ y64) < tol
  assert rel_err(dy, g.T @ x64) < tol


def test_sddmm_scaled_by_float32_values_keeps_the_unrounded_product(rng):
  """float16 rows whose dot products pass float16's range, scaled by small float32 values: the
  product is not rounded to float16 on the way (it would be inf)."""
  A = _matrix(rng, 16, 16, scale=1e-3)
  x = jnp.asarray(rng.uniform(100, 200, (16, 64)), jnp.float16)  # dots ~ 64 * 150^2 > 65504
  S = jst.sddmm(A, x, x, scale_by_values=True)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  x64 = np.asarray(x, np.float64)
  ref = np.einsum("ed,ed->e", x64[r], x64[c]) * np.asarray(A.values, np.float64)
  assert S.values.dtype == jnp.float32
  assert np.all(np.isfinite(np.asarray(S.values)))
  assert rel_err(S.values, ref) < 1e-5


def test_sddmm_scale_by_values_with_other_heads_names_both_shapes(rng):
  A = _matrix(rng, 10, 12)
  A3 = A.with_values(jnp.asarray(rng.standard_normal((3, A.nnz)), jnp.float32))
  x = jnp.asarray(rng.standard_normal((2, 10, 4)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((2, 12, 4)), jnp.float32)
  with pytest.raises(OperandError, match=r"\(2, 10, 4\).*\(2, 12, 4\).*\(3, \d+\)"):
    jst.sddmm(A3, x, y, scale_by_values=True)
  # Values with heads scale 2-D products, and equal head counts pair up.
  out = jst.sddmm(A3, x[0], y[0], scale_by_values=True).values
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  ref = np.einsum("ed,ed->e", np.asarray(x[0])[r], np.asarray(y[0])[c])
  assert rel_err(out, ref[None] * np.asarray(A3.values)) < 1e-5


# -- what the layers do with the promotion --------------------------------------------------------


def test_layers_compute_in_the_features_dtype(rng):
  """GCN/SAGE/GIN cast A's (float32) values to the features' dtype: a float16 model stays
  float16 and runs the 16-bit kernels."""
  n, f = 40, 8
  ei = rng.integers(0, n, (2, 160))
  A = graph.gcn_norm(ei, n)
  M = graph.message_passing_matrix(ei, n)
  x = jnp.asarray(rng.standard_normal((n, f)), jnp.float16)
  k = jnp.asarray(rng.standard_normal((f, f)) / np.sqrt(f), jnp.float16)
  x64, k64 = np.asarray(x, np.float64), np.asarray(k, np.float64)
  a64 = _dense64(A.astype(jnp.float16))
  m64 = _dense64(M)
  out = F.gcn_conv(A, x, k)
  assert out.dtype == jnp.float16
  assert rel_err(out, a64 @ x64 @ k64) < 2e-2
  out = F.gin_conv(M, x, lambda h: h)
  assert out.dtype == jnp.float16
  assert rel_err(out, x64 + m64 @ x64) < 1e-2
  out = F.sage_conv(M, x, k, aggr="add")
  assert out.dtype == jnp.float16
  assert rel_err(out, m64 @ x64 @ k64) < 2e-2


def test_layers_refuse_values_past_the_features_range(rng):
  n = 20
  ei = rng.integers(0, n, (2, 60))
  M = graph.message_passing_matrix(ei, n, edge_weight=rng.uniform(1e5, 2e5, 60))
  x = jnp.asarray(rng.standard_normal((n, 4)), jnp.float16)
  with pytest.raises(ValueError, match="exceed float16's largest finite value"):
    F.gin_conv(M, x, lambda h: h)
  # Integer features are not cast to: spmm names them.
  with pytest.raises(OperandError, match=r"X \(shape \(20, 4\)\) has dtype int32"):
    F.gin_conv(M, jnp.ones((n, 4), jnp.int32), lambda h: h)


def test_host_checks_read_closed_over_arrays_under_jit(rng):
  """A matrix or index array closed over by a jitted function is concrete: the host-side checks
  read it with numpy (jnp on it inside the trace would give a tracer and fail)."""
  n = 20
  ei = rng.integers(0, n, (2, 60))
  M = graph.message_passing_matrix(ei, n, edge_weight=rng.uniform(0.5, 1.5, 60))
  x = jnp.asarray(rng.standard_normal((n, 4)), jnp.float16)
  got = jax.jit(lambda x: F.gin_conv(M, x, lambda h: h))(x)
  np.testing.assert_allclose(
    np.asarray(got, np.float32), np.asarray(F.gin_conv(M, x, lambda h: h), np.float32)
  )
  big = M.with_values(M.values * 1e5)
  with pytest.raises(ValueError, match="exceed float16's largest finite value"):
    jax.jit(lambda x: F.gin_conv(big, x, lambda h: h))(x)
  index = jnp.asarray(ei[1])
  np.testing.assert_array_equal(
    np.asarray(jax.jit(lambda: graph.degree(index))()), np.bincount(ei[1], minlength=0)
  )
  with pytest.raises(ValueError, match="outside"):
    jax.jit(lambda: graph.degree(index, num_nodes=int(ei[1].max())))()


def test_layers_refuse_matrices_with_several_value_sets(rng):
  n = 16
  A = graph.gcn_norm(rng.integers(0, n, (2, 40)), n)
  A2 = A.with_values(jnp.stack([A.values, A.values]))
  x = jnp.asarray(rng.standard_normal((n, 4)), jnp.float32)
  with pytest.raises(ValueError, match=r"GCNConv: A's values have shape \(2, \d+\)"):
    F.gcn_conv(A2, x, jnp.ones((4, 3)))
  with pytest.raises(ValueError, match=r"GINConv: A's values have shape \(2, \d+\)"):
    F.gin_conv(A2, x, lambda h: h)


def test_attention_layers_check_heads_against_the_weights(rng):
  n = 12
  A = graph.message_passing_matrix(rng.integers(0, n, (2, 30)), n, add_self_loops=True)
  x = jnp.asarray(rng.standard_normal((n, 4)), jnp.float32)
  with pytest.raises(ValueError, match="7 output features, not a multiple of heads=2"):
    F.gat_conv(A, x, jnp.ones((4, 7)), jnp.ones((2, 3)), jnp.ones((2, 3)), heads=2)
  with pytest.raises(ValueError, match=r"att_src must have shape \[heads, channels\] = \[2, 4\]"):
    F.gat_conv(A, x, jnp.ones((4, 8)), jnp.ones((4, 2)), jnp.ones((2, 4)), heads=2)


# -- 2. graph batching --------------------------------------------------------------------------


def _graph(rng, n=5, e=9, **kw):
  return Graph(rng.integers(0, n, (2, e)), n, **kw)


def test_graph_refuses_node_features_of_another_node_count(rng):
  ei = rng.integers(0, 3, (2, 4))
  with pytest.raises(
    ValueError, match=r"Graph: x must have shape \[num_nodes=3, \.\.\.\].*\(2, 8\)"
  ):
    Graph(ei, 3, x=rng.normal(size=(2, 8)))
  with pytest.raises(ValueError, match=r"x must have shape \[num_nodes=3"):
    Graph(ei, 3, x=rng.normal(size=(4, 8)))


def test_graph_refuses_edge_features_of_another_edge_count(rng):
  ei = rng.integers(0, 3, (2, 4))
  with pytest.raises(ValueError, match=r"edge_attr must have shape \[E=4, \.\.\.\].*\(3, 2\)"):
    Graph(ei, 3, edge_attr=rng.normal(size=(3, 2)))


def test_graph_refuses_float_edge_index_even_when_integral(rng):
  ei = rng.integers(0, 3, (2, 4))
  for bad in (ei.astype(np.float64), ei + 0.5, ei.astype(np.float32)):
    with pytest.raises(ValueError, match="edge_index must have an integer dtype.*float"):
      Graph(bad, 3)
  assert Graph(np.zeros((2, 0)), 3).edge_index.dtype == np.int64  # no ids: nothing to misread


@pytest.mark.parametrize("bad", [-1, 3, 7])
def test_graph_refuses_node_ids_out_of_range(rng, bad):
  ei = rng.integers(0, 3, (2, 5))
  ei[int(rng.integers(0, 2)), int(rng.integers(0, 5))] = bad
  with pytest.raises(ValueError, match=r"node ids in \[-?\d+, \d+\], outside \[0, num_nodes=3\)"):
    Graph(ei, 3)


def test_graph_checks_its_other_fields(rng):
  ei = rng.integers(0, 3, (2, 4))
  with pytest.raises(ValueError, match=r"edge_index must have shape \[2, E\]; got shape \(3, 4\)"):
    Graph(rng.integers(0, 3, (3, 4)), 3)
  for n in (2.0, -1, True, "3"):
    with pytest.raises(ValueError, match="num_nodes must be a non-negative integer"):
      Graph(ei, n)
  with pytest.raises(ValueError, match="y must hold numbers.*dtype <U"):
    Graph(ei, 3, y="cat")
  with pytest.raises(ValueError, match="x must hold numbers.*complex"):
    Graph(ei, 3, x=np.ones((3, 2), np.complex64))
  g = Graph(ei, 3, x=np.ones((3, 2)))
  with pytest.raises(ValueError, match=r"x must have shape \[num_nodes=3"):
    g._replace(x=np.ones((5, 2)))
  assert g._replace(y=1).y == 1 and isinstance(g._replace(y=1), Graph)


def test_batching_keeps_every_graphs_features_on_its_nodes(rng):
  """The old failure: a graph with too few feature rows shifted every later graph's features.
  Valid graphs come out with each node's own row (checked against the per-graph arrays)."""
  graphs = [_graph(rng, n, 2 * n, x=rng.normal(size=(n, 3)).astype(np.float32)) for n in (3, 5, 4)]
  batch = batch_graphs(graphs, Budget.for_dataset(graphs, 3))
  for g, xs in zip(graphs, unbatch_nodes(batch.x, batch)):
    np.testing.assert_array_equal(xs, g.x)


class _Record:
  """A PyG-like record with Graph's fields that was never checked."""

  def __init__(self, edge_index, num_nodes, x=None, edge_attr=None, y=None):
    self.edge_index, self.num_nodes, self.x, self.edge_attr, self.y = (
      edge_index,
      num_nodes,
      x,
      edge_attr,
      y,
    )


def test_dataset_functions_check_unchecked_records(rng):
  good = [_graph(rng) for _ in range(3)]
  bad_ei = np.array([[0, 1, 5], [1, 2, 0]])
  bad = good + [_Record(bad_ei, 4)]
  with pytest.raises(
    ValueError, match=r"Budget.for_dataset: graphs\[3\]: edge_index holds node ids in \[0, 5\]"
  ):
    Budget.for_dataset(bad, 2)
  with pytest.raises(ValueError, match=r"graphs\[3\]: edge_index must have an integer dtype"):
    Budget.for_dataset(good + [_Record(bad_ei.astype(float), 6)], 2)
  budget = Budget.for_dataset(good, 2)
  with pytest.raises(ValueError, match=r"GraphLoader: graphs\[3\]: edge_index holds node ids"):
    GraphLoader(bad, budget, 2)
  with pytest.raises(ValueError, match=r"batch_graphs: graphs\[1\]: x must have shape"):
    batch_graphs([good[0], _Record(good[1].edge_index, 5, x=np.ones((4, 2)))], budget)
  # Checked records batch as Graphs do.
  rec = [_Record(g.edge_index, g.num_nodes) for g in good[:2]]
  assert batch_graphs(rec, budget).A.shape == batch_graphs(good[:2], budget).A.shape


def test_budget_and_loader_arguments(rng):
  graphs = [_graph(rng) for _ in range(4)]
  for bs in (0, 2.0, True):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
      Budget.for_dataset(graphs, bs)
  with pytest.raises(ValueError, match="slack must be a finite number >= 0"):
    Budget.for_dataset(graphs, 2, slack=float("nan"))
  with pytest.raises(ValueError, match="max_degree must be None or an integer >= 0"):
    Budget(nodes=8, edges=8, graphs=2, max_degree=-3)
  budget = Budget.for_dataset(graphs, 2)
  with pytest.raises(TypeError, match="budget must be a Budget"):
    GraphLoader(graphs, {"nodes": 8}, 2)
  with pytest.raises(ValueError, match=r"batch_size must be in \[1, budget.graphs=2\]; got 3"):
    GraphLoader(graphs, budget, 3)
  with pytest.raises(ValueError, match="batch_size must be a positive integer; got 1.5"):
    GraphLoader(graphs, budget, 1.5)
  with pytest.raises(ValueError, match="seed must be a non-negative integer; got -1"):
    GraphLoader(graphs, budget, 2, seed=-1)
  with pytest.raises(ValueError, match="prefetch must be an integer >= 0; got -2"):
    GraphLoader(graphs, budget, 2, prefetch=-2)
  with pytest.raises(TypeError, match="sequence of graphs; got a single Graph"):
    GraphLoader(graphs[0], budget, 2)


def test_batch_refuses_graph_labels_of_different_shapes(rng):
  a = _graph(rng, 4, y=np.array([1, 0]))
  b = _graph(rng, 5, y=np.array([1, 0, 1]))
  with pytest.raises(ValueError, match=r"graph 1 \(3,\) \(5 nodes\)"):
    batch_graphs([a, b], Budget.for_dataset([a, b], 2))


def test_pooling_and_batch_helpers_check_shapes(rng):
  graphs = [_graph(rng, x=rng.normal(size=(5, 3)).astype(np.float32)) for _ in range(2)]
  batch = batch_graphs(graphs, Budget.for_dataset(graphs, 2))
  h = jnp.ones((batch.num_nodes - 1, 3))
  with pytest.raises(ValueError, match=r"graph_index must have shape \[\d+\] \(the batch's node"):
    global_add_pool(h, batch)
  with pytest.raises(ValueError, match="num_graphs must be a static non-negative integer"):
    global_mean_pool(jnp.ones((4, 2)), jnp.zeros(4, jnp.int32), 2.5)
  with pytest.raises(ValueError, match=r"x must hold node features \[num_nodes, \.\.\.\]"):
    global_add_pool(jnp.ones(()), jnp.zeros(1, jnp.int32), 1)
  with pytest.raises(ValueError, match="unbatch_nodes: values must have shape"):
    unbatch_nodes(np.ones((3, 2)), batch)
  with pytest.raises(ValueError, match=r"masked_mean: mask must have shape \[k\]"):
    masked_mean(jnp.ones((4, 2)), jnp.ones((1,), bool))
  out = global_mean_pool(batch.x, batch)  # the right shapes: each graph's mean
  for g, row in zip(graphs, np.asarray(out)):
    np.testing.assert_allclose(row, np.mean(g.x, axis=0), rtol=1e-6)


# -- 3. reordering -------------------------------------------------------------------------------


def test_reorder_threads(rng):
  ei = rng.integers(0, 60, (2, 300))
  base = jst.reorder(ei, "affinity", seed=3)
  huge = jst.reorder(ei, "affinity", seed=3, threads=10**12)  # used as 2, the most it uses
  np.testing.assert_array_equal(huge.perm, base.perm)
  for bad, what in (
    (0, "integer >= 1; got 0"),
    (-4, "integer >= 1; got -4"),
    (2.0, "integer; got 2.0"),
    (True, "integer; got True"),
  ):
    with pytest.raises(ValueError, match=f"threads must be an {what}"):
      jst.reorder(ei, "affinity", threads=bad)


def test_reorder_other_arguments(rng):
  ei = rng.integers(0, 30, (2, 100))
  with pytest.raises(ValueError, match="method must be one of .*'affinity'.*got 'afinity'"):
    jst.reorder(ei, "afinity")
  with pytest.raises(ValueError, match=r"lookahead must be an integer in \[1, 2147483647\]"):
    jst.reorder(ei, lookahead=2**40)
  with pytest.raises(ValueError, match="seed must be an integer >= 0; got -1"):
    jst.reorder(ei, seed=-1)
  with pytest.raises(ValueError, match="num_nodes must be an integer; got 30.5"):
    jst.reorder(ei, num_nodes=30.5)
  with pytest.raises(ValueError, match="edge_index must have an integer dtype"):
    jst.reorder(ei.astype(np.float64))
  A = SparseMatrix.from_edge_index(ei, 30)
  with pytest.raises(
    ValueError, match=r"num_nodes=31 does not match the matrix's shape \(30, 30\)"
  ):
    jst.reorder(A, num_nodes=31)


def test_user_permutations_are_checked(rng):
  n = 20
  ei = rng.integers(0, n, (2, 80))
  perm = rng.permutation(n)
  stats = lambda p: block_stats(ei, p, num_nodes=n)  # noqa: E731
  assert stats(perm).nnz == stats(None).nnz
  with pytest.raises(ValueError, match="one entry per node, 20; got 19"):
    stats(perm[:-1])
  dup = perm.copy()
  dup[3] = dup[4]
  with pytest.raises(ValueError, match="1 ids occur more than once.*and 1 never"):
    stats(dup)
  out = perm.copy()
  out[0] = n
  with pytest.raises(ValueError, match=r"ids in \[0, 20\)"):
    stats(out)
  with pytest.raises(ValueError, match="perm must hold integers"):
    stats(perm.astype(np.float64))
  r = jst.reorder(ei, "rcm", num_nodes=n)
  with pytest.raises(ValueError, match=r"node ids must be in \[0, 20\)"):
    r.permute_index(np.array([3, -1]))
  with pytest.raises(ValueError, match=r"axis 0 of x \(shape \(21, 2\)\) must have the 20 nodes"):
    r.permute(np.ones((21, 2)))
  idx = rng.integers(0, n, 7)
  np.testing.assert_array_equal(r.permute_index(idx), r.inverse[idx])


# -- 4. graph helpers, interop, datasets ----------------------------------------------------------


def test_graph_helpers_check_ids_against_num_nodes(rng):
  ei = rng.integers(0, 6, (2, 12))
  ei[0, 0] = 7
  # to_undirected packed (source, target) into source * n + target: ids past num_nodes collided.
  with pytest.raises(ValueError, match=r"node id 7, outside \[0, num_nodes=6\)"):
    graph.to_undirected(ei, num_nodes=6)
  with pytest.raises(ValueError, match="negative node id"):
    graph.to_undirected(np.array([[0, -1], [1, 2]]))
  with pytest.raises(ValueError, match="num_nodes must be a non-negative integer"):
    graph.gcn_norm(ei, 8.0)
  ok = rng.integers(0, 6, (2, 12))
  with pytest.raises(ValueError, match="subset must be node ids"):
    graph.subgraph(np.array([0.0, 2.0]), ok, num_nodes=6)
  with pytest.raises(ValueError, match=r"subset holds node ids in \[-1, 2\]"):
    graph.subgraph(np.array([2, -1]), ok, num_nodes=6)
  with pytest.raises(ValueError, match=r"edge_attr must have 12 rows"):
    graph.subgraph(np.array([0, 1]), ok, np.ones((11, 2)), num_nodes=6)
  with pytest.raises(ValueError, match=r"edge_weight must have 12 rows"):
    graph.remove_self_loops(ok, np.ones(13))
  with pytest.raises(ValueError, match="index must hold integers"):
    graph.degree(jnp.asarray([0.0, 1.0]))
  with pytest.raises(ValueError, match=r"outside \[0, num_nodes=2\)"):
    graph.degree(jnp.asarray([0, 3]), 2)
  deg = graph.degree(jnp.asarray(ok[1]), 6)
  np.testing.assert_array_equal(deg, np.bincount(ok[1], minlength=6))


def test_from_bcoo_refuses_negative_indices_and_complex_data(rng):
  from jax.experimental import sparse as jsparse

  data = jnp.asarray(rng.standard_normal(3), jnp.float32)
  idx = jnp.asarray([[0, 0], [-1, 1], [1, 2]])
  with pytest.raises(ValueError, match=r"negative indices \(first: entry 1, index \[-1, 1\]\)"):
    jst.interop.from_bcoo(jsparse.BCOO((data, idx), shape=(2, 3)))
  with pytest.raises(ValueError, match="complex64"):
    jst.interop.from_bcoo(jsparse.BCOO((data.astype(jnp.complex64), jnp.abs(idx)), shape=(2, 3)))
  good = jsparse.BCOO((data, jnp.abs(idx)), shape=(2, 3))
  np.testing.assert_allclose(jst.interop.from_bcoo(good).todense(), good.todense())


def _npz_graph(rng, n=6):
  adj = sp.random(n, n, density=0.4, random_state=rng, format="csr")
  feats = sp.random(n, 4, density=0.5, random_state=rng, format="csr")
  return (
    dict(
      shape=np.array([n, n]),
      indptr=adj.indptr,
      indices=adj.indices,
      feat_data=feats.data.astype(np.float32),
      feat_indices=feats.indices,
      feat_indptr=feats.indptr,
      feat_shape=np.array([n, 4]),
      labels=rng.integers(0, 3, n),
      train_idx=np.array([0, 1]),
      val_idx=np.array([2]),
      test_idx=np.array([3, 4]),
    ),
    adj,
    feats,
  )


def test_load_npz_checks_the_file(rng, tmp_path):
  from jaxsparse_tc.datasets import load_npz

  arrays, adj, feats = _npz_graph(rng)
  np.savez(tmp_path / "g.npz", **arrays)
  ds = load_npz(tmp_path / "g.npz")
  np.testing.assert_array_equal(ds.features, feats.toarray().astype(np.float32))
  np.testing.assert_array_equal(ds.adjacency.toarray() != 0, adj.toarray() != 0)
  for change, pattern in (
    (dict(labels=arrays["labels"][:-1]), "labels must have n = 6 entries; got 5"),
    (dict(train_idx=np.array([0, 6])), "train_idx holds 6; it must be below 6"),
    (dict(indices=arrays["indices"].astype(np.float64)), "indices must hold integers"),
    (dict(indptr=arrays["indptr"][:-1]), "indptr must have n \\+ 1 = 7 entries"),
    (dict(feat_shape=np.array([5, 4])), "feat_shape must be \\[n=6, features\\]"),
  ):
    np.savez(tmp_path / "bad.npz", **{**arrays, **change})
    with pytest.raises(ValueError, match=pattern):
      load_npz(tmp_path / "bad.npz")
  np.savez(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if k != "labels"})
  with pytest.raises(ValueError, match="missing here: labels\\)"):
    load_npz(tmp_path / "bad.npz")
  (tmp_path / "text.npz").write_text("not an archive")
  with pytest.raises(ValueError, match="not a readable .npz archive"):
    load_npz(tmp_path / "text.npz")


def test_load_tu_npz_checks_the_file(rng, tmp_path):
  from jaxsparse_tc.datasets import load_tu_npz

  sizes = rng.integers(2, 6, 4)
  ptr = np.concatenate([[0], np.cumsum(sizes)])
  rows, cols = [], []
  for lo, hi in zip(ptr[:-1], ptr[1:]):
    e = rng.integers(lo, hi, (2, 3))
    rows.append(e[0])
    cols.append(e[1])
  arrays = dict(
    row=np.concatenate(rows),
    col=np.concatenate(cols),
    graph_ptr=ptr,
    graph_label=rng.integers(0, 2, 4),
    node_tag=rng.integers(0, 3, ptr[-1]),
  )
  np.savez(tmp_path / "TOY.npz", **arrays)
  ds = load_tu_npz(tmp_path / "TOY.npz")
  assert [g.num_nodes for g in ds.graphs] == sizes.tolist()
  cross = arrays["col"].copy()
  cross[0] = ptr[-1] - 1  # an edge of graph 0 into the last graph
  for change, pattern in (
    (dict(graph_ptr=ptr[:-1]), "graph_ptr must rise from 0 to len\\(node_tag\\)"),
    (dict(graph_label=arrays["graph_label"][:-1]), "one label per graph \\(4\\); got 3"),
    (dict(row=arrays["row"].astype(np.float32)), "row must hold integers"),
    (dict(col=cross), "an edge of graph 0 .* leaves the graph"),
    (dict(col=arrays["col"][:-1]), "row and col differ in length"),
  ):
    np.savez(tmp_path / "TOY.npz", **{**arrays, **change})
    with pytest.raises(ValueError, match=pattern):
      load_tu_npz(tmp_path / "TOY.npz")
