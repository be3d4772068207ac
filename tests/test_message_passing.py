"""nn.functional.message_passing against float64 numpy references on random graphs (empty rows,
duplicate entries, bipartite), its fast paths (which primitives the jaxpr holds), jit, grad,
vmap and its trace-time errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_coo, rel_err
from jax.test_util import check_grads

import jaxsparse_tc as jst
from jaxsparse_tc._src.checks import OperandError
from jaxsparse_tc._src.nn import message_passing as mp_lib
from jaxsparse_tc.nn.functional import message_passing

REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


class Graph:
  """A random A [m, n] (some targets without edges, about 10% duplicate entries) and its
  distinct edges, as the matrix stores them: duplicates merged, their values and edge features
  added up."""

  def __init__(self, rng, m, n, density=0.12, edge_dim=3):
    rows, cols, vals = random_coo(rng, m, n, density)
    empty = rng.choice(m, max(1, m // 5), replace=False)
    keep = ~np.isin(rows, empty)
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    self.A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(m, n))
    self.edge_attr = rng.standard_normal((rows.size, edge_dim)).astype(np.float32)
    keys, inverse = np.unique(rows * n + cols, return_inverse=True)
    self.tgt, self.src = keys // n, keys % n
    self.vals = np.bincount(inverse, weights=vals.astype(np.float64))
    self.attr = np.zeros((keys.size, edge_dim))
    np.add.at(self.attr, inverse, self.edge_attr.astype(np.float64))
    self.m, self.n = m, n
    assert self.A.nnz == keys.size and keys.size < rows.size  # duplicates were merged


def _reference(g: Graph, msg: np.ndarray, aggregate: str) -> np.ndarray:
  out = np.zeros((g.m,) + msg.shape[1:])
  for i in range(g.m):
    sel = msg[g.tgt == i]
    if len(sel):
      out[i] = REDUCE[aggregate](sel, axis=0)
  return out


def _softmax_reference(g: Graph, logits: np.ndarray, msg: np.ndarray) -> np.ndarray:
  """sum_j softmax_i(logits)_j msg_j; logits [E] or [E, H], msg [E, ...] or [E, H, ...]."""
  out = np.zeros((g.m,) + msg.shape[1:])
  for i in range(g.m):
    sel = g.tgt == i
    if not sel.any():
      continue
    z = logits[sel]
    w = np.exp(z - z.max(axis=0))
    w = w / w.sum(axis=0)
    out[i] = np.sum(w.reshape(w.shape + (1,) * (msg.ndim - w.ndim)) * msg[sel], axis=0)
  return out


def _primitives(jaxpr) -> set:
  """Names of the primitives of a jaxpr, its sub-jaxprs (jit, custom rules) included."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
          names |= _primitives(sub)
  return names


SPMM, EDGE_SOFTMAX = "jaxsparse_tc_spmm", "jaxsparse_tc_edge_softmax"


def _has_scatter(names) -> bool:
  return any("scatter" in name for name in names)


def _weights(rng, *shape):
  return jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[0]), jnp.float32)


# -- aggregations against references ----------------------------------------------------------
@pytest.mark.parametrize("aggregate", ["sum", "mean", "max", "min"])
def test_default_message(rng, aggregate):
  """message=None: the message A[i, j] * x_j (A's values weight), aggregated by the kernels."""
  g = Graph(rng, 45, 45)
  x = rng.standard_normal((45, 6)).astype(np.float32)
  out = jax.jit(lambda x: message_passing(g.A, x, aggregate=aggregate))(x)
  ref = _reference(g, g.vals[:, None] * x[g.src], aggregate)
  assert rel_err(out, ref) < 1e-5
  assert np.all(np.asarray(out)[np.bincount(g.tgt, minlength=g.m) == 0] == 0)


