"""The GNN toolkit around the operators (issue 31): one direction convention, guardrails, the
SAGE / GIN / GATv2 layers and GAT / Transformer edge features against dense float64
references, edge values after self-loops, traceable normalisation, BCOO interop and matrix
arithmetic, PyG's small graph utilities. CPU kernels; fresh random inputs per test.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsparse_tc as jst
from jaxsparse_tc.nn import functional as F
from jaxsparse_tc.nn import graph


@pytest.fixture(autouse=True)
def _on_cpu():
  with jax.default_device(jax.devices("cpu")[0]):
    yield


def random_graph(rng, n=23, e=90, loops=0):
  """Directed, no duplicates, node n-1 receives nothing; `loops` self-loops."""
  pairs = set()
  while len(pairs) < e:
    s, t = (int(v) for v in rng.integers(0, n - 1, 2))
    if s != t:
      pairs.add((s, t))
  for i in range(loops):
    pairs.add((i, i))
  return np.array(sorted(pairs), np.int64).T


def dense(ei, n, loops="none", w=None):
  a = np.zeros((n, n))
  w = np.ones(ei.shape[1]) if w is None else w
  for (s, t), v in zip(ei.T, w):
    if loops == "replace" and s == t:
      continue
    a[t, s] += v
  if loops == "replace":
    np.fill_diagonal(a, 1.0)
  return a


def f64(x):
  return np.asarray(x, np.float64)


def close(a, b, tol=3e-5):
  b = f64(b)
  np.testing.assert_allclose(f64(a), b, rtol=tol, atol=tol * max(1.0, np.abs(b).max()))


def masked_softmax(logits, mask):
  z = np.where(mask, logits, -np.inf)
  mx = z.max(axis=-1, keepdims=True)
  z = z - np.where(np.isfinite(mx), mx, 0.0)  # rows without entries stay all -inf
  p = np.where(mask, np.exp(z), 0.0)
  return p / np.where(p.sum(-1, keepdims=True) == 0, 1, p.sum(-1, keepdims=True))


# -- direction ------------------------------------------------------------------------------------


def test_one_direction_convention():
  ei = np.array([[0, 0], [1, 2]])  # 0 -> 1, 0 -> 2
  x = jnp.asarray([[1.0], [10.0], [100.0]])
  want = [[0.0], [1.0], [1.0]]  # messages arrive at the targets
  np.testing.assert_array_equal(jst.SparseMatrix.from_edge_index(ei, 3) @ x, want)
  np.testing.assert_array_equal(graph.message_passing_matrix(ei, 3) @ x, want)
  np.testing.assert_array_equal(
    jst.SparseMatrix.from_edge_index(ei, 3, flow="target_to_source") @ x, [[110.0], [0], [0]]
  )
  np.testing.assert_array_equal(
    graph.message_passing_matrix(ei, 3, flow="target_to_source") @ x, [[110.0], [0], [0]]
  )
  with pytest.raises(ValueError, match="flow"):
    graph.message_passing_matrix(ei, 3, flow="up")


# -- guardrails -----------------------------------------------------------------------------------


def test_layers_check_operands(rng):
  ei = random_graph(rng)
  A = graph.message_passing_matrix(ei, 23, add_self_loops=True)
  x = jnp.asarray(rng.normal(size=(23, 4)), jnp.float32)
  W = jnp.ones((4, 3))
  with pytest.raises(TypeError, match=r"layer\(A, x\)"):
    F.gcn_conv(x, A, W)
  with pytest.raises(TypeError, match="edge_index array.*message_passing_matrix"):
    F.gcn_conv(jnp.asarray(ei), x, W)
  with pytest.raises(ValueError, match="must have 23 rows"):
    F.gcn_conv(A, x[:5], W)
  with pytest.raises(TypeError, match="not a"):
    F.gcn_conv(A, (x, x), W)
  # GAT refuses a pattern without self-loops (PyG would attend over added ones)
  bare = graph.message_passing_matrix(ei, 23)
  att = jnp.ones((1, 3))
  with pytest.raises(ValueError, match="lacks self-loops"):
    F.gat_conv(bare, x, W, att, att, heads=1)
  F.gat_conv(bare, x, W, att, att, heads=1, add_self_loops=False)  # as given: allowed
  # bipartite: a single x with a [3, 5] matrix is refused; a pair is taken
  B = jst.SparseMatrix.from_coo([0, 1, 2, 2], [4, 0, 1, 3], shape=(3, 5))
  xs = jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)
  with pytest.raises(ValueError, match="bipartite.*x_src"):
    F.gat_conv(B, xs, W, att, att, heads=1, add_self_loops=False)
  with pytest.raises(ValueError, match="square"):
    F.gat_conv(B, (xs, xs[:3]), W, att, att, heads=1)
  with pytest.raises(ValueError, match="square"):
    F.gcn_conv(B, xs, W)


def test_flax_module_guardrail_messages(rng):
  nnf = pytest.importorskip("jaxsparse_tc.nn.flax")
  from flax import nnx

  ei = random_graph(rng)
  x = rng.normal(size=(23, 4)).astype(np.float32)
  conv = nnf.GCNConv(4, 3, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="expected a SparseMatrix|layer\\(A, x\\)"):
    conv(x, graph.gcn_norm(ei, 23))
  with pytest.raises(TypeError, match="message_passing_matrix"):
    conv(ei, x)


# -- new layers vs dense references ---------------------------------------------------------------


@pytest.mark.parametrize("aggr", ["mean", "add", "max"])
def test_sage_conv(rng, aggr):
  ei = random_graph(rng)
  n = 23
  x = rng.normal(size=(n, 6)).astype(np.float32)
  wl, wr = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
  b = rng.normal(size=4)
  a = dense(ei, n)
  if aggr == "mean":
    agg = a @ f64(x) / np.maximum(a.sum(1, keepdims=True), 1)
  elif aggr == "add":
    agg = a @ f64(x)
  else:
    agg = np.array([f64(x)[a[i] > 0].max(0) if a[i].any() else np.zeros(6) for i in range(n)])
  ref = agg @ wl + b + f64(x) @ wr
  A = graph.message_passing_matrix(ei, n)
  f32 = lambda v: jnp.asarray(v, jnp.float32)
  close(F.sage_conv(A, x, f32(wl), f32(wr), f32(b), aggr=aggr), ref)
  got = F.sage_conv(A, x, f32(wl), None, f32(b), aggr=aggr, normalize=True)
  r = agg @ wl + b
  close(got, r / np.linalg.norm(r, axis=1, keepdims=True))


def test_gin_conv_and_bipartite(rng):
  ei = random_graph(rng)
  n = 23
  x = rng.normal(size=(n, 5)).astype(np.float32)
  w = rng.normal(size=(5, 3))
  nn = lambda h: jnp.tanh(h @ jnp.asarray(w, jnp.float32))
  ref = np.tanh((1.7 * f64(x) + dense(ei, n) @ f64(x)) @ w)
  close(F.gin_conv(graph.message_passing_matrix(ei, n), x, nn, eps=0.7), ref)
  # bipartite: 4 targets, 6 sources
  rows, cols = np.array([0, 0, 1, 3, 3]), np.array([1, 5, 2, 0, 4])
  B = jst.SparseMatrix.from_coo(rows, cols, shape=(4, 6))
  xs, xd = rng.normal(size=(6, 5)), rng.normal(size=(4, 5))
  bd = np.zeros((4, 6))
  bd[rows, cols] = 1
  close(
    F.gin_conv(B, (xs.astype(np.float32), xd.astype(np.float32)), nn, eps=0.2),
    np.tanh((1.2 * xd + bd @ xs) @ w),
  )


def _gat_ref(
  ei, n, x, W, a_s, a_d, heads, concat, edge=None, a_e=None, v2=False, Wd=None, att=None
):
  mask = dense(ei, n, "replace") > 0
  h = (f64(x) @ f64(W)).reshape(n, heads, -1)
  hd = h if Wd is None else (f64(x) @ f64(Wd)).reshape(n, heads, -1)
  outs = []
  for k in range(heads):
    if v2:
      z = hd[:, None, k] + h[None, :, k]  # [i, j, C]
      if edge is not None:
        z = z + edge[:, :, k]
      e = np.where(z > 0, z, 0.2 * z) @ f64(att[k])
    else:
      e = (h[:, k] @ f64(a_d[k]))[:, None] + (h[:, k] @ f64(a_s[k]))[None, :]
      if edge is not None:
        e = e + edge[:, :, k] @ f64(a_e[k])
      e = np.where(e > 0, e, 0.2 * e)
    outs.append(masked_softmax(e, mask) @ h[:, k])
  return np.concatenate(outs, 1) if concat else np.mean(outs, 0)


def _edge_dense(ei, n, attr, We, heads, fill="mean"):
  """Per (target, source) edge embeddings [n, n, H, C] with PyG's loop handling: input loops
  dropped, loops filled with the mean of the target's incoming edge features."""
  fe = attr.shape[1]
  feat = np.zeros((n, n, fe))
  keep = ei[0] != ei[1]
  for (s, t), a in zip(ei.T[keep], attr[keep]):
    feat[t, s] += a
  for i in range(n):
    inc = attr[keep & (ei[1] == i)]
    feat[i, i] = inc.mean(0) if len(inc) else 0.0
  return (feat @ f64(We)).reshape(n, n, heads, -1)


