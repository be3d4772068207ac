"""jaxsparse_tc.nn: graph helpers and layers against dense float64 references (numpy).

Runs on the CPU kernels (see _on_cpu). The references are written from the papers' / PyG's
formulas on dense matrices built straight from the edge list, independently of the library's
format. Flax and Equinox twins must agree given the same weights; gradients must be finite.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsparse_tc.datasets import load_cora
from jaxsparse_tc.nn import functional as F
from jaxsparse_tc.nn import graph

RTOL, ATOL = 2e-5, 2e-5  # float32 layers vs float64 references


@pytest.fixture(autouse=True)
def _on_cpu():
  """The CPU kernels (exact float32): on a GPU machine the CUDA kernels' tf32 default would
  blur these tolerances; test_layers_gpu_matches_cpu covers the GPU path."""
  with jax.default_device(jax.devices("cpu")[0]):
    yield


def random_graph(n=37, e=160, seed=0, loops=3):
  """A directed random graph (no duplicates) with a few self-loops and some isolated targets."""
  rng = np.random.default_rng(seed)
  pairs = set()
  while len(pairs) < e:
    s, t = rng.integers(0, n, 2)
    if s != t and t % 11 != 5:  # targets 5, 16, 27 receive no edges
      pairs.add((int(s), int(t)))
  for i in range(loops):
    pairs.add((2 * i, 2 * i))
  ei = np.array(sorted(pairs), np.int64).T
  return ei, n


def dense_adj(ei, n, loops="none"):
  """Dense [target, source] adjacency, float64. loops: 'none' (as given), 'replace' (remove,
  then one per node: GAT/AGNN), 'remaining' (add where missing: GCN)."""
  a = np.zeros((n, n))
  for s, t in ei.T:
    a[t, s] += 1.0
  if loops == "replace":
    np.fill_diagonal(a, 1.0)
  elif loops == "remaining":
    d = np.diag(a).copy()
    np.fill_diagonal(a, np.where(d == 0, 1.0, d))
  return a


def masked_softmax(logits, mask):
  z = np.where(mask, logits, -np.inf)
  z = z - z.max(axis=-1, keepdims=True)
  p = np.where(mask, np.exp(z), 0.0)
  return p / p.sum(axis=-1, keepdims=True)


def leaky(x, slope):
  return np.where(x > 0, x, slope * x)


def f64(x):
  return np.asarray(x, np.float64)


def close(a, b, rtol=RTOL, atol=ATOL):
  np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def problem():
  ei, n = random_graph()
  x = np.random.default_rng(1).normal(size=(n, 12)).astype(np.float32)
  return ei, n, x


# -- graph helpers ------------------------------------------------------------------------------


def test_message_passing_matrix_orientation(problem):
  ei, n, x = problem
  M = graph.message_passing_matrix(ei, n)
  ref = np.zeros((n, x.shape[1]))
  np.add.at(ref, ei[1], f64(x)[ei[0]])  # sum of sources' features at each target
  close(M @ jnp.asarray(x), ref)
  close(M.todense(), dense_adj(ei, n))


def test_self_loop_helpers(problem):
  ei, n, _ = problem
  ei2, w2 = graph.add_self_loops(ei, num_nodes=n)
  assert w2 is None and ei2.shape[1] == ei.shape[1] - 3 + n
  assert np.sum(ei2[0] == ei2[1]) == n
  w = np.arange(ei.shape[1], dtype=np.float32) + 1
  ei3, w3 = graph.add_remaining_self_loops(ei, w, num_nodes=n, fill_value=0.5)
  assert ei3.shape[1] == ei.shape[1] + n - 3
  loops = ei3[0] == ei3[1]
  kept = {int(i): float(v) for i, v in zip(ei3[0, loops], w3[loops])}
  for i in range(3):  # existing loops keep their weight
    assert kept[2 * i] == w[np.nonzero((ei[0] == 2 * i) & (ei[1] == 2 * i))[0][0]]
  assert kept[1] == 0.5
  M = graph.message_passing_matrix(ei, n, add_self_loops=True)
  close(M.todense(), dense_adj(ei, n, "replace"))


def test_gcn_norm_matches_dense(problem):
  ei, n, _ = problem
  a = dense_adj(ei, n, "remaining")
  d = a.sum(1)
  ref = a / np.sqrt(d)[:, None] / np.sqrt(d)[None, :]
  close(graph.gcn_norm(ei, n).todense(), ref)
  # weighted, no self-loops added: a row with no edges stays zero (no division by zero)
  w = np.random.default_rng(3).uniform(0.5, 2.0, ei.shape[1])
  aw = np.zeros((n, n))
  np.add.at(aw, (ei[1], ei[0]), w)
  dw = aw.sum(1)
  inv = np.where(dw > 0, 1 / np.sqrt(np.where(dw > 0, dw, 1)), 0)
  close(graph.gcn_norm(ei, n, w, add_self_loops=False).todense(), inv[:, None] * aw * inv[None, :])


def test_normalize_symmetric_traced(problem):
  ei, n, _ = problem
  M = graph.message_passing_matrix(ei, n, add_self_loops=True)
  got = jax.jit(lambda v: graph.normalize_symmetric(M, v).values)(M.values)
  close(M.with_values(got).todense(), graph.gcn_norm(ei, n).todense(), rtol=1e-6)


def test_load_cora():
  ds = load_cora()
  assert ds.features.shape == (2708, 1433) and ds.features.dtype == np.float32
  assert ds.edge_index.shape == (2, 10556) and ds.num_classes == 7
  assert (len(ds.train_idx), len(ds.val_idx), len(ds.test_idx)) == (140, 500, 1000)
  assert set(np.unique(ds.features)) <= {0.0, 1.0}
  assert not set(ds.train_idx) & set(ds.test_idx)
  norm = load_cora(normalize_features=True).features
  sums = norm.sum(1)
  np.testing.assert_allclose(sums[sums > 0], 1.0, rtol=1e-5)


# -- layer math vs dense references (functional core) -------------------------------------------


def test_gcn_conv(problem):
  ei, n, x = problem
  rng = np.random.default_rng(2)
  for fout in (5, 20):  # both propagation orders (aggregate-then-transform for wide outputs)
    W = rng.normal(size=(12, fout)).astype(np.float32)
    b = rng.normal(size=fout).astype(np.float32)
    a = dense_adj(ei, n, "remaining")
    d = a.sum(1)
    ref = (a / np.sqrt(np.outer(d, d))) @ (f64(x) @ f64(W)) + b
    close(F.gcn_conv(graph.gcn_norm(ei, n), x, jnp.asarray(W), jnp.asarray(b)), ref)


def test_gcn_conv_input_layer_backward_has_no_spmm(problem):
  """At equal widths x is propagated first, so the kernel's gradient needs one SpMM (the
  forward's), not a second one over A^T: dW = (A x)^T g."""
  from jaxsparse_tc._src.spmm import spmm_p

  ei, n, x = problem
  A = graph.gcn_norm(ei, n)
  W = jnp.asarray(np.random.default_rng(4).normal(size=(12, 12)), jnp.float32)
  loss = lambda W: jnp.sum(F.gcn_conv(A, x, W) ** 2)  # noqa: E731
  jaxpr = str(jax.make_jaxpr(jax.grad(loss))(W))
  assert jaxpr.count(spmm_p.name) == 1, jaxpr
  a = dense_adj(ei, n, "remaining")
  d = a.sum(1)
  ax = (a / np.sqrt(np.outer(d, d))) @ f64(x)
  close(jax.grad(loss)(W), ax.T @ (2 * ax @ f64(W)), rtol=1e-4)