@pytest.mark.parametrize("aggregate", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("bipartite", [False, True])
def test_custom_message(rng, aggregate, bipartite):
  """A message of source, target and edge features (input order), then an update."""
  m, n = (30, 45) if bipartite else (45, 45)
  g = Graph(rng, m, n)
  x_src = rng.standard_normal((n, 5)).astype(np.float32)
  x_dst = rng.standard_normal((m, 4)).astype(np.float32) if bipartite else x_src
  w_src, w_dst, w_e = _weights(rng, 5, 7), _weights(rng, x_dst.shape[1], 7), _weights(rng, 3, 7)
  w_up = _weights(rng, x_dst.shape[1], 7)

  def message(xj, xi, e, xp=jnp):
    return xp.tanh(xj @ w_src + xi @ w_dst) * (e @ w_e)

  x = (x_src, x_dst) if bipartite else x_src
  run = jax.jit(
    lambda x, ea: message_passing(
      g.A,
      x,
      message=message,
      aggregate=aggregate,
      update=lambda agg, xi: agg + xi @ w_up,
      edge_attr=ea,
    )
  )
  out = run(x, g.edge_attr)
  f64 = lambda w: np.asarray(w, np.float64)
  msg = np.tanh(x_src[g.src] @ f64(w_src) + x_dst[g.tgt] @ f64(w_dst)) * (g.attr @ f64(w_e))
  ref = _reference(g, msg, aggregate) + x_dst @ f64(w_up)
  assert out.shape == (m, 7)
  assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("aggregate", ["sum", "mean", "max", "min"])
def test_copy_source_message(rng, aggregate):
  """A message returning x_j itself: unweighted (A's values are not used), on the kernels."""
  g = Graph(rng, 40, 40)
  x = rng.standard_normal((40, 5)).astype(np.float32)
  f = lambda x: message_passing(g.A, x, message=lambda xj, xi, e: xj, aggregate=aggregate)
  assert rel_err(jax.jit(f)(x), _reference(g, x[g.src].astype(np.float64), aggregate)) < 1e-5
  if aggregate in ("sum", "mean"):
    names = _primitives(jax.make_jaxpr(f)(x))
    assert SPMM in names and not _has_scatter(names)


@pytest.mark.parametrize(
  "heads, kind",
  [(h, k) for h in (None, 3) for k in ("custom", "default", "source")] + [(3, "shared")],
)
def test_softmax(rng, heads, kind):
  """Softmax-weighted sums: per-head or shared messages, the default message (A's values
  weight) and the source features, bipartite."""
  m, n, f = 30, 40, 6
  g = Graph(rng, m, n)
  x_src = rng.standard_normal((n, f)).astype(np.float32)
  x_dst = rng.standard_normal((m, f)).astype(np.float32)
  h = heads or 1
  w_att = _weights(rng, f, h)

  def logits_of(xj, xi, xp):
    z = xp.tanh(xj + xi) @ (w_att if xp is jnp else np.asarray(w_att, np.float64))
    return z if heads else z[:, 0]

  def messages_of(xj, xi, xp):
    if kind == "default":
      return None
    if kind == "source":
      return xj
    if kind == "shared":
      return xp.sin(xj * xi)
    out = xp.cos(xj - xi)[:, : 2 * h]
    return out.reshape(-1, h, 2) if heads else out

  def message(xj, xi, e):
    return logits_of(xj, xi, jnp), messages_of(xj, xi, jnp)

  out = jax.jit(lambda x: message_passing(g.A, x, message=message, aggregate="softmax"))(
    (x_src, x_dst)
  )
  xj, xi = x_src[g.src].astype(np.float64), x_dst[g.tgt].astype(np.float64)
  msg = messages_of(xj, xi, np)
  if kind == "default":
    msg = g.vals[:, None] * xj
  if heads and msg.ndim == 2:
    msg = np.broadcast_to(msg[:, None, :], (msg.shape[0], h, msg.shape[1]))
  ref = _softmax_reference(g, logits_of(xj, xi, np), msg)
  assert out.shape == ref.shape
  assert rel_err(out, ref) < 1e-5


def test_softmax_masked_and_nan_rows(rng):
  """edge_softmax's rules: a target whose logits are all -inf gets 0, a NaN logit makes its
  row NaN, a -inf logit drops its edge; on the spmm path and the segment path alike."""
  g = Graph(rng, 40, 40, density=0.2)
  x = rng.standard_normal((40, 4)).astype(np.float32)
  counts = np.bincount(g.tgt, minlength=40)
  masked, nan_row, dropped = np.flatnonzero(counts >= 2)[:3]
  rows = np.asarray(g.A.rows)
  base = rng.standard_normal(g.A.nnz).astype(np.float32)
  logits = np.where(rows == masked, -np.inf, base)
  logits[np.flatnonzero(rows == nan_row)[0]] = np.nan
  drop = np.flatnonzero(rows == dropped)[0]
  logits[drop] = -np.inf
  for messages in (None, lambda xj: 2 * xj):
    out = message_passing(
      g.A,
      x,
      message=lambda xj, xi, e: (logits, None if messages is None else messages(xj)),
      aggregate="softmax",
    )
    out = np.asarray(out)
    assert np.all(out[masked] == 0)
    assert np.all(np.isnan(out[nan_row]))
    finite = np.ones(40, bool)
    finite[[masked, nan_row]] = False
    assert np.all(np.isfinite(out[finite]))
    # The dropped edge: the softmax over the row's other edges.
    keep = (rows == dropped) & (np.arange(g.A.nnz) != drop)
    w = np.exp(base[keep].astype(np.float64))
    src = np.asarray(g.A.cols)[keep]
    scale = np.asarray(g.A.values, np.float64)[keep] if messages is None else np.full(w.size, 2.0)
    ref = np.sum((w / w.sum() * scale)[:, None] * x[src], axis=0)
    assert rel_err(out[dropped], ref) < 1e-5


def test_duplicates_are_one_edge(rng):
  """Entries at one position are one edge: one message, edge features added up, counted
  once by mean and max."""
  n = 8
  src = np.array([1, 1, 2, 3, 3, 3])
  dst = np.array([0, 0, 0, 4, 4, 4])
  A = jst.SparseMatrix.from_edge_index(np.stack([src, dst]), n)
  attr = rng.standard_normal((6, 2)).astype(np.float32)
  x = rng.standard_normal((n, 2)).astype(np.float32)
  e_msg = lambda xj, xi, e: e
  for aggregate, ref0, ref4 in (
    ("sum", attr[0] + attr[1] + attr[2], attr[3:].sum(0)),
    ("mean", (attr[0] + attr[1] + attr[2]) / 2, attr[3:].sum(0)),
    ("max", np.maximum(attr[0] + attr[1], attr[2]), attr[3:].sum(0)),
  ):
    run = jax.jit(
      lambda ea: message_passing(A, x, message=e_msg, aggregate=aggregate, edge_attr=ea)
    )
    out = np.asarray(run(attr), np.float64)
    assert rel_err(out[0], ref0) < 1e-6 and rel_err(out[4], ref4) < 1e-6
    assert np.all(np.delete(out, [0, 4], axis=0) == 0)
  mean = np.asarray(message_passing(A, x, aggregate="mean"))  # the merged value is 2: 2 x_1
  assert rel_err(mean[0], (2 * x[1] + x[2]) / 2) < 1e-6
  add = np.asarray(message_passing(A, x, aggregate="add"))  # PyG's name for "sum"
  assert rel_err(add[0], 2 * x[1] + x[2]) < 1e-6 and rel_err(add[4], 3 * x[3]) < 1e-6


def test_padded_batch(rng):
  """A padded batch of graphs (nn.batch): its real nodes get what each graph alone gets, edge
  features in the batch's edge-slot order; the dummy entries stay among the padding nodes."""
  from jaxsparse_tc.nn.batch import Budget, Graph, batch_graphs, unbatch_nodes

  graphs = []
  for n in (13, 21):
    ei = rng.integers(0, n, (2, 3 * n))
    ei = np.concatenate([ei, ei[:, :4]], axis=1)  # duplicates
    graphs.append(
      Graph(ei, n, x=rng.standard_normal((n, 4)), edge_attr=rng.random((ei.shape[1], 4)))
    )
  batch = batch_graphs(graphs, Budget.for_dataset(graphs, batch_size=2))
  cases = [
    dict(message=lambda xj, xi, e: jnp.tanh(xj - xi) * e, aggregate="max"),
    dict(message=lambda xj, xi, e: (jnp.sum(xi * e, -1), xj * e), aggregate="softmax"),
    dict(aggregate="mean"),
  ]
  alone = [jst.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes) for g in graphs]
  for kwargs in cases:
    run = jax.jit(lambda A, x, ea: message_passing(A, x, edge_attr=ea, **kwargs))
    ea = None if "message" not in kwargs else batch.edge_attr
    out = unbatch_nodes(run(batch.A, batch.x, ea), batch)
    for g, A, got in zip(graphs, alone, out):
      ea = None if "message" not in kwargs else jnp.asarray(g.edge_attr, jnp.float32)
      assert rel_err(got, run(A, jnp.asarray(g.x, jnp.float32), ea)) < 1e-6, kwargs