@pytest.mark.parametrize("heads,concat", [(1, True), (3, False)])
def test_gat_edge_features_and_attention_weights(rng, heads, concat):
  n = 23
  ei = random_graph(rng, loops=2)  # input loops: dropped as PyG does
  x = rng.normal(size=(n, 5)).astype(np.float32)
  C = 4
  W = rng.normal(size=(5, heads * C)).astype(np.float32) * 0.5
  a_s, a_d, a_e = (rng.normal(size=(heads, C)).astype(np.float32) for _ in range(3))
  attr = rng.normal(size=(ei.shape[1], 3)).astype(np.float32)
  We = rng.normal(size=(3, heads * C)).astype(np.float32)
  A = graph.message_passing_matrix(ei, n, add_self_loops=True)
  out, alpha = F.gat_conv(
    A,
    x,
    W,
    a_s,
    a_d,
    heads=heads,
    concat=concat,
    edge_attr=attr,
    edge_kernel=We,
    att_edge=a_e,
    return_attention_weights=True,
  )
  edge = _edge_dense(ei, n, attr, We, heads)
  close(out, _gat_ref(ei, n, x, W, a_s, a_d, heads, concat, edge=edge, a_e=a_e))
  assert isinstance(alpha, jst.SparseMatrix) and alpha.values.shape == (heads, A.nnz)
  sums = jax.ops.segment_sum(alpha.values.T, alpha.rows, num_segments=n)
  close(sums, np.ones((n, heads)))