def gat_reference(ei, n, x, W, att_src, att_dst, bias, heads, concat, slope=0.2):
  mask = dense_adj(ei, n, "replace") > 0
  h = (f64(x) @ f64(W)).reshape(n, heads, -1)
  outs = []
  for k in range(heads):
    e = leaky((h[:, k] @ f64(att_dst[k]))[:, None] + (h[:, k] @ f64(att_src[k]))[None, :], slope)
    outs.append(masked_softmax(e, mask) @ h[:, k])
  out = np.concatenate(outs, 1) if concat else np.mean(outs, 0)
  return out + f64(bias)


@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (3, False)])
def test_gat_conv(problem, heads, concat):
  ei, n, x = problem
  rng = np.random.default_rng(4)
  C = 6
  W = rng.normal(size=(12, heads * C)).astype(np.float32) * 0.5
  a_s, a_d = (rng.normal(size=(heads, C)).astype(np.float32) for _ in range(2))
  b = rng.normal(size=heads * C if concat else C).astype(np.float32)
  M = graph.message_passing_matrix(ei, n, add_self_loops=True)
  got = F.gat_conv(M, x, W, a_s, a_d, b, heads=heads, concat=concat)
  close(got, gat_reference(ei, n, x, W, a_s, a_d, b, heads, concat))


