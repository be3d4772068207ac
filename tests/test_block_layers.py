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
from jaxsparse_tc._src.checks import OperandError
from jaxsparse_tc.nn import equinox as nne
from jaxsparse_tc.nn import flax as nnf
from jaxsparse_tc.nn import functional as F
from jaxsparse_tc.nn import graph
from jaxsparse_tc.sampling import NeighborSampler, csr_from_edge_index

F_IN, F_OUT = 6, 5
KINDS = ["sage-mean", "sage-max", "sage-sum", "gcn", "gat", "gatv2", "gin"]


def _graph(rng, n=70, loops=0):
  """A random symmetric graph with a few isolated nodes, as edge_index; `loops` nodes (among
  the others) get a self-loop."""
  pairs = set()
  for v in range(n - 3):
    for u in rng.choice(n - 3, size=int(rng.integers(1, 9)), replace=False):
      if u != v:
        pairs.update({(int(u), v), (v, int(u))})
  pairs.update((int(v), int(v)) for v in rng.choice(n - 3, size=loops, replace=False))
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


def _value(p):
  """A parameter (Flax Param or array) as float64 numpy."""
  return np.asarray(p[...] if isinstance(p, nnx.Variable) else p, np.float64)


def _leaky(z):
  return np.where(z > 0, z, 0.2 * z)


def _attention_reference(kind, layer, h, sampled, edge_attr=None, fill_value=None):
  """float64 PyG GATConv / GATv2Conv (2 heads, concatenated) with add_self_loops=True on the
  sampled bipartite graph: its edges cols -> rows without the graph's own loops (local row ==
  col: target i is source i), plus one loop per target whose edge features are `fill_value`
  ("mean" of the target's remaining incoming features, or the number). Returns (out [T, 2C],
  the kept edges' coefficients [E', 2], the loops' [T, 2], the kept edges' mask [E])."""
  T, S = sampled.targets.shape[0], sampled.sources.shape[0]
  keep = sampled.rows != sampled.cols
  r = np.concatenate([sampled.rows[keep], np.arange(T)])
  c = np.concatenate([sampled.cols[keep], np.arange(T)])
  x = np.asarray(h[:S], np.float64)
  e = 0.0
  if edge_attr is not None:
    kept_attr = np.asarray(edge_attr[: keep.size], np.float64)[keep]
    if fill_value == "mean":
      total = np.zeros((T, kept_attr.shape[1]))
      np.add.at(total, sampled.rows[keep], kept_attr)
      count = np.bincount(sampled.rows[keep], minlength=T)
      loop_attr = total / np.maximum(count, 1)[:, None]
    else:
      loop_attr = np.full((T, kept_attr.shape[1]), fill_value)
    e = (np.concatenate([kept_attr, loop_attr]) @ _value(layer.lin_edge.kernel)).reshape(
      r.size, 2, -1
    )
  if kind == "gat":
    hs = (x @ _value(layer.lin.kernel)).reshape(S, 2, -1)
    logits = (hs[r] * _value(layer.att_dst)).sum(-1) + (hs[c] * _value(layer.att_src)).sum(-1)
    if edge_attr is not None:
      logits = logits + (e * _value(layer.att_edge)).sum(-1)
    logits, messages = _leaky(logits), hs[c]
  else:
    xl = (x @ _value(layer.lin_l.kernel) + _value(layer.lin_l.bias)).reshape(S, 2, -1)
    xr = (x @ _value(layer.lin_r.kernel) + _value(layer.lin_r.bias)).reshape(S, 2, -1)
    logits = (_leaky(xr[r] + xl[c] + e) * _value(layer.att)).sum(-1)
    messages = xl[c]
  top = np.full((T, 2), -np.inf)
  np.maximum.at(top, r, logits)
  p = np.exp(logits - top[r])
  total = np.zeros((T, 2))
  np.add.at(total, r, p)
  alpha = p / total[r]
  out = np.zeros((T, 2, messages.shape[-1]))
  np.add.at(out, r, alpha[..., None] * messages)
  kept = int(keep.sum())
  return out.reshape(T, -1) + _value(layer.bias), alpha[:kept], alpha[kept:], keep