@pytest.mark.parametrize("edges", [False, True])
def test_gatv2_conv(rng, edges):
  n, heads, C = 23, 2, 3
  ei = random_graph(rng)
  x = rng.normal(size=(n, 5)).astype(np.float32)
  Wl, Wr = (rng.normal(size=(5, heads * C)).astype(np.float32) * 0.5 for _ in range(2))
  att = rng.normal(size=(heads, C)).astype(np.float32)
  A = graph.message_passing_matrix(ei, n, add_self_loops=True)
  kw = {}
  edge = None
  if edges:
    attr = rng.normal(size=(ei.shape[1], 2)).astype(np.float32)
    We = rng.normal(size=(2, heads * C)).astype(np.float32)
    kw = dict(edge_attr=attr, edge_kernel=We)
    edge = _edge_dense(ei, n, attr, We, heads)
  got = F.gatv2_conv(A, x, Wl, Wr, att, heads=heads, **kw)
  close(got, _gat_ref(ei, n, x, Wl, None, None, heads, True, edge=edge, v2=True, Wd=Wr, att=att))


def test_transformer_edge_features(rng):
  n, heads, C = 23, 2, 3
  ei = random_graph(rng)
  x = rng.normal(size=(n, 5)).astype(np.float32)
  lin = lambda: (
    rng.normal(size=(5, heads * C)).astype(np.float32) * 0.5,
    rng.normal(size=heads * C).astype(np.float32),
  )
  q, k, v = lin(), lin(), lin()
  attr = rng.normal(size=(ei.shape[1], 2)).astype(np.float32)
  We = rng.normal(size=(2, heads * C)).astype(np.float32)
  A = graph.message_passing_matrix(ei, n)
  out, alpha = F.transformer_conv(
    A, x, q, k, v, heads=heads, edge_attr=attr, edge_kernel=We, return_attention_weights=True
  )
  mask = dense(ei, n) > 0
  E = np.zeros((n, n, heads * C))
  for (s, t), a in zip(ei.T, attr):
    E[t, s] = f64(a) @ f64(We)
  E = E.reshape(n, n, heads, C)
  Q, K, V = ((f64(x) @ f64(w) + f64(b)).reshape(n, heads, C) for w, b in (q, k, v))
  outs = []
  for h in range(heads):
    s = np.einsum("ic,ijc->ij", Q[:, h], K[None, :, h] + E[:, :, h]) / math.sqrt(C)
    p = masked_softmax(s, mask)
    outs.append(np.einsum("ij,ijc->ic", p, V[None, :, h] + E[:, :, h]))
  close(out, np.concatenate(outs, 1))
  assert alpha.values.shape == (heads, A.nnz)


# -- edge values and normalisation ----------------------------------------------------------------