def agnn_reference(ei, n, x, beta):
  mask = dense_adj(ei, n, "replace") > 0
  xn = f64(x) / np.linalg.norm(f64(x), axis=1, keepdims=True)
  return masked_softmax(beta * (xn @ xn.T), mask) @ f64(x)


def test_agnn_conv(problem):
  ei, n, x = problem
  M = graph.message_passing_matrix(ei, n, add_self_loops=True)
  for beta in (1.0, 3.5):
    close(F.agnn_conv(M, x, jnp.float32(beta)), agnn_reference(ei, n, x, beta))


def transformer_reference(ei, n, x, q, k, v, skip, beta_w, heads, concat):
  mask = dense_adj(ei, n, "replace") > 0
  x = f64(x)
  Q, K, V = ((x @ f64(w) + f64(bb)).reshape(n, heads, -1) for w, bb in (q, k, v))
  C = Q.shape[-1]
  outs = [masked_softmax(Q[:, h] @ K[:, h].T / math.sqrt(C), mask) @ V[:, h] for h in range(heads)]
  out = np.concatenate(outs, 1) if concat else np.mean(outs, 0)
  if skip is not None:
    r = x @ f64(skip[0]) + (0 if skip[1] is None else f64(skip[1]))
    if beta_w is not None:
      g = 1 / (1 + np.exp(-(np.concatenate([out, r, out - r], 1) @ f64(beta_w))))
      out = g * r + (1 - g) * out
    else:
      out = out + r
  return out


@pytest.mark.parametrize(
  "heads,concat,root,beta",
  [(1, True, True, False), (2, True, True, True), (2, False, False, False)],
)
def test_transformer_conv(problem, heads, concat, root, beta):
  ei, n, x = problem
  rng = np.random.default_rng(5)
  C = 4
  lin = lambda i, o: (
    rng.normal(size=(i, o)).astype(np.float32) * 0.4,  # noqa: E731
    rng.normal(size=o).astype(np.float32),
  )
  q, k, v = lin(12, heads * C), lin(12, heads * C), lin(12, heads * C)
  out_w = heads * C if concat else C
  skip = lin(12, out_w) if root else None
  beta_w = rng.normal(size=(3 * out_w, 1)).astype(np.float32) if beta else None
  M = graph.message_passing_matrix(ei, n, add_self_loops=True)
  got = F.transformer_conv(M, x, q, k, v, skip, beta_w, heads=heads, concat=concat)
  close(got, transformer_reference(ei, n, x, q, k, v, skip, beta_w, heads, concat))


# -- Flax and Equinox modules -------------------------------------------------------------------


def _flax_eqx():
  pytest.importorskip("flax")
  pytest.importorskip("equinox")
  from jaxsparse_tc.nn import equinox as nne
  from jaxsparse_tc.nn import flax as nnf

  return nnf, nne


def copy_flax_to_eqx(flax_model, eqx_model):
  """Copies every nnx.Param of a Flax model onto the same-named leaf of its Equinox twin."""
  import equinox as eqx
  from flax import nnx

  def walk(m, path):
    for p in path:
      m = m[p] if isinstance(p, int) else getattr(m, p)
    return m

  for path, var in nnx.to_flat_state(nnx.state(flax_model, nnx.Param)):
    value = jnp.asarray(var[...])
    assert walk(eqx_model, path).shape == value.shape, path
    eqx_model = eqx.tree_at(lambda m, p=path: walk(m, p), eqx_model, value)
  return eqx_model


