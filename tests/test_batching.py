"""Fixed-shape batching (jaxsparse_tc.nn.batch) and pooling (jaxsparse_tc.nn.pool).

Random graphs of varying sizes (fresh seeds), batched with one budget: every batch has the same
pytree structure and leaf shapes, a jitted step traces once for a whole epoch, and outputs and
gradients on real nodes equal per-graph results computed without padding (float64, CPU
kernels), padding contributing exact zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsparse_tc.nn import functional as F
from jaxsparse_tc.nn import graph
from jaxsparse_tc.nn.batch import Budget, Graph, GraphLoader, batch_graphs
from jaxsparse_tc.nn.pool import global_add_pool, global_max_pool, global_mean_pool


@pytest.fixture(autouse=True)
def _on_cpu():
  with jax.default_device(jax.devices("cpu")[0]):
    yield


def random_graphs(rng, count, max_nodes=40, features=5, loops=True):
  out = []
  for _ in range(count):
    n = int(rng.integers(1, max_nodes))
    e = int(rng.integers(0, 4 * n + 1))
    ei = rng.integers(0, n, (2, e))
    if not loops:
      ei = ei[:, ei[0] != ei[1]]
    out.append(
      Graph(ei, n, x=rng.normal(size=(n, features)).astype(np.float32), y=int(rng.integers(0, 3)))
    )
  return out


def _leaf_signature(batch):
  leaves, treedef = jax.tree_util.tree_flatten(batch)
  return treedef, tuple((leaf.shape, leaf.dtype) for leaf in leaves)


@pytest.mark.parametrize("add_self_loops", [False, True])
def test_one_structure_and_one_trace_per_epoch(rng, add_self_loops):
  graphs = random_graphs(rng, 120)
  budget = Budget.for_dataset(graphs, 12, add_self_loops=add_self_loops)
  loader = GraphLoader(graphs, budget, 12, shuffle=True, seed=int(rng.integers(1 << 30)))
  traces = []

  @jax.jit
  def step(w, batch):
    traces.append(1)  # runs only while tracing
    h = jax.nn.relu(batch.A @ (batch.x @ w))
    h = batch.A @ h + h
    logits = global_add_pool(h, batch)
    return jnp.sum(jnp.where(batch.graph_mask[:, None], logits, 0.0) ** 2)

  grad = jax.jit(jax.grad(step.__wrapped__))
  w = jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)
  sigs = set()
  seen = 0
  for _ in range(2):  # two epochs
    for batch in loader:
      sigs.add(_leaf_signature(batch))
      seen += int(np.sum(np.asarray(batch.graph_mask)))
      assert np.isfinite(float(step(w, batch)))
      assert np.all(np.isfinite(np.asarray(grad(w, batch))))
  assert seen == 2 * len(graphs)  # every graph once per epoch
  assert len(sigs) == 1
  assert len(traces) == 2  # one trace of `step`, one of its gradient
  A = batch.A
  assert A.nnz == budget.nnz and A.shape == (budget.num_nodes,) * 2
  sizes = budget.format_sizes()
  for p in (A.pattern, A.pattern_t):
    assert p.window_cols.shape[0] == sizes["window_cols"]
    assert p.block_bitmap.shape[0] == sizes["blocks"]
    assert p.schedule.shape[0] == sizes["schedule"]
    assert p.row_schedule.shape[0] == sizes["row_schedule"]


def test_padded_matrix_is_the_union_plus_zero_dummies(rng):
  graphs = random_graphs(rng, 9)
  budget = Budget.for_dataset(graphs, 9, add_self_loops=True)
  batch = batch_graphs(graphs, budget)
  dense = np.asarray(batch.A.todense(), np.float64)
  n_real = sum(g.num_nodes for g in graphs)
  ref = np.zeros_like(dense)
  off = 0
  for g in graphs:
    ref[off : off + g.num_nodes, off : off + g.num_nodes] = np.asarray(
      graph.message_passing_matrix(g.edge_index, g.num_nodes, add_self_loops=True).todense()
    )
    off += g.num_nodes
  np.testing.assert_array_equal(dense, ref)
  # the dummy entries are in the pattern (as zeros), among padding nodes only
  rows, cols = np.asarray(batch.A.rows), np.asarray(batch.A.cols)
  vals = np.asarray(batch.A.values)
  dummy = (rows >= n_real) | (cols >= n_real)
  assert dummy.any() and np.all(vals[dummy] == 0)
  assert np.all(rows[dummy] >= n_real) and np.all(cols[dummy] >= n_real)
  # edge slots: real edges in order, then padding slots on dummy entries
  ei = np.asarray(batch.edge_index)
  e_real = sum(g.edge_index.shape[1] for g in graphs)
  assert np.all(np.asarray(batch.edge_mask)[:e_real]) and not np.any(
    np.asarray(batch.edge_mask)[e_real:]
  )
  assert np.all(ei[:, e_real:] >= n_real)
  pos = np.asarray(batch.A.input_to_format)
  np.testing.assert_array_equal(rows[pos], ei[1])
  np.testing.assert_array_equal(cols[pos], ei[0])


def _gat_params(rng, f, heads, c):
  return (
    jnp.asarray(rng.normal(size=(f, heads * c)) * 0.5),
    jnp.asarray(rng.normal(size=(heads, c))),
    jnp.asarray(rng.normal(size=(heads, c))),
  )


@pytest.mark.parametrize("model", ["gin", "gcn", "gat", "sage"])
def test_batched_equals_per_graph_float64(rng, x64, model):
  """Outputs, pooled readouts and gradients (parameters and real nodes' features) of a batch
  equal the per-graph computations; padding nodes get exactly zero gradient. (GAT in float32:
  edge_softmax computes in float32 and refuses float64.)"""
  graphs = random_graphs(rng, 7)
  loops = model in ("gcn", "gat")
  budget = Budget.for_dataset(graphs, 7, add_self_loops=loops)
  batch = batch_graphs(graphs, budget)
  f = graphs[0].x.shape[1]
  dtype = jnp.float32 if model == "gat" else jnp.float64
  w1 = jnp.asarray(rng.normal(size=(f, 6)), dtype)
  w2 = jnp.asarray(rng.normal(size=(f, 6)), dtype)
  gat = tuple(p.astype(dtype) for p in _gat_params(rng, f, 2, 3))

  def node_fn(params, A, x):
    w1, w2, gat = params
    if model == "gin":
      return F.gin_conv(A, x, lambda h: jnp.tanh(h @ w1), eps=0.3)
    if model == "gcn":
      return F.gcn_conv(graph.normalize_symmetric(A), x, w1)
    if model == "sage":
      return F.sage_conv(A, x, w1, w2, aggr="mean")
    return F.gat_conv(A, x, *gat, heads=2)

  def readout(h, gi, g):
    return jnp.concatenate(
      [global_add_pool(h, gi, g), global_mean_pool(h, gi, g), global_max_pool(h, gi, g)], axis=-1
    )

  def batched_loss(params, x):
    h = node_fn(params, batch.A, x)
    r = readout(h, batch.node_graph, batch.num_graphs)
    return jnp.sum(jnp.where(batch.graph_mask[:, None], jnp.sin(r), 0.0)), (h, r)

  def graph_matrix(g):
    if loops:
      return graph.message_passing_matrix(g.edge_index, g.num_nodes, add_self_loops=True)
    return graph.message_passing_matrix(g.edge_index, g.num_nodes)

  def single_loss(params, xs):
    total, hs, rs = 0.0, [], []
    for g, x in zip(graphs, xs):
      h = node_fn(params, graph_matrix(g), x)
      r = readout(h, jnp.zeros(g.num_nodes, jnp.int32), 1)
      total = total + jnp.sum(jnp.sin(r))
      hs.append(h)
      rs.append(r)
    return total, (hs, rs)

  params = (w1, w2, gat)
  x = jnp.asarray(batch.x, dtype)
  xs = [jnp.asarray(g.x, dtype) for g in graphs]
  # jit: one compile per loss rather than one per primitive of every graph's shapes
  (lb, (hb, rb)), (gpb, gxb) = jax.jit(
    jax.value_and_grad(batched_loss, argnums=(0, 1), has_aux=True)
  )(params, x)
  (ls, (hs, rs)), (gps, gxs) = jax.jit(
    jax.value_and_grad(single_loss, argnums=(0, 1), has_aux=True)
  )(params, xs)
  assert hb.dtype == dtype
  eps = 1e-10 if dtype == jnp.float64 else 3e-5

  def close(a, b):
    b = np.asarray(b, np.float64)
    np.testing.assert_allclose(
      np.asarray(a, np.float64), b, rtol=eps, atol=eps * max(1.0, float(np.abs(b).max(initial=0)))
    )

  n_real = sum(g.num_nodes for g in graphs)
  close(np.asarray(hb)[:n_real], np.concatenate(hs))
  close(np.asarray(rb)[: len(graphs)], np.concatenate(rs))
  close(float(lb), float(ls))
  used = 0
  for a, b in zip(jax.tree_util.tree_leaves(gpb), jax.tree_util.tree_leaves(gps)):
    used += float(jnp.max(jnp.abs(b))) > 0  # (each model leaves some parameters unused)
    close(a, b)
  assert used >= 1
  close(np.asarray(gxb)[:n_real], np.concatenate(gxs))
  np.testing.assert_array_equal(np.asarray(gxb)[n_real:], 0.0)


def test_pooling_against_numpy(rng):
  n, g = 50, 6
  x = rng.normal(size=(n, 3))
  gi = rng.integers(0, g + 2, n)  # ids >= g are padding: dropped
  gi[gi == 2] = 3  # graph 2 has no nodes
  xs, gj = jnp.asarray(x, jnp.float32), jnp.asarray(gi, jnp.int32)
  for fn, red in (
    (global_add_pool, np.sum),
    (global_mean_pool, np.mean),
    (global_max_pool, np.max),
  ):
    got = np.asarray(fn(xs, gj, g))
    for k in range(g):
      ref = red(x[gi == k], axis=0) if np.any(gi == k) else np.zeros(3)
      np.testing.assert_allclose(got[k], ref, rtol=1e-5, atol=1e-6)
  with pytest.raises(TypeError, match="num_graphs"):
    global_add_pool(xs, gj)
  with pytest.raises(ValueError, match="one graph per node"):
    global_add_pool(xs, gj[:-1], g)


def test_node_labels_edge_attr_and_budget_errors(rng):
  graphs = []
  for _ in range(5):
    n = int(rng.integers(2, 12))
    ei = rng.integers(0, n, (2, 3 * n))
    graphs.append(
      Graph(
        ei,
        n,
        x=rng.normal(size=(n, 2)),
        y=rng.integers(0, 4, n),
        edge_attr=rng.normal(size=(3 * n, 4)),
      )
    )
  budget = Budget.for_dataset(graphs, 5)
  b = batch_graphs(graphs, budget)
  n_real = sum(g.num_nodes for g in graphs)
  assert b.y.shape == (budget.num_nodes,) and b.x.dtype == np.float32
  np.testing.assert_array_equal(np.asarray(b.y)[:n_real], np.concatenate([g.y for g in graphs]))
  e_real = sum(g.edge_index.shape[1] for g in graphs)
  assert b.edge_attr.shape == (budget.edges, 4)
  np.testing.assert_allclose(
    np.asarray(b.edge_attr)[:e_real], np.concatenate([g.edge_attr for g in graphs]), rtol=1e-6
  )
  np.testing.assert_array_equal(np.asarray(b.edge_attr)[e_real:], 0)
  # one node short of the largest graph (fixed sizes failed to raise for the 0.24% of draws
  # whose graphs all fit them)
  small = Budget(nodes=max(g.num_nodes for g in graphs) - 1, edges=1000, graphs=5)
  with pytest.raises(ValueError, match="exceeds the budget"):
    GraphLoader(graphs, small, 5)
  with pytest.raises(ValueError, match="graph slots"):
    batch_graphs(graphs, Budget(nodes=1000, edges=1000, graphs=2))
  with pytest.raises(ValueError, match="positive integer"):
    Budget(nodes=0, edges=1, graphs=1)


def test_loader_packs_within_budget(rng):
  graphs = random_graphs(rng, 60)
  budget = Budget.for_dataset(graphs, 8, slack=0.0)  # tight: some batches close early
  loader = GraphLoader(graphs, budget, 8, shuffle=True, seed=3)
  batches = loader.index_batches(0)
  assert sorted(np.concatenate(batches).tolist()) == list(range(len(graphs)))
  for idx in batches:
    assert 1 <= len(idx) <= 8
    n = sum(graphs[i].num_nodes for i in idx)
    e = sum(graphs[i].edge_index.shape[1] for i in idx)
    assert budget.fits(n, e, len(idx))
  assert any(len(idx) < 8 for idx in batches[:-1])
  assert [b.tolist() for b in loader.index_batches(0)] == [b.tolist() for b in batches]
  assert [b.tolist() for b in loader.index_batches(1)] != [b.tolist() for b in batches]


def test_batch_with_hub_graphs_takes_finer_pieces(rng):
  """A batch past SMALL_GRAPH_NNZ whose only long windows are a few hubs' gets pieces shorter
  than SPLIT_BLOCKS (pattern.split_blocks): the budget's schedule length (window_items_bound)
  still holds them, and the batch's SpMM equals the per-graph one."""
  from jaxsparse_tc._src.pattern import SMALL_GRAPH_NNZ, SPLIT_BLOCKS

  graphs = []
  for i in range(12):
    n = 900
    ei = rng.integers(0, n, (2, 8 * n))  # ~8 neighbours per node: short windows
    if i < 3:  # a hub: one node joined to 600 others, a window of ~75 blocks each way
      hub = np.stack([np.zeros(600, np.int64), rng.choice(np.arange(1, n), 600, replace=False)])
      ei = np.concatenate([ei, hub, hub[::-1]], axis=1)
    graphs.append(Graph(ei, n, x=rng.normal(size=(n, 3)).astype(np.float32)))
  budget = Budget.for_dataset(graphs, 12)
  batch = batch_graphs(graphs, budget)
  A = batch.A
  assert A.nnz >= SMALL_GRAPH_NNZ
  sizes = budget.format_sizes()
  for p in (A.pattern, A.pattern_t):
    pieces = np.asarray(p.schedule)[:, 3]
    assert 0 < pieces.max() < SPLIT_BLOCKS  # finer pieces were cut
    assert p.schedule.shape[0] == sizes["schedule"]
  x = np.asarray(batch.x, np.float64)
  got = np.asarray(A @ batch.x, np.float64)
  dense = np.asarray(A.todense(), np.float64)
  np.testing.assert_allclose(got, dense @ x, rtol=1e-5, atol=1e-4)