# -- fast paths -------------------------------------------------------------------------------
def test_fast_paths_in_jaxpr(rng):
  g = Graph(rng, 40, 40)
  x = jnp.asarray(rng.standard_normal((40, 4)), jnp.float32)
  logits = lambda xj, xi: jnp.sum(xj * xi, -1)

  def names(**kwargs):
    return _primitives(jax.make_jaxpr(lambda x: message_passing(g.A, x, **kwargs))(x))

  for aggregate in ("sum", "mean"):
    found = names(aggregate=aggregate)
    assert SPMM in found and not _has_scatter(found) and "gather" not in found
  for aggregate in ("max", "min"):
    for message in (None, lambda xj, xi, e: xj):
      found = names(message=message, aggregate=aggregate)
      assert "jaxsparse_tc_spmm_extremum" in found and not _has_scatter(found)
  for messages in (lambda xj: None, lambda xj: xj):
    found = names(message=lambda xj, xi, e: (logits(xj, xi), messages(xj)), aggregate="softmax")
    assert {SPMM, EDGE_SOFTMAX} <= found and not _has_scatter(found)
  # A message the kernels cannot take: the segment path (the checks above can fail).
  found = names(message=lambda xj, xi, e: (logits(xj, xi), xj * xi), aggregate="softmax")
  assert EDGE_SOFTMAX in found and _has_scatter(found)
  assert _has_scatter(names(message=lambda xj, xi, e: xj + xi))