def _builders(nnf, nne):
  from flax import nnx

  f, c = 12, 5
  return {
    "GCNConv": (
      lambda: nnf.GCNConv(f, 7, rngs=nnx.Rngs(0)),
      lambda: nne.GCNConv(f, 7, key=jax.random.key(9)),
      "gcn",
    ),
    "GATConv": (
      lambda: nnf.GATConv(f, 4, heads=3, rngs=nnx.Rngs(0)),
      lambda: nne.GATConv(f, 4, heads=3, key=jax.random.key(9)),
      "loops",
    ),
    "AGNNConv": (lambda: nnf.AGNNConv(), lambda: nne.AGNNConv(), "loops"),
    "TransformerConv": (
      lambda: nnf.TransformerConv(f, 4, heads=2, beta=True, rngs=nnx.Rngs(0)),
      lambda: nne.TransformerConv(f, 4, heads=2, beta=True, key=jax.random.key(9)),
      "loops",
    ),
    "GraphTransformerLayer": (
      lambda: nnf.GraphTransformerLayer(f, heads=3, dropout=0.3, rngs=nnx.Rngs(0)),
      lambda: nne.GraphTransformerLayer(f, heads=3, dropout=0.3, key=jax.random.key(9)),
      "loops",
    ),
    "GCN": (
      lambda: nnf.GCN(f, 8, c, rngs=nnx.Rngs(0)),
      lambda: nne.GCN(f, 8, c, key=jax.random.key(9)),
      "gcn",
    ),
    "GAT": (
      lambda: nnf.GAT(f, 4, c, heads=2, rngs=nnx.Rngs(0)),
      lambda: nne.GAT(f, 4, c, heads=2, key=jax.random.key(9)),
      "loops",
    ),
    "AGNN": (
      lambda: nnf.AGNN(f, 8, c, rngs=nnx.Rngs(0)),
      lambda: nne.AGNN(f, 8, c, key=jax.random.key(9)),
      "loops",
    ),
    "GraphTransformer": (
      lambda: nnf.GraphTransformer(f, 8, c, heads=2, rngs=nnx.Rngs(0)),
      lambda: nne.GraphTransformer(f, 8, c, heads=2, key=jax.random.key(9)),
      "loops",
    ),
  }


def _matrix_for(kind, ei, n):
  """The matrix a model of this kind expects: GCN-normalised, or message passing + self-loops."""
  if kind == "gcn":
    return graph.gcn_norm(ei, n)
  return graph.message_passing_matrix(ei, n, add_self_loops=True)


NAMES = [
  "GCNConv",
  "GATConv",
  "AGNNConv",
  "TransformerConv",
  "GraphTransformerLayer",
  "GCN",
  "GAT",
  "AGNN",
  "GraphTransformer",
]


@pytest.mark.parametrize("name", NAMES)
def test_flax_equals_equinox(problem, name):
  import equinox as eqx

  nnf, nne = _flax_eqx()
  ei, n, x = problem
  make_f, make_e, kind = _builders(nnf, nne)[name]
  A = _matrix_for(kind, ei, n)
  fm, em = make_f(), make_e()
  fm.eval()
  em = eqx.nn.inference_mode(copy_flax_to_eqx(fm, em))
  yf, ye = fm(A, x), em(A, x)
  assert yf.shape == ye.shape and yf.shape[0] == n
  np.testing.assert_allclose(np.asarray(yf), np.asarray(ye), rtol=1e-5, atol=1e-5)
  # the weights copied are the ones used: perturbing one changes the output
  leaves = [p for p in jax.tree_util.tree_leaves(eqx.filter(em, eqx.is_inexact_array))]
  assert leaves
  em2 = jax.tree_util.tree_map(lambda a: a + 0.5 if eqx.is_inexact_array(a) else a, em)
  assert not np.allclose(np.asarray(em2(A, x)), np.asarray(ye))