def test_values_from_input_after_self_loops(rng):
  n = 23
  ei = random_graph(rng, loops=3)
  w = rng.uniform(0.5, 2.0, ei.shape[1]).astype(np.float32)
  A = graph.message_passing_matrix(ei, n, add_self_loops=True)
  assert A.input_to_format.shape[0] == ei.shape[1] + n  # edges as given, then the loops
  v = A.values_from_input(jnp.concatenate([w, jnp.zeros(n)]))
  ref = dense(ei, n, w=w)  # the input loops' weights land on the loop entries
  close(A.with_values(v).todense(), ref)
  feats = graph.edge_features(A, np.stack([w, 2 * w], 1))
  assert feats.shape == (A.nnz, 2)
  close(A.with_values(feats[:, 1]).todense(), 2 * ref)
  with pytest.raises(ValueError, match="edge_attr must have shape"):
    graph.edge_features(A, np.ones((A.input_to_format.shape[0] + 1, 2)))


def test_gcn_norm_traceable_in_weights(rng):
  n = 23
  ei = random_graph(rng)
  w = jnp.asarray(rng.uniform(0.5, 2.0, ei.shape[1]), jnp.float32)
  x = jnp.asarray(rng.normal(size=(n, 3)), jnp.float32)

  def loss(w):
    return jnp.sum((graph.gcn_norm(ei, n, w) @ x) ** 2)

  a = dense(ei, n, w=np.asarray(w, np.float64))
  np.fill_diagonal(a, 1.0)
  d = a.sum(1)
  ref = a / np.sqrt(np.outer(d, d))
  close(jax.jit(lambda w: graph.gcn_norm(ei, n, w).todense())(w), ref, 1e-5)
  g = jax.grad(loss)(w)
  eps = 1e-2
  k = int(rng.integers(ei.shape[1]))
  fd = (loss(w.at[k].add(eps)) - loss(w.at[k].add(-eps))) / (2 * eps)
  np.testing.assert_allclose(float(g[k]), float(fd), rtol=2e-2, atol=1e-3)
  with pytest.raises(TypeError, match="normalize_symmetric"):
    jax.jit(lambda e: graph.gcn_norm(e, n).values)(jnp.asarray(ei))


# -- interop and arithmetic -----------------------------------------------------------------------


def test_bcoo_roundtrip_and_arithmetic(rng):
  from jax.experimental import sparse as jsparse

  m, n = 17, 13
  d = rng.normal(size=(m, n)) * (rng.random((m, n)) < 0.3)
  B = jsparse.BCOO.fromdense(jnp.asarray(d, jnp.float32))
  A = jst.SparseMatrix.from_bcoo(B)
  close(A.todense(), d)
  close(jst.interop.to_bcoo(A).todense(), d)
  Ah = A.with_values(jnp.stack([A.values, 2 * A.values]))
  close(Ah.to_bcoo().todense(), np.stack([d, 2 * d]))
  x = rng.normal(size=(5, m)).astype(np.float32)
  close(x @ A, x @ d)
  close(x[0] @ A, x[0] @ d)
  close((2.5 * A).todense(), 2.5 * d)
  close((A * 2 + A - A / 2).todense(), 2.5 * d)
  close((-A).todense(), -d)
  other = jst.SparseMatrix.from_coo([0], [0], shape=(m, n))
  with pytest.raises(ValueError, match="pattern"):
    A + other
  with pytest.raises(TypeError):
    A + jnp.ones((m, n))
  assert jax.jit(lambda v: (A.with_values(v) + A).values)(A.values).shape == (A.nnz,)


# -- PyG's utilities ------------------------------------------------------------------------------


def test_graph_utilities(rng):
  n = 23
  ei = random_graph(rng)
  np.testing.assert_array_equal(graph.degree(ei[1], n), np.bincount(ei[1], minlength=n))
  und = graph.to_undirected(ei, num_nodes=n)
  a = dense(ei, n)
  np.testing.assert_array_equal(dense(und, n), ((a + a.T) > 0).astype(float))
  attr = rng.normal(size=(ei.shape[1], 2))
  und2, merged = graph.to_undirected(ei, attr, n)
  assert merged.shape == (und2.shape[1], 2)
  subset = rng.choice(n, 10, replace=False)
  sub, sattr, emask = graph.subgraph(subset, ei, attr, relabel_nodes=True, num_nodes=n)
  assert sub.max() < 10 and np.all(np.isin(ei[:, emask], subset))
  np.testing.assert_array_equal(sattr, attr[emask])
  kept, mask = graph.dropout_edge(ei, 0.5, rng=int(rng.integers(1 << 30)))
  assert kept.shape[1] == mask.sum() and 0 < mask.sum() < ei.shape[1]
  und_kept, _ = graph.dropout_edge(und, 0.5, rng=1, force_undirected=True)
  ak = dense(und_kept, n)
  np.testing.assert_array_equal(ak, ak.T)
  np.testing.assert_array_equal(graph.dropout_edge(ei, 0.5, training=False)[0], ei)