@pytest.mark.parametrize("aggregate", ["max", "min"])
def test_extremum_fast_path(rng, monkeypatch, aggregate):
  """Default and copy-source max/min go through the one semiring-product helper."""
  g = Graph(rng, 30, 30)
  x = jnp.asarray(rng.standard_normal((30, 3)), jnp.float32)
  calls = []
  real = mp_lib._extremum

  def spy(A, x, reduce):
    calls.append(reduce)
    return real(A, x, reduce)

  monkeypatch.setattr(mp_lib, "_extremum", spy)
  message_passing(g.A, x, aggregate=aggregate)
  message_passing(g.A, x, message=lambda xj, xi, e: xj, aggregate=aggregate)
  message_passing(g.A, x, message=lambda xj, xi, e: xj * xi, aggregate=aggregate)
  assert calls == [aggregate, aggregate]


# -- transformations --------------------------------------------------------------------------
@pytest.mark.parametrize("aggregate", ["sum", "mean", "max", "min"])
def test_grads_float64(rng, x64, aggregate):
  """jit(grad) of the default message (through A's values and x) and of a custom message
  (through its weights, x and edge features) against float64 finite differences."""
  g = Graph(rng, 25, 25)
  x = jnp.asarray(rng.standard_normal((25, 3)))
  w = jnp.asarray(rng.standard_normal((3, 3)))
  attr = jnp.asarray(g.edge_attr, jnp.float64)
  values = jnp.asarray(g.A.values, jnp.float64)

  def default(v, x):
    return message_passing(g.A.with_values(v), x, aggregate=aggregate)

  def custom(x, w, ea):
    msg = lambda xj, xi, e: jnp.tanh(xj @ w) * e + xi
    return message_passing(g.A, x, message=msg, aggregate=aggregate, edge_attr=ea)

  check_grads(jax.jit(default), (values, x), order=1, modes=("rev",), eps=1e-6)
  check_grads(jax.jit(custom), (x, w, attr), order=1, modes=("rev",), eps=1e-6)