@pytest.mark.parametrize("name", ["GATv2Conv", "GATConv-edges", "SAGEConv", "GINConv", "MLP"])
def test_flax_equals_equinox_through_the_shared_core(rng, problem, name):
  """The layers the list above leaves out, with edge features and both kinds of their options:
  Flax and Equinox run one forward core (_src/nn/layers.py), so given the same weights they
  agree, and a perturbed weight changes the output."""
  import equinox as eqx
  from flax import nnx

  nnf, nne = _flax_eqx()
  ei, n, x = problem
  f = x.shape[1]
  attr = rng.normal(size=(ei.shape[1], 3)).astype(np.float32)
  A = graph.message_passing_matrix(ei, n, add_self_loops=name.startswith("GAT"))
  call = lambda m: m(A, x)  # noqa: E731
  if name == "GATv2Conv":
    make = lambda mod, **k: mod.GATv2Conv(f, 4, heads=2, edge_dim=3, concat=False, **k)  # noqa: E731
    call = lambda m: m(A, x, edge_attr=attr)  # noqa: E731
  elif name == "GATConv-edges":
    make = lambda mod, **k: mod.GATConv(f, 4, heads=3, edge_dim=3, **k)  # noqa: E731
    call = lambda m: m(A, x, edge_attr=attr)  # noqa: E731
  elif name == "SAGEConv":
    make = lambda mod, **k: mod.SAGEConv(f, 6, aggr="max", normalize=True, **k)  # noqa: E731
  elif name == "GINConv":
    make = lambda mod, **k: mod.GINConv(mod.MLP([f, 8, 5], **k), eps=0.3, train_eps=True)  # noqa: E731
  else:
    make = lambda mod, **k: mod.MLP([f, 8, 7, 5], **k)  # noqa: E731
    call = lambda m: m(x)  # noqa: E731
  fm = make(nnf, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
  em = make(nne, key=jax.random.key(int(rng.integers(1 << 30))))
  fm.eval()
  em = eqx.nn.inference_mode(copy_flax_to_eqx(fm, em))
  yf, ye = call(fm), call(em)
  assert yf.shape == ye.shape and yf.shape[0] == n and np.abs(np.asarray(yf)).max() > 0
  np.testing.assert_allclose(np.asarray(yf), np.asarray(ye), rtol=1e-5, atol=1e-5)
  em2 = jax.tree_util.tree_map(lambda a: a + 0.5 if eqx.is_inexact_array(a) else a, em)
  assert not np.allclose(np.asarray(call(em2)), np.asarray(ye))


def test_flax_gcnconv_matches_reference(problem):
  nnf, _ = _flax_eqx()
  from flax import nnx

  ei, n, x = problem
  conv = nnf.GCNConv(12, 7, rngs=nnx.Rngs(3))
  conv.bias[...] = jnp.arange(7, dtype=jnp.float32)
  a = dense_adj(ei, n, "remaining")
  d = a.sum(1)
  ref = (a / np.sqrt(np.outer(d, d))) @ f64(x) @ f64(conv.lin.kernel[...]) + np.arange(7)
  close(conv(graph.gcn_norm(ei, n), x), ref)


def test_flax_gat_model_reference(problem):
  """The two-layer GAT model in eval mode against the dense reference, layer by layer."""
  nnf, _ = _flax_eqx()
  from flax import nnx

  ei, n, x = problem
  m = nnf.GAT(12, 4, 5, heads=2, rngs=nnx.Rngs(1))
  m.conv1.bias[...] = jnp.linspace(-1, 1, 8)
  m.eval()
  c1, c2 = m.conv1, m.conv2
  h = gat_reference(
    ei, n, x, c1.lin.kernel[...], c1.att_src[...], c1.att_dst[...], c1.bias[...], 2, True
  )
  h = np.where(h > 0, h, np.expm1(h))
  ref = gat_reference(
    ei, n, h, c2.lin.kernel[...], c2.att_src[...], c2.att_dst[...], c2.bias[...], 1, False
  )
  close(m(graph.message_passing_matrix(ei, n, add_self_loops=True), x), ref, rtol=5e-5, atol=5e-5)


def test_graph_transformer_layer_reference(problem):
  nnf, _ = _flax_eqx()
  from flax import nnx

  ei, n, x = problem
  mask = dense_adj(ei, n, "replace") > 0
  for norm_first in (False, True):
    layer = nnf.GraphTransformerLayer(
      12, heads=3, ff_dim=10, norm_first=norm_first, rngs=nnx.Rngs(2)
    )
    layer.norm1.scale[...] = jnp.linspace(0.5, 1.5, 12)
    layer.norm2.bias[...] = jnp.linspace(-0.2, 0.2, 12)
    P = lambda lin: (f64(lin.kernel[...]), f64(lin.bias[...]))  # noqa: E731

    def ln(z, norm):
      mu = z.mean(1, keepdims=True)
      var = ((z - mu) ** 2).mean(1, keepdims=True)
      return (z - mu) / np.sqrt(var + 1e-5) * f64(norm.scale[...]) + f64(norm.bias[...])

    def lin(z, layer_):
      w, b = P(layer_)
      return z @ w + b

    x64 = f64(x)
    h = ln(x64, layer.norm1) if norm_first else x64
    q, k, v = (
      lin(h, lin_).reshape(n, 3, 4) for lin_ in (layer.lin_query, layer.lin_key, layer.lin_value)
    )
    att = np.concatenate(
      [masked_softmax(q[:, i] @ k[:, i].T / 2.0, mask) @ v[:, i] for i in range(3)], 1
    )
    y = x64 + lin(att, layer.lin_out)
    y = y if norm_first else ln(y, layer.norm1)
    h = ln(y, layer.norm2) if norm_first else y
    y = y + lin(np.maximum(lin(h, layer.ff1), 0), layer.ff2)
    y = y if norm_first else ln(y, layer.norm2)
    layer.eval()
    close(
      layer(graph.message_passing_matrix(ei, n, add_self_loops=True), x), y, rtol=1e-4, atol=1e-4
    )


def test_dropout_train_vs_eval(problem):
  import equinox as eqx

  nnf, nne = _flax_eqx()
  from flax import nnx

  ei, n, x = problem
  A = graph.message_passing_matrix(ei, n, add_self_loops=True)
  m = nnf.GAT(12, 4, 5, heads=2, dropout=0.5, rngs=nnx.Rngs(0))
  y1, y2 = m(A, x), m(A, x)  # training: fresh dropout masks each call
  assert not np.allclose(np.asarray(y1), np.asarray(y2))
  m.eval()
  np.testing.assert_array_equal(np.asarray(m(A, x)), np.asarray(m(A, x)))
  e = nne.GAT(12, 4, 5, heads=2, dropout=0.5, key=jax.random.key(0))
  with pytest.raises(RuntimeError, match="key"):
    e(A, x)
  ya, yb = e(A, x, key=jax.random.key(1)), e(A, x, key=jax.random.key(2))
  assert not np.allclose(np.asarray(ya), np.asarray(yb))
  ei_ = eqx.nn.inference_mode(e)
  np.testing.assert_array_equal(np.asarray(ei_(A, x)), np.asarray(ei_(A, x, key=None)))


@pytest.mark.parametrize("name", ["GCN", "GAT", "AGNN", "GraphTransformer", "TransformerConv"])
def test_gradients_finite(problem, name):
  import equinox as eqx

  nnf, nne = _flax_eqx()
  ei, n, x = problem
  _, make_e, kind = _builders(nnf, nne)[name]
  A = _matrix_for(kind, ei, n)
  model = make_e()
  labels = jnp.asarray(np.arange(n) % 5)

  @eqx.filter_jit
  @eqx.filter_grad
  def grads(model, x):
    y = model(A, x, key=jax.random.key(0))
    return -jnp.mean(jax.nn.log_softmax(y[:, :5])[jnp.arange(n), labels])

  g = grads(model, jnp.asarray(x))
  leaves = jax.tree_util.tree_leaves(eqx.filter(g, eqx.is_inexact_array))
  assert leaves and all(np.all(np.isfinite(np.asarray(leaf))) for leaf in leaves)
  assert sum(float(jnp.sum(jnp.abs(leaf))) for leaf in leaves) > 0
  if name == "AGNN":  # the learned beta gets a gradient; the fixed one is no parameter
    assert isinstance(model.prop1.beta, float) and float(g.prop2.beta) != 0.0


def test_flax_agnn_fixed_beta_not_a_param():
  nnf, _ = _flax_eqx()
  from flax import nnx

  m = nnf.AGNN(12, 8, 5, rngs=nnx.Rngs(0))
  paths = [p for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))]
  assert ("prop2", "beta") in paths and ("prop1", "beta") not in paths


