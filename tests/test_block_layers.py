"""The Flax and Equinox layers on sampled blocks (jaxsparse_tc.sampling.Block): each equals the
same layer on the explicit bipartite graph of the sampled layer (built here from its edges) at
the target rows, and the padding is inert (no effect on outputs, zero gradients)."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxsparse_tc as jst
from jaxsparse_tc.nn import equinox as nne
from jaxsparse_tc.nn import flax as nnf
from jaxsparse_tc.sampling import NeighborSampler, csr_from_edge_index

F_IN, F_OUT = 6, 5
KINDS = ["sage-mean", "sage-max", "sage-sum", "gcn", "gat", "gatv2", "gin"]


def _graph(rng, n=70):
  """A random symmetric graph (no self-loops) with a few isolated nodes, as edge_index."""
  pairs = set()
  for v in range(n - 3):
    for u in rng.choice(n - 3, size=int(rng.integers(1, 9)), replace=False):
      if u != v:
        pairs.update({(int(u), v), (v, int(u))})
  return np.array(sorted(pairs), np.int64).T


def _sampled(rng, replace=False):
  """(layers, batch) of a 2-layer sampler on a partial batch (padding seeds too)."""
  n = 70
  indptr, indices, _ = csr_from_edge_index(_graph(rng, n), n)
  sampler = NeighborSampler(indptr, indices, [4, 3], batch_size=10, replace=replace, threads=1)
  seeds = np.append(rng.choice(n - 3, 6, replace=False), n - 1)  # n - 1: an isolated seed
  layers = sampler.sample(seeds, seed=int(rng.integers(2**31)))
  return layers, sampler.pad(layers)


@functools.lru_cache(maxsize=None)
def _built(kind: str, framework: str):
  """One layer per kind and framework (building one compiles its initialisers: slow here);
  `_make` gives each test a copy with fresh random parameters."""
  return _construct(kind, framework, 0)


def _make(kind: str, framework: str, rng):
  return _randomize(_built(kind, framework), rng, framework)


def _construct(kind: str, framework: str, seed: int):
  aggr = kind.split("-")[1] if kind.startswith("sage") else None
  if framework == "flax":
    r = nnx.Rngs(seed)
    if aggr:
      return nnf.SAGEConv(F_IN, F_OUT, aggr=aggr, rngs=r)
    if kind == "gcn":
      return nnf.GCNConv(F_IN, F_OUT, rngs=r)
    if kind == "gat":
      return nnf.GATConv(F_IN, F_OUT, heads=2, add_self_loops=False, rngs=r)
    if kind == "gatv2":
      return nnf.GATv2Conv(F_IN, F_OUT, heads=2, add_self_loops=False, rngs=r)
    return nnf.GINConv(nnf.MLP([F_IN, 8, F_OUT], rngs=r), eps=0.3)
  k = jax.random.key(seed)
  if aggr:
    return nne.SAGEConv(F_IN, F_OUT, aggr=aggr, key=k)
  if kind == "gcn":
    return nne.GCNConv(F_IN, F_OUT, key=k)
  if kind == "gat":
    return nne.GATConv(F_IN, F_OUT, heads=2, add_self_loops=False, key=k)
  if kind == "gatv2":
    return nne.GATv2Conv(F_IN, F_OUT, heads=2, add_self_loops=False, key=k)
  return nne.GINConv(nne.MLP([F_IN, 8, F_OUT], key=k), eps=0.3)


def _fresh(shape):
  """Random float32 parameters of `shape` (kernels scaled by 1/sqrt(fan-in)); biases are
  non-zero too (their init is zeros), so that padding rows would show them."""

  def draw(rng):
    scale = 1 / np.sqrt(shape[0]) if len(shape) == 2 else 1.0
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)

  return draw


def _randomize(layer, rng, framework):
  """A copy of `layer` with every parameter array drawn from rng."""
  if framework == "flax":
    layer = nnx.clone(layer)
    for _, p in nnx.iter_graph(layer):
      if isinstance(p, nnx.Param) and p[...].ndim >= 1:
        p[...] = _fresh(p[...].shape)(rng)
    return layer
  leaves, tree = jax.tree_util.tree_flatten(layer)
  leaves = [_fresh(x.shape)(rng) if isinstance(x, jax.Array) and x.ndim >= 1 else x for x in leaves]
  return jax.tree_util.tree_unflatten(tree, leaves)


def _gcn_reference(layer, framework, layer_edges, h):
  """float64: D_dst^-1/2 (C + I) D_src^-1/2 h W + b on the sampled bipartite graph."""
  T, S = layer_edges.targets.shape[0], layer_edges.sources.shape[0]
  C = np.zeros((T, S))
  np.add.at(C, (layer_edges.rows, layer_edges.cols), 1.0)
  C[np.arange(T), np.arange(T)] += 1.0
  d_in, d_out = C.sum(1), C.sum(0)
  An = C / np.sqrt(d_in[:, None] * d_out[None, :])
  W = np.asarray(layer.lin.kernel[...] if framework == "flax" else layer.lin.kernel, np.float64)
  b = np.asarray(layer.bias[...] if framework == "flax" else layer.bias, np.float64)
  return An @ np.asarray(h[:S], np.float64) @ W + b


def _jitted(layer, framework):
  """The layer as a jitted pure function of (A or block, x) (eager calls would compile each
  operation on its own: much slower here)."""
  if framework == "flax":
    graphdef, state = nnx.split(layer)
    return jax.jit(lambda A, x: nnx.merge(graphdef, state)(A, x))
  return jax.jit(lambda A, x: layer(A, x))


@pytest.mark.parametrize("kind", KINDS)
def test_block_layer(rng, kind):
  """Flax and Equinox: the block call equals the layer on the explicit bipartite graph at the
  targets' rows (GCN: a float64 reference of the documented normalisation), 0 on padding
  targets; padding sources get zero gradients and their features change nothing."""
  layers, batch = _sampled(rng, replace=kind == "sage-sum")
  block, sampled = batch.blocks[-1], layers[0]  # the seeds' block: a partial batch
  T, S = sampled.targets.shape[0], sampled.sources.shape[0]
  width = 2 * F_OUT if kind in ("gat", "gatv2") else F_OUT
  M = jst.SparseMatrix.from_coo(sampled.rows, sampled.cols, shape=(T, S))
  for framework in ("flax", "equinox"):
    layer = _make(kind, framework, rng)
    call = _jitted(layer, framework)
    h = jnp.asarray(rng.normal(size=(block.num_src, F_IN)), jnp.float32)
    out = np.asarray(call(block, h))
    assert out.shape == (block.num_dst, width)
    np.testing.assert_array_equal(out[T:], 0)  # padding targets come out 0
    if kind == "gcn":
      ref = _gcn_reference(layer, framework, sampled, np.asarray(h))
      np.testing.assert_allclose(out[:T], ref, rtol=1e-4, atol=1e-5)
    else:
      ref = np.asarray(call(M, (h[:S], h[:T])))
      np.testing.assert_allclose(out[:T], ref, rtol=1e-5, atol=1e-5)
    g = jnp.asarray(rng.normal(size=(block.num_dst, width)), jnp.float32)
    grad = np.asarray(jax.jit(jax.grad(lambda h: jnp.sum(call(block, h) * g)))(h))
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grad[S:], 0)  # padding sources get no gradient
    assert np.abs(grad[:S]).max() > 0
    noise = jnp.asarray(rng.normal(size=(block.num_src - S, F_IN)) * 10, jnp.float32)
    np.testing.assert_array_equal(np.asarray(call(block, h.at[S:].set(noise))), out)


@pytest.mark.parametrize("framework", ["flax", "equinox"])
@pytest.mark.parametrize("kind", ["gat", "gatv2"])
def test_block_attention_ignores_padding_entries(rng, kind, framework):
  """The block's padding entries (value 0, in padding rows) get attention weight 0; every
  real target with sampled neighbours has weights summing to 1 per head."""
  layers, batch = _sampled(rng)
  layer = _make(kind, framework, rng)
  block, sampled = batch.blocks[-1], layers[0]
  h = jnp.asarray(rng.normal(size=(block.num_src, F_IN)), jnp.float32)
  if framework == "flax":
    graphdef, state = nnx.split(layer)
    layer = lambda A, x, **kw: nnx.merge(graphdef, state)(A, x, **kw)  # noqa: E731
  out, alpha = jax.jit(lambda b, x: layer(b, x, return_attention_weights=True))(block, h)
  assert out.shape == (block.num_dst, 2 * F_OUT)
  a = np.asarray(alpha.values)  # [heads, nnz], format order
  real = np.asarray(block.A.values) != 0
  assert (~real).any()  # the block has padding entries to test
  np.testing.assert_array_equal(a[:, ~real], 0)
  rows = np.asarray(block.A.rows)
  sums = np.stack([np.bincount(rows, weights=a[k], minlength=block.num_src) for k in range(2)])
  has = np.bincount(sampled.rows, minlength=block.num_src) > 0
  np.testing.assert_allclose(sums[:, has], 1, rtol=1e-5)
  np.testing.assert_array_equal(sums[:, ~has], 0)


@pytest.mark.parametrize("framework", ["flax", "equinox"])
def test_block_attention_refuses_self_loops(rng, framework):
  _, batch = _sampled(rng)
  block = batch.blocks[-1]
  if framework == "flax":
    layer = nnf.GATConv(F_IN, F_OUT, rngs=nnx.Rngs(0))
  else:
    layer = nne.GATConv(F_IN, F_OUT, key=jax.random.key(0))
  with pytest.raises(ValueError, match="add_self_loops=False"):
    layer(block, jnp.zeros((block.num_src, F_IN)))


def test_block_features_are_checked(rng):
  _, batch = _sampled(rng)
  block = batch.blocks[-1]
  layer = _built("sage-mean", "flax")
  with pytest.raises(ValueError, match=f"h must be \\[{block.num_src}, features\\]"):
    layer(block, jnp.zeros((block.num_dst + 1, F_IN)))
  with pytest.raises(TypeError, match="not a pair"):
    layer(block, (jnp.zeros((block.num_src, F_IN)), jnp.zeros((block.num_dst, F_IN))))


def test_two_layer_model_on_a_batch_matches_per_layer_references(rng):
  """Chained blocks: layer 1 on blocks[0] feeds layer 2 on blocks[1]; the seeds' outputs equal
  the same two layers on the explicit bipartite graphs, and jit traces once for two batches."""
  n = 70
  indptr, indices, _ = csr_from_edge_index(_graph(rng, n), n)
  sampler = NeighborSampler(indptr, indices, [4, 3], batch_size=10, threads=1)
  x = jnp.asarray(rng.normal(size=(n, F_IN)), jnp.float32)
  key1, key2 = jax.random.split(jax.random.key(int(rng.integers(1000))))
  c1, c2 = nne.SAGEConv(F_IN, 8, key=key1), nne.SAGEConv(8, F_OUT, key=key2)
  traces = []

  @eqx.filter_jit
  def forward(c1, c2, batch):
    traces.append(1)
    h = x[batch.input_nodes]
    h = jax.nn.relu(c1(batch.blocks[0], h))
    return c2(batch.blocks[1], h)

  for k in (10, 6):
    layers = sampler.sample(rng.choice(n, k, replace=False), seed=int(rng.integers(2**31)))
    out = np.asarray(forward(c1, c2, sampler.pad(layers)))
    h = x[layers[-1].sources]
    for c, sampled in zip((c1, c2), layers[::-1]):
      T, S = sampled.targets.shape[0], sampled.sources.shape[0]
      M = jst.SparseMatrix.from_coo(sampled.rows, sampled.cols, shape=(T, S))
      h = eqx.filter_jit(lambda c, M, xs: c(M, xs))(c, M, (h[:S], h[:T]))
      if c is c1:
        h = jax.nn.relu(h)
    np.testing.assert_allclose(out[:k], np.asarray(h), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[k:], 0)
  assert len(traces) == 1