@pytest.mark.parametrize("kind", ["segment", "spmm"])
def test_softmax_grads(rng, x64, kind):
  """Gradients of the softmax aggregation (float32 edge softmax) against a float64 jnp
  reference over the distinct edges."""
  g = Graph(rng, 30, 30)
  x = jnp.asarray(rng.standard_normal((30, 4)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((4, 2)), jnp.float32)
  ct = jnp.asarray(rng.standard_normal((30, 2, 4)))

  def run(x, w):
    msg = lambda xj, xi, e: (jnp.tanh(xj + xi) @ w, xj if kind == "spmm" else jnp.cos(xj))
    return jnp.sum(message_passing(g.A, x, message=msg, aggregate="softmax") * ct)

  def reference(x, w):
    xj, xi = x[g.src], x[g.tgt]
    z = jnp.tanh(xj + xi) @ w  # [E, H]
    z = z - jax.ops.segment_max(z, g.tgt, num_segments=g.m)[g.tgt]
    p = jnp.exp(z)
    p = p / jax.ops.segment_sum(p, g.tgt, num_segments=g.m)[g.tgt]
    msg = xj if kind == "spmm" else jnp.cos(xj)
    out = jax.ops.segment_sum(p[:, :, None] * msg[:, None, :], g.tgt, num_segments=g.m)
    return jnp.sum(out * ct)

  got = jax.jit(jax.grad(run, argnums=(0, 1)))(x, w)
  ref = jax.jit(jax.grad(reference, argnums=(0, 1)))(x.astype(jnp.float64), w.astype(jnp.float64))
  for a, b in zip(got, ref):
    assert rel_err(a, b) < 1e-5


def test_vmap_over_features(rng):
  g = Graph(rng, 30, 30)
  xs = jnp.asarray(rng.standard_normal((3, 30, 4)), jnp.float32)
  cases = [
    dict(aggregate="mean"),
    dict(aggregate="max"),
    dict(message=lambda xj, xi, e: xj * xi, aggregate="min"),
    dict(message=lambda xj, xi, e: (jnp.sum(xj * xi, -1), jnp.sin(xj)), aggregate="softmax"),
  ]
  for kwargs in cases:
    f = lambda x: message_passing(g.A, x, **kwargs)
    batched = jax.jit(jax.vmap(f))(xs)
    each = jnp.stack([jax.jit(f)(x) for x in xs])
    assert rel_err(batched, each) < 1e-6, kwargs


# -- errors -----------------------------------------------------------------------------------
def test_errors(rng):
  g = Graph(rng, 20, 20)
  x = jnp.asarray(rng.standard_normal((20, 3)), jnp.float32)
  nnz = g.A.nnz
  score = lambda xj, xi: jnp.sum(xj * xi, -1)
  with pytest.raises(ValueError, match="aggregate must be one of"):
    message_passing(g.A, x, aggregate="median")
  with pytest.raises(TypeError, match="message must be a function"):
    message_passing(g.A, x, message="copy")
  with pytest.raises(OperandError, match=rf"must return \[{nnz}, \.\.\.\].*got shape \(20, 3\)"):
    message_passing(g.A, x, message=lambda xj, xi, e: xi[:20])
  with pytest.raises(OperandError, match="is for aggregate='softmax'"):
    message_passing(g.A, x, message=lambda xj, xi, e: (score(xj, xi), xj))
  with pytest.raises(ValueError, match="'softmax' needs logits"):
    message_passing(g.A, x, aggregate="softmax")
  with pytest.raises(ValueError, match=r"'softmax' needs logits.*got .* of shape \("):
    message_passing(g.A, x, message=lambda xj, xi, e: xj, aggregate="softmax")
  with pytest.raises(OperandError, match=rf"logits must have shape \[{nnz}\] or \[{nnz}, H\]"):
    message_passing(g.A, x, message=lambda xj, xi, e: (xj[:5, 0], xj), aggregate="softmax")
  with pytest.raises(OperandError, match=r"messages must be \[.*, 2, C\] \(per head\)"):
    message_passing(
      g.A, x, message=lambda xj, xi, e: (xj[:, :2], xj[:, None, :]), aggregate="softmax"
    )
  with pytest.raises(ValueError, match="one value per entry"):
    message_passing(g.A.with_values(jnp.stack([g.A.values] * 2)), x)
  with pytest.raises(ValueError, match="edge_attr was given but message is None"):
    message_passing(g.A, x, edge_attr=g.edge_attr)
  with pytest.raises(ValueError, match="x_src must have 20 rows"):
    message_passing(g.A, (x[:10], x), message=lambda xj, xi, e: xj)
  with pytest.raises(TypeError, match="edge_index array"):
    message_passing(jnp.zeros((2, 5), jnp.int32), x)


def test_float64_logits_refused(rng, x64):
  g = Graph(rng, 20, 20)
  x = jnp.asarray(rng.standard_normal((20, 3)))
  with pytest.raises(OperandError, match="float64.*cast them"):
    message_passing(
      g.A, x, message=lambda xj, xi, e: (jnp.sum(xj * xi, -1), xj), aggregate="softmax"
    )