def test_no_framework_import_on_package_import():
  import subprocess
  import sys

  code = (
    "import sys, jaxsparse_tc, jaxsparse_tc.nn, jaxsparse_tc.datasets; "
    "assert 'flax' not in sys.modules and 'equinox' not in sys.modules, "
    "[m for m in ('flax', 'equinox') if m in sys.modules]"
  )
  subprocess.run([sys.executable, "-c", code], check=True)


def test_layers_gpu_matches_cpu(problem):
  """On a GPU machine: the models on the CUDA kernels (tf32 by default) agree with the CPU."""
  try:
    gpu = jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("no GPU")
  nnf, nne = _flax_eqx()
  ei, n, x = problem
  for name in ("GCN", "GAT", "AGNN", "GraphTransformer"):
    make_f, _, kind = _builders(nnf, nne)[name]
    build = (
      (lambda: graph.gcn_norm(ei, n))
      if kind == "gcn"
      else (lambda: graph.message_passing_matrix(ei, n, add_self_loops=True))
    )
    m = make_f()
    m.eval()
    y_cpu = np.asarray(m(build(), x))
    with jax.default_device(gpu):
      y_gpu = m(build(), jnp.asarray(x))
    assert y_gpu.devices() == {gpu}
    err = np.abs(np.asarray(y_gpu) - y_cpu).max() / np.abs(y_cpu).max()
    assert err < 1e-2, (name, err)
