"""Neighbour sampling (jaxsparse_tc.sampling): the sampled layers against the graph and
brute-force distributions, determinism, and the fixed-shape padded batches."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxsparse_tc as jst
from jaxsparse_tc._src.pattern import OPERAND_ALIGN
from jaxsparse_tc.sampling import (
  NeighborLoader,
  NeighborSampler,
  SampledBatch,
  csr_from_edge_index,
  sample_neighbors,
)


def random_graph(rng, n=80, max_degree=12):
  """A simple directed graph (no repeated pair) with degrees 0..max_degree, as edge_index."""
  pairs = set()
  for v in range(n):
    deg = int(rng.integers(0, max_degree + 1))
    for u in rng.choice(n, size=deg, replace=False):
      pairs.add((int(u), v))
  ei = np.array(sorted(pairs), np.int64).T
  return ei[:, rng.permutation(ei.shape[1])]


MODES = {
  "uniform": dict(replace=False, weighted=False),
  "replace": dict(replace=True, weighted=False),
  "weighted": dict(replace=False, weighted=True),
  "weighted_replace": dict(replace=True, weighted=True),
}


@pytest.mark.parametrize("mode", list(MODES) + ["full"])
def test_layers_follow_the_graph(rng, mode):
  n = 80
  indptr, indices, _ = csr_from_edge_index(random_graph(rng, n), n)
  opts = MODES.get(mode, MODES["uniform"])
  weights = None
  if opts["weighted"]:
    weights = rng.uniform(0.1, 2.0, indices.shape[0])
    weights[rng.random(indices.shape[0]) < 0.2] = 0  # never drawn
  fanouts = [-1, -1] if mode == "full" else [4, 3, 2]
  seeds = rng.choice(n, 10, replace=False)
  layers = sample_neighbors(
    indptr,
    indices,
    seeds,
    fanouts,
    seed=int(rng.integers(2**32)),
    replace=opts["replace"],
    weights=weights,
  )
  assert len(layers) == len(fanouts)
  targets = seeds
  for layer, f in zip(layers, fanouts):
    np.testing.assert_array_equal(layer.targets, targets)
    T, S = targets.shape[0], layer.sources.shape[0]
    np.testing.assert_array_equal(layer.sources[:T], targets)  # targets are the prefix
    assert np.unique(layer.sources).size == S
    t = layer.targets[layer.rows]
    # Every edge is a graph edge from its source to its target, at its CSR position.
    assert np.all((indptr[t] <= layer.edge_ids) & (layer.edge_ids < indptr[t + 1]))
    np.testing.assert_array_equal(indices[layer.edge_ids], layer.sources[layer.cols])
    # Every source but the targets is some edge's source.
    assert set(layer.cols.tolist()) | set(range(T)) == set(range(S))
    deg = np.diff(indptr)[targets]
    counts = np.bincount(layer.rows, minlength=T)
    if weights is not None:
      pos = np.array([np.sum(weights[indptr[v] : indptr[v + 1]] > 0) for v in targets])
      assert np.all(weights[layer.edge_ids] > 0)
    else:
      pos = deg
    if mode == "full":
      np.testing.assert_array_equal(counts, deg)
      for i, v in enumerate(targets):
        np.testing.assert_array_equal(
          np.sort(layer.edge_ids[layer.rows == i]), np.arange(indptr[v], indptr[v + 1])
        )
    elif opts["replace"]:
      np.testing.assert_array_equal(counts, np.where(pos > 0, f, 0))
    else:
      np.testing.assert_array_equal(counts, np.minimum(pos, f))
      pairs = layer.rows.astype(np.int64) * S + layer.cols
      assert np.unique(pairs).size == pairs.size  # no repeated (target, source)
    targets = layer.sources


def test_deterministic_for_a_seed_whatever_the_threads(rng):
  n = 3000
  ei = np.stack([rng.integers(0, n, 40000), rng.integers(0, n, 40000)])
  indptr, indices, _ = csr_from_edge_index(ei, n)
  seeds = rng.choice(n, 1500, replace=False)
  w = rng.uniform(0, 1, indices.shape[0])
  for kw in [dict(), dict(replace=True), dict(weights=w)]:
    runs = [
      sample_neighbors(indptr, indices, seeds, [5, 3], seed=7, threads=t, **kw) for t in (1, 3, 1)
    ]
    for other in runs[1:]:
      for a, b in zip(runs[0], other):
        for x, y in zip(a, b):
          np.testing.assert_array_equal(x, y)
    other_seed = sample_neighbors(indptr, indices, seeds, [5, 3], seed=8, **kw)
    assert not np.array_equal(other_seed[0].edge_ids, runs[0][0].edge_ids)


def star_graph(k, weights):
  """k targets 0..k-1, each with the same in-neighbours k .. k + len(weights) - 1."""
  d = len(weights)
  src = np.tile(np.arange(k, k + d), k)
  dst = np.repeat(np.arange(k), d)
  indptr, indices, order = csr_from_edge_index(np.stack([src, dst]), k + d)
  return indptr, indices, np.tile(np.asarray(weights, np.float64), k)[order]


def subset_counts(layer, k, d, size):
  """How often each `size`-subset of the d neighbours (by CSR offset) was drawn."""
  subsets = {s: i for i, s in enumerate(itertools.combinations(range(d), size))}
  counts = np.zeros(len(subsets))
  offsets = layer.edge_ids - d * layer.targets[layer.rows]
  for i in range(k):
    counts[subsets[tuple(sorted(offsets[layer.rows == i].tolist()))]] += 1
  return counts, list(subsets)


def successive_probability(subset, w):
  """Brute force: probability that successive draws without replacement, each proportional to
  the remaining weights, pick exactly `subset`."""
  total = 0.0
  for order in itertools.permutations(subset):
    p, left = 1.0, float(np.sum(w))
    for j in order:
      p *= w[j] / left
      left -= w[j]
    total += p
  return total


def chi_square_ok(counts, probs):
  expected = counts.sum() * np.asarray(probs)
  stat = np.sum((counts - expected) ** 2 / expected)
  return stat < stats.chi2.ppf(1 - 1e-4, len(probs) - 1), stat


@pytest.mark.parametrize("seed", [3, 11])
def test_uniform_draws_match_brute_force(seed):
  k, d, f = 3000, 6, 3
  indptr, indices, _ = star_graph(k, [1.0] * d)
  (layer,) = sample_neighbors(indptr, indices, np.arange(k), [f], seed=seed)
  counts, subsets = subset_counts(layer, k, d, f)
  ok, stat = chi_square_ok(counts, [successive_probability(s, np.ones(d)) for s in subsets])
  assert ok, stat
  (layer,) = sample_neighbors(indptr, indices, np.arange(k), [f], seed=seed, replace=True)
  cells = np.bincount(layer.edge_ids - d * layer.targets[layer.rows], minlength=d)
  ok, stat = chi_square_ok(cells, np.full(d, 1 / d))
  assert ok, stat


def test_large_fanout_is_uniform_without_repeats():
  k, d, f = 400, 100, 70  # past the small-fanout path's linear search
  indptr, indices, _ = star_graph(k, [1.0] * d)
  (layer,) = sample_neighbors(indptr, indices, np.arange(k), [f], seed=23)
  np.testing.assert_array_equal(np.bincount(layer.rows, minlength=k), np.full(k, f))
  pairs = layer.rows.astype(np.int64) * d + layer.edge_ids % d
  assert np.unique(pairs).size == pairs.size
  # Inclusion counts are less spread than multinomial ones: the test is conservative.
  ok, stat = chi_square_ok(
    np.bincount(layer.edge_ids - d * layer.rows, minlength=d), np.full(d, 1 / d)
  )
  assert ok, stat


@pytest.mark.parametrize("seed", [5, 17])
def test_weighted_draws_favour_heavy_edges(seed):
  k, f = 3000, 2
  w = np.array([1.0, 2.0, 3.0, 0.0, 6.0, 12.0])
  d = w.size
  indptr, indices, weights = star_graph(k, w)
  (layer,) = sample_neighbors(indptr, indices, np.arange(k), [f], seed=seed, weights=weights)
  counts, subsets = subset_counts(layer, k, d, f)
  probs = np.array([successive_probability(s, w) for s in subsets])
  assert counts[probs == 0].sum() == 0  # the zero-weight edge is never drawn
  ok, stat = chi_square_ok(counts[probs > 0], probs[probs > 0])
  assert ok, stat
  inclusion = np.bincount(layer.edge_ids - d * layer.targets[layer.rows], minlength=d)
  assert inclusion[5] > inclusion[4] > inclusion[2] > inclusion[1] > inclusion[0] > 0
  (layer,) = sample_neighbors(
    indptr, indices, np.arange(k), [f], seed=seed, weights=weights, replace=True
  )
  cells = np.bincount(layer.edge_ids - d * layer.targets[layer.rows], minlength=d)
  assert cells[3] == 0
  ok, stat = chi_square_ok(cells[w > 0], w[w > 0] / w.sum())
  assert ok, stat


# -- padded batches ------------------------------------------------------------------------------


def sage_forward(params, h, blocks):
  """A mean-aggregation SAGE-style stack over padded blocks (outermost first)."""
  for block, (w_neigh, w_root) in zip(blocks, params):
    ones = jnp.ones((h.shape[0], 1), h.dtype)
    agg = jst.spmm(block.A, h) / jnp.maximum(jst.spmm(block.A, ones), 1)
    h = jnp.tanh(block.dst(agg) @ w_neigh + block.dst(h) @ w_root)
  return h


def sage_reference(params, x, layers):
  """The same stack on the unpadded layers, dense float64."""
  h = x[layers[-1].sources].astype(np.float64)
  for layer, (w_neigh, w_root) in zip(layers[::-1], params):
    T, S = layer.targets.shape[0], layer.sources.shape[0]
    A = np.zeros((T, S))
    np.add.at(A, (layer.rows, layer.cols), 1.0)
    agg = (A @ h) / np.maximum(A.sum(1, keepdims=True), 1)
    h = np.tanh(agg @ np.asarray(w_neigh, np.float64) + h[:T] @ np.asarray(w_root, np.float64))
  return h


def make_params(rng, dims):
  return [
    (
      jnp.asarray(rng.normal(size=(a, b)) / np.sqrt(a), jnp.float32),
      jnp.asarray(rng.normal(size=(a, b)) / np.sqrt(a), jnp.float32),
    )
    for a, b in zip(dims[:-1], dims[1:])
  ]


@pytest.mark.parametrize(
  "fanouts, replace",
  [([4, 3], False), ([4, 3], True), ([-1, 2], False), ([1, 0], False), ([40, 1], False)],
)
def test_padding_is_inert(rng, fanouts, replace):
  n, d = 120, 5
  ei = random_graph(rng, n, max_degree=9)
  sampler = NeighborSampler.from_edge_index(ei, n, fanouts, batch_size=16, replace=replace)
  x = rng.normal(size=(n, d)).astype(np.float32)
  params = make_params(rng, [d, 6, 3])
  seeds = rng.choice(n, 11, replace=False)  # fewer than batch_size: padded seed rows
  layers = sampler.sample(seeds, seed=int(rng.integers(2**32)))
  for layer in layers:  # edge ids are columns of edge_index
    np.testing.assert_array_equal(ei[0, layer.edge_ids], layer.sources[layer.cols])
    np.testing.assert_array_equal(ei[1, layer.edge_ids], layer.targets[layer.rows])
  batch = sampler.pad(layers)
  if fanouts == [40, 1]:  # the inner layer's output is padded up to the outer one's sources
    assert batch.blocks[0].num_dst > batch.blocks[0].num_src
  h0 = jnp.asarray(x)[batch.input_nodes]
  out = jax.jit(sage_forward)(params, h0, batch.blocks)
  assert out.shape == (16, 3)
  ref = sage_reference(params, x, layers)
  np.testing.assert_allclose(np.asarray(out)[:11], ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(batch.seed_mask), np.arange(16) < 11)

  r = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)

  def loss(h0):
    out = sage_forward(params, h0, batch.blocks)
    return jnp.sum(out * r * batch.seed_mask[:, None])

  g = np.asarray(jax.grad(loss)(h0))
  S = layers[-1].sources.shape[0]
  assert g.shape[0] > S
  assert np.all(g[S:] == 0), "gradient reaches padding rows"
  assert np.all(np.any(g[:11] != 0, axis=1))  # the seeds' own rows get gradient


def test_edge_values_follow_the_edge_slots(rng):
  """Per-edge values (edge weights of the input graph) reach the block's matrix through
  edge_ids and values_from_input; padding slots carry zero."""
  n, d = 90, 3
  ei = random_graph(rng, n, max_degree=8)
  w = rng.uniform(0.5, 2.0, ei.shape[1]).astype(np.float32)
  sampler = NeighborSampler.from_edge_index(ei, n, [3], batch_size=10, replace=True)
  (layer,) = sampler.sample(rng.choice(n, 7, replace=False), seed=int(rng.integers(2**32)))
  (block,) = sampler.pad([layer]).blocks
  vals = jnp.where(block.edge_mask, jnp.asarray(w)[block.edge_ids], 0)
  A = block.A.with_values(block.A.values_from_input(vals))
  h = rng.normal(size=(block.num_src, d)).astype(np.float32)
  out = np.asarray(jst.spmm(A, jnp.asarray(h)))
  T, S = layer.targets.shape[0], layer.sources.shape[0]
  dense = np.zeros((T, S))
  np.add.at(dense, (layer.rows, layer.cols), w[layer.edge_ids])
  np.testing.assert_allclose(out[:T], dense @ h[:S].astype(np.float64), rtol=1e-5, atol=1e-5)
  assert np.all(out[T:] == 0)


def test_one_trace_for_every_batch(rng, capsys):
  n, d = 150, 4
  ei = random_graph(rng, n, max_degree=10)
  sampler = NeighborSampler.from_edge_index(ei, n, [5, 3], batch_size=12)
  train = rng.choice(n, 62, replace=False)
  loader = NeighborLoader(sampler, train, seed=3, prefetch=2, progress=True)
  assert len(loader) == 6
  x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
  y = jnp.asarray(rng.normal(size=(n, 2)), jnp.float32)
  params = make_params(rng, [d, 8, 2])
  traces = []

  @jax.jit
  def step(params, batch):
    traces.append(1)

    def loss(params):
      out = sage_forward(params, x[batch.input_nodes], batch.blocks)
      err = jnp.sum((out - y[batch.seeds]) ** 2, axis=1)
      return jnp.sum(err * batch.seed_mask) / jnp.sum(batch.seed_mask)

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

  seen, losses = [], []
  for _ in range(2):
    for batch in loader:
      value, params = step(params, batch)
      losses.append(float(value))
      seen.append(np.asarray(batch.seeds)[np.asarray(batch.seed_mask)])
  assert len(traces) == 1
  assert len(losses) == 12 and np.all(np.isfinite(losses))
  for e in range(2):  # each epoch covers the training nodes once, in a new order
    np.testing.assert_array_equal(np.sort(np.concatenate(seen[6 * e : 6 * e + 6])), np.sort(train))
  assert not np.array_equal(np.concatenate(seen[:6]), np.concatenate(seen[6:]))
  err = capsys.readouterr().err
  assert "NeighborLoader epoch 0: 6/6 batches" in err and "epoch 1: 6/6" in err


def test_loader_is_deterministic_for_a_seed(rng):
  n = 100
  ei = random_graph(rng, n)
  sampler = NeighborSampler.from_edge_index(ei, n, [3, 2], batch_size=20)
  train = rng.choice(n, 50, replace=False)
  runs = []
  for prefetch in (0, 3):
    loader = NeighborLoader(sampler, train, seed=9, prefetch=prefetch)
    runs.append([(np.asarray(b.seeds), np.asarray(b.input_nodes)) for b in loader])
  for (s0, i0), (s1, i1) in zip(*runs):
    np.testing.assert_array_equal(s0, s1)
    np.testing.assert_array_equal(i0, i1)


def test_max_sources_cap(rng):
  n = 100
  ei = random_graph(rng, n, max_degree=12)
  sampler = NeighborSampler.from_edge_index(ei, n, [6], batch_size=10, max_sources=[10])
  seeds = np.flatnonzero(np.bincount(ei[1], minlength=n) >= 3)[:10]
  with pytest.raises(ValueError, match=r"max_sources\[0\]"):
    sampler.batch(seeds, seed=0)
  with pytest.raises(ValueError, match="max_sources"):
    NeighborSampler.from_edge_index(ei, n, [6], batch_size=10, max_sources=[5])


def test_bad_inputs_name_the_argument(rng):
  n = 30
  indptr, indices, _ = csr_from_edge_index(random_graph(rng, n), n)
  call = lambda **kw: sample_neighbors(
    kw.pop("indptr", indptr),
    indices,
    kw.pop("seeds", [0, 1]),
    kw.pop("fanouts", [2]),
    seed=kw.pop("seed", 0),
    **kw,
  )
  with pytest.raises(ValueError, match=r"fanouts\[1\].*got -2"):
    call(fanouts=[2, -2])
  with pytest.raises(ValueError, match="fanouts"):
    call(fanouts=3)
  with pytest.raises(ValueError, match=r"seeds hold node ids in \[0, 30\]"):
    call(seeds=[0, 30])
  with pytest.raises(ValueError, match="seeds must hold at least one"):
    call(seeds=np.zeros(0, np.int64))
  with pytest.raises(ValueError, match="seeds must be distinct"):
    call(seeds=[1, 1])
  with pytest.raises(ValueError, match=r"weights must have shape \[nnz="):
    call(weights=np.ones(indices.shape[0] + 1))
  with pytest.raises(ValueError, match="weights must be finite and >= 0"):
    call(weights=-np.ones(indices.shape[0]))
  with pytest.raises(ValueError, match="seed must be"):
    call(seed=-1)
  with pytest.raises(ValueError, match="indptr"):
    call(indptr=indptr[::-1].copy())
  ei = random_graph(rng, n)
  with pytest.raises(ValueError, match=r"edge_weight must have shape \[E="):
    NeighborSampler.from_edge_index(ei, n, [2], batch_size=4, edge_weight=np.ones(3))
  with pytest.raises(ValueError, match="batch_size"):
    NeighborSampler.from_edge_index(ei, n, [2], batch_size=0)
  sampler = NeighborSampler.from_edge_index(ei, n, [2], batch_size=4)
  with pytest.raises(ValueError, match="at most batch_size=4"):
    sampler.sample(np.arange(5), seed=0)
  with pytest.raises(ValueError, match=r"seeds hold node ids"):
    NeighborLoader(sampler, [0, 99])
  with pytest.raises(ValueError, match="prefetch"):
    NeighborLoader(sampler, [0, 1], prefetch=-1)


@pytest.mark.parametrize("case", ["uniform", "replace", "multigraph", "edge_order"])
def test_blocks_equal_padded_matrix(rng, case):
  """pad builds each block's format in one native call: the same arrays, array by array, as
  nn.batch.padded_matrix builds from the layer's edge_index (repeated draws summed, dummy
  entries in padding rows and columns)."""
  from jaxsparse_tc._src.nn.batch import padded_matrix

  n = 160
  ei = random_graph(rng, n, max_degree=14)
  if case == "multigraph":  # repeated (u, v) pairs: distinct CSR positions, one matrix entry
    ei = np.concatenate([ei, ei[:, rng.choice(ei.shape[1], 40, replace=False)]], axis=1)
  sampler = NeighborSampler.from_edge_index(ei, n, [6, 4], batch_size=24, replace=case == "replace")
  layers = sampler.sample(rng.choice(n, 19, replace=False), seed=int(rng.integers(2**32)))
  if case == "edge_order":  # edges in no particular order (not grouped by target)
    perms = [rng.permutation(x.rows.shape[0]) for x in layers]
    layers = [
      x._replace(rows=x.rows[p], cols=x.cols[p], edge_ids=x.edge_ids[p])
      for x, p in zip(layers, perms)
    ]
  if case in ("replace", "multigraph"):
    keys = [x.rows.astype(np.int64) * n + x.cols for x in layers]
    assert any(np.unique(k).size < k.size for k in keys), "no repeated entry to sum"
  batch = sampler.pad(layers)
  for layer, budget, block in zip(layers, sampler.budgets, batch.blocks[::-1]):
    ref, _ = padded_matrix(np.stack([layer.cols, layer.rows]), layer.sources.shape[0], budget)
    got_leaves, got_aux = jax.tree_util.tree_flatten(block.A)
    ref_leaves, ref_aux = jax.tree_util.tree_flatten(ref)
    assert got_aux == ref_aux
    assert len(got_leaves) == len(ref_leaves)
    for g, r in zip(got_leaves, ref_leaves):
      assert g.dtype == r.dtype and g.shape == r.shape
      np.testing.assert_array_equal(np.asarray(g), np.asarray(r))


def test_pad_rejects_bad_layers(rng):
  n = 60
  sampler = NeighborSampler.from_edge_index(random_graph(rng, n), n, [3], batch_size=8)
  (layer,) = sampler.sample(rng.choice(n, 5, replace=False), seed=1)
  S = layer.sources.shape[0]
  with pytest.raises(ValueError, match=r"layers\[0\].cols"):
    sampler.pad([layer._replace(cols=layer.cols + S)])
  with pytest.raises(ValueError, match=r"layers\[0\].rows"):
    sampler.pad([layer._replace(rows=layer.rows.astype(np.float32))])


def test_max_edges_cap(rng):
  """max_edges shrinks the edge slots (and so the sources' bound); a batch over it raises."""
  n = 100
  ei = random_graph(rng, n, max_degree=12)
  seeds = np.flatnonzero(np.bincount(ei[1], minlength=n) >= 6)[:10]
  assert seeds.size == 10
  sampler = NeighborSampler.from_edge_index(ei, n, [6], batch_size=10, max_edges=[30])
  assert sampler.budgets[0].edges == 30 and sampler.max_sources == [40]
  with pytest.raises(ValueError, match=r"max_edges\[0\]"):
    sampler.batch(seeds, seed=0)
  roomy = NeighborSampler.from_edge_index(ei, n, [6], batch_size=10, max_edges=[60])
  (layer,) = roomy.sample(seeds, seed=3)
  assert layer.rows.shape[0] == 60
  (block,) = roomy.pad([layer]).blocks
  assert block.num_edges == 60 and bool(np.all(np.asarray(block.edge_mask)))
  with pytest.raises(ValueError, match="max_edges"):
    NeighborSampler.from_edge_index(ei, n, [6], batch_size=10, max_edges=[0])


@pytest.mark.parametrize("prefetch", [1, 3])
def test_loader_prefetch_gives_the_inline_batches(rng, prefetch):
  """Batches built on `prefetch` threads at once are the ones built inline, in order."""
  n = 120
  ei = random_graph(rng, n, max_degree=10)
  sampler = NeighborSampler.from_edge_index(ei, n, [4, 3], batch_size=8, max_edges=[32, None])
  train = rng.choice(n, 45, replace=False)
  seed = int(rng.integers(2**31))
  inline = list(NeighborLoader(sampler, train, seed=seed, prefetch=0))
  threaded = list(NeighborLoader(sampler, train, seed=seed, prefetch=prefetch))
  assert len(inline) == len(threaded) == 6
  for a, b in zip(inline, threaded):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_batch_threads_change_nothing_but_speed(rng):
  """A call's `threads` (the loader's per-worker share) gives the sampler's own batch; a
  negative count is refused by name."""
  n = 300
  ei = random_graph(rng, n, max_degree=12)
  sampler = NeighborSampler.from_edge_index(ei, n, [5, 4], batch_size=16)
  seeds = rng.choice(n, 16, replace=False)
  seed = int(rng.integers(2**31))
  want = jax.tree_util.tree_leaves(sampler.batch(seeds, seed))
  for threads in (1, 3, 0):
    got = jax.tree_util.tree_leaves(sampler.batch(seeds, seed, threads=threads))
    for x, y in zip(want, got):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with pytest.raises(ValueError, match="threads"):
    sampler.sample(seeds, seed, threads=-1)


def test_batches_travel_packed_and_unpack_alike_in_and_out_of_jit(rng):
  """A sampler's batch is one device buffer per dtype (its pytree leaves); its fields read
  outside a jitted function equal those a jitted function cuts from its arguments, and a
  SampledBatch built from fields flattens to them."""
  n = 200
  ei = random_graph(rng, n, max_degree=9)
  sampler = NeighborSampler.from_edge_index(ei, n, [4, 3], batch_size=12)
  batch = sampler.batch(rng.choice(n, 12, replace=False), seed=int(rng.integers(2**31)))
  leaves = jax.tree_util.tree_leaves(batch)
  assert len(leaves) == len({np.dtype(x.dtype) for x in leaves}) <= 4
  # Every field starts at a multiple of OPERAND_ALIGN bytes of its buffer (the kernels get the
  # slices in place): the buffers are the fields' sizes rounded up, as the native side laid them.
  align = OPERAND_ALIGN // 4
  layout = sampler._layout
  padding = 0
  for buf, members in zip(leaves, layout.groups):
    sizes = [math.prod(layout.specs[i][0]) for i in members]
    assert buf.shape[0] == sum(-(-s // align) * align for s in sizes)
    padding += buf.shape[0] - sum(sizes)
  assert padding > 0  # some fields' sizes are not multiples of the alignment
  fields = lambda b: (  # noqa: E731
    [b.input_nodes, b.input_mask, b.seeds, b.seed_mask]
    + [a for blk in b.blocks for a in jax.tree_util.tree_leaves(blk)]
  )
  outside = fields(batch)
  inside = jax.jit(fields)(batch)
  assert len(outside) == len(inside) > 4
  for a, b in zip(outside, inside):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  built = SampledBatch(batch.blocks, *outside[:4])
  rebuilt = jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(built)))
  for a, b in zip(fields(rebuilt), outside):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_suggest_caps_fit_the_batches(rng):
  """suggest_caps gives caps under the worst-case budgets that the loader's batches fit."""
  n = 2000
  ei = random_graph(rng, n, max_degree=10)  # mean degree 5: batches well under fanout 8
  worst = NeighborSampler.from_edge_index(ei, n, [8, 5], batch_size=32)
  train = rng.choice(n, 200, replace=False)
  max_sources, max_edges = worst.suggest_caps(train, batches=8, slack=1.5, seed=1)
  assert all(a <= b for a, b in zip(max_sources, worst.max_sources))
  assert all(a <= b for a, b in zip(max_edges, worst.max_edges))
  assert max_edges[1] < worst.max_edges[1]  # smaller than the worst case where it matters
  capped = NeighborSampler.from_edge_index(
    ei, n, [8, 5], batch_size=32, max_sources=max_sources, max_edges=max_edges
  )
  for batch in NeighborLoader(capped, train, seed=int(rng.integers(2**31)), prefetch=0):
    assert int(np.sum(np.asarray(batch.seed_mask))) > 0
  with pytest.raises(ValueError, match="slack"):
    worst.suggest_caps(train, slack=0.5)


@pytest.mark.parametrize("threads", [1, 2])
def test_padded_block_errors_raise_from_either_build(rng, threads):
  """A format error inside a block's builds in pad_batch (here a grouped schedule a window of
  38 blocks cannot take) raises ValueError, whichever thread meets it."""
  from jaxsparse_tc._src import extensions
  from jaxsparse_tc._src.nn.batch import Budget

  k = 300
  budget = Budget(nodes=k, edges=k, graphs=1)
  sizes = budget.format_sizes()
  rows = np.zeros(k, np.int32)  # one target with k distinct sources: 38 blocks in its window
  cols = rng.permutation(k).astype(np.int32)
  if threads == 2:
    rows, cols = cols, rows  # the transposed orientation (built on the second thread) fails
  lengths = [budget.num_nodes, budget.nnz, budget.edges, sizes["window_cols"], sizes["blocks"]]
  lengths += [sizes["schedule"], sizes["row_schedule"], 1]  # grouped
  with pytest.raises(ValueError, match="grouped"):
    extensions.cpu_extension().pad_batch(
      [rows],
      [cols],
      [np.zeros(k, np.int64)],
      [k],
      [1],
      [lengths],
      np.arange(k, dtype=np.int64),
      budget.num_nodes,
      np.zeros(1, np.int64),
      1,
      threads=threads,
    )