@functools.lru_cache(maxsize=None)
def _built_with_loops(kind: str, framework: str, edge_dim, fill_value):
  kw = dict(heads=2, add_self_loops=True, edge_dim=edge_dim, fill_value=fill_value)
  if framework == "flax":
    cls = nnf.GATConv if kind == "gat" else nnf.GATv2Conv
    return cls(F_IN, F_OUT, **kw, rngs=nnx.Rngs(0))
  cls = nne.GATConv if kind == "gat" else nne.GATv2Conv
  return cls(F_IN, F_OUT, **kw, key=jax.random.key(0))


@pytest.mark.parametrize(
  "kind, framework, edge_dim",
  # each layer and each framework with and without edge features, in four cases
  [("gat", "flax", None), ("gat", "equinox", 3), ("gatv2", "flax", 3), ("gatv2", "equinox", None)],
)
def test_block_attention_with_self_loops(rng, kind, framework, edge_dim):
  """add_self_loops=True on a Block: each real target attends over its sampled neighbours and
  itself in one softmax, as PyG's layer on the sampled bipartite graph (the graph's own loops
  removed, one per target added; loop edge features by fill_value: "mean" for Flax, a number
  for Equinox), against a float64 reference; alpha holds the edges' coefficients and each
  loop has the rest of its row. Two batches of one sampler trace once; padding sources and
  edge slots, and the graph's own loops' edge features, get zero gradients."""
  fill_value = "mean" if framework == "flax" else 0.5
  n = 70
  indptr, indices, _ = csr_from_edge_index(_graph(rng, n, loops=n - 3), n)
  sampler = NeighborSampler(indptr, indices, [4, 3], batch_size=10, threads=1)
  layer = _randomize(_built_with_loops(kind, framework, edge_dim, fill_value), rng, framework)
  if framework == "flax":
    graphdef, state = nnx.split(layer)
    call = lambda b, x, e, **kw: nnx.merge(graphdef, state)(b, x, e, **kw)  # noqa: E731
  else:
    call = layer
  traces = []

  @jax.jit
  def forward(block, h, edge_attr):
    traces.append(1)
    return call(block, h, edge_attr, return_attention_weights=True)

  grad = jax.jit(jax.grad(lambda b, h, e, g: jnp.sum(call(b, h, e) * g), argnums=(1, 2)))
  graph_loops = 0
  for seeds in (np.append(rng.choice(n - 3, 6, replace=False), n - 1), rng.choice(n, 10, False)):
    layers = sampler.sample(seeds, seed=int(rng.integers(2**31)))
    block, sampled = sampler.pad(layers).blocks[-1], layers[0]
    T, S, E = (a.shape[0] for a in (sampled.targets, sampled.sources, sampled.rows))
    np.testing.assert_array_equal(np.asarray(block.edge_ids[:E]), sampled.edge_ids)
    h = jnp.asarray(rng.normal(size=(block.num_src, F_IN)), jnp.float32)
    ea = None
    if edge_dim is not None:
      ea = jnp.asarray(rng.normal(size=(block.num_edges, edge_dim)), jnp.float32)
    out, alpha = forward(block, h, ea)
    out = np.asarray(out)
    ref, ref_alpha, ref_loops, keep = _attention_reference(kind, layer, h, sampled, ea, fill_value)
    graph_loops += int((~keep).sum())
    np.testing.assert_allclose(out[:T], ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(out[T:], 0)
    a = np.asarray(alpha.values_to_input())[:, :E].T  # [E, heads], the sampled edges' order
    np.testing.assert_allclose(a[keep], ref_alpha, rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(a[~keep], 0)  # the graph's own loops: replaced
    row_sums = np.stack([np.bincount(sampled.rows, a[:, k], minlength=T) for k in range(2)], 1)
    np.testing.assert_allclose(1 - row_sums, ref_loops, rtol=2e-5, atol=2e-6)
    g = jnp.asarray(rng.normal(size=out.shape), jnp.float32)
    gh, ge = grad(block, h, ea, g)
    gh = np.asarray(gh)
    assert np.all(np.isfinite(gh)) and np.abs(gh[:S]).max() > 0
    np.testing.assert_array_equal(gh[S:], 0)
    if ea is not None:
      ge = np.asarray(ge)
      assert np.all(np.isfinite(ge)) and np.abs(ge[:E]).max() > 0
      np.testing.assert_array_equal(ge[E:], 0)
      np.testing.assert_array_equal(ge[:E][~keep], 0)
  assert len(traces) == 1
  assert graph_loops > 0  # the graph's own loops were sampled and replaced


@pytest.mark.parametrize("kind", ["gat", "gatv2"])
def test_self_loops_outside_the_pattern_match_loops_inside(rng, kind):
  """functional: loops attended outside A's pattern (self_loop_mask) equal the same layer on
  the pattern that holds them (message_passing_matrix(add_self_loops=True)), the graph's own
  loops replaced in both, with edge features (fill "mean") and a dropout function that must
  reach the loops' coefficients too."""
  n, d = 40, 3
  ei = _graph(rng, n, loops=6)
  inside = graph.message_passing_matrix(ei, n, add_self_loops=True)
  outside = graph.message_passing_matrix(ei, n)
  x = jnp.asarray(rng.normal(size=(n, F_IN)), jnp.float32)
  edge_attr = jnp.asarray(rng.normal(size=(ei.shape[1], d)), jnp.float32)
  p = lambda *shape: jnp.asarray(rng.normal(size=shape) / np.sqrt(shape[0]), jnp.float32)  # noqa: E731
  kw = dict(heads=2, edge_attr=edge_attr, edge_kernel=p(d, 2 * F_OUT), attn_dropout=lambda a: 2 * a)
  if kind == "gat":
    conv = functools.partial(
      F.gat_conv,
      kernel=p(F_IN, 2 * F_OUT),
      att_src=p(2, F_OUT),
      att_dst=p(2, F_OUT),
      att_edge=p(2, F_OUT),
      **kw,
    )
  else:
    conv = functools.partial(
      F.gatv2_conv,
      kernel_src=p(F_IN, 2 * F_OUT),
      kernel_dst=p(F_IN, 2 * F_OUT),
      att=p(2, F_OUT),
      bias_src=p(2 * F_OUT),
      **kw,
    )
  mask = jnp.arange(n) % 5 != 0
  m = np.asarray(mask)
  with_loops = jax.jit(lambda A, x: conv(A, x))
  loops_outside = jax.jit(lambda A, x, m: conv(A, x, self_loop_mask=m))
  ref, got = np.asarray(with_loops(inside, x)), np.asarray(loops_outside(outside, x, mask))
  np.testing.assert_allclose(got[m], ref[m], rtol=1e-5, atol=1e-5)
  assert not np.allclose(got[~m], ref[~m], atol=1e-3)  # rows off the mask get no loop
  # Logits in the hundreds (exp overflows float32 past 88): the joint softmax stays stable.
  big = x * 300
  ref, got = np.asarray(with_loops(inside, big)), np.asarray(loops_outside(outside, big, mask))
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got[m], ref[m], rtol=1e-4, atol=1e-2)
  with pytest.raises(ValueError, match="got add_self_loops=False"):
    conv(outside, x, add_self_loops=False, self_loop_mask=mask)
  with pytest.raises(OperandError, match=f"self_loop_mask must be bool \\[{n}\\]"):
    conv(outside, x, self_loop_mask=mask[:-1])


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
