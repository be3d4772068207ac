"""The row rules shared by edge_softmax and sparse_attention, forward and every derivative.

A row's softmax runs over its stored entries with logits s (edge_softmax: the values; attention:
scale * <q_i, k_j> + bias_ij):
1. a nan or +inf logit makes every output of the row nan (as jax.nn.softmax);
2. a row with no entries, or whose logits are all -inf, gives zeros, and every gradient through
   it is exactly zero;
3. otherwise the max-subtracted softmax, a -inf entry getting weight exactly 0.
The attention bias enters the kernels as float32 whatever its dtype; its gradient comes back in
its own dtype. References are float64 numpy on fresh random inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import rel_err
from jax.test_util import check_grads
from test_attention import make_pattern

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix
from jaxsparse_tc._src import attention, checks

F32_TOL, F32_GRAD_TOL = 1e-5, 1e-4


# -- float64 references -----------------------------------------------------------------------
def row_softmax64(rows, s):
  """The rules in float64: s [H, nnz] logits in format order, rows [nnz] each entry's row."""
  s = np.asarray(s, np.float64)
  p = np.zeros_like(s)
  for i in np.unique(rows):
    sel = rows == i
    x = s[:, sel]
    mx = x.max(axis=1, keepdims=True)  # nan if the row holds a nan
    with np.errstate(invalid="ignore", over="ignore"):
      e = np.exp(x - np.where(mx == -np.inf, 0.0, mx))
      den = e.sum(axis=1, keepdims=True)
      p[:, sel] = np.where(den == 0, 0.0, e / den)
  return p


def rowsum64(rows, m, x):
  """sum over each row's entries of x [H, nnz], broadcast back to the entries."""
  return np.stack([np.bincount(rows, xh, minlength=m)[rows] for xh in x])


def softmax_jvp64(rows, m, y, t):
  """y * (t - rowsum(y * t)): the JVP at output y, and (self-adjoint) the VJP."""
  return y * (t - rowsum64(rows, m, y * t))


def dense64(A, per_edge):
  """[H, nnz] in format order -> dense [H, m, n]."""
  per_edge = np.asarray(per_edge, np.float64)
  out = np.zeros((per_edge.shape[0],) + A.shape)
  np.add.at(out, (slice(None), np.asarray(A.rows), np.asarray(A.cols)), per_edge)
  return out


def heads3(x, h):
  x = np.asarray(x, np.float64)
  x = x[None] if x.ndim == 2 else x
  return np.broadcast_to(x, (h,) + x.shape[1:])


def attention64(A, q, k, v, scale, bias, w=None, tangents=None):
  """float64 attention by the rules, with the head axis: output [H, m, dv]; with w, the
  gradients of sum(out * w) for (q, k, v, bias) as [H, ...] (not summed over broadcast heads);
  with tangents (dq, dk, dv, dbias), the JVP."""
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  b = np.zeros((1, A.nnz)) if bias is None else np.asarray(bias, np.float64).reshape(-1, A.nnz)
  H = max(x.shape[0] if np.ndim(x) == 3 else 1 for x in (q, k, v, b))
  q, k, v = (heads3(x, H) for x in (q, k, v))
  b = np.broadcast_to(b, (H, A.nnz))
  s = scale * np.einsum("hed,hed->he", q[:, r], k[:, c]) + b
  p = row_softmax64(r, s)
  pd = dense64(A, p)
  out = pd @ v
  if w is not None:
    w = heads3(w, H)
    dp = np.einsum("hef,hef->he", w[:, r], v[:, c])
    delta = np.sum(w * out, axis=-1)
    ds = p * (dp - delta[:, r])
    dsd = dense64(A, ds)
    grads = (scale * dsd @ k, scale * np.swapaxes(dsd, 1, 2) @ q, np.swapaxes(pd, 1, 2) @ w, ds)
    return out, grads
  if tangents is not None:
    dq, dk, dv = (heads3(x, H) for x in tangents[:3])
    db = np.broadcast_to(np.asarray(tangents[3], np.float64).reshape(-1, A.nnz), (H, A.nnz))
    dsc = scale * (
      np.einsum("hed,hed->he", dq[:, r], k[:, c]) + np.einsum("hed,hed->he", q[:, r], dk[:, c])
    )
    dsc = dsc + db
    pds = p * dsc
    tangent = dense64(A, pds) @ v - rowsum_rows(A, pds)[..., None] * out + pd @ dv
    return out, tangent
  return out


def rowsum_rows(A, x):
  """Per-row sums of x [H, nnz]: [H, m]."""
  r = np.asarray(A.rows)
  return np.stack([np.bincount(r, xh, minlength=A.shape[0]) for xh in x])


def to_heads(g, x):
  """A [H, ...] reference gradient summed to operand x's head count (and x's rank)."""
  g = g.sum(0, keepdims=True) if np.ndim(x) == g.ndim and np.shape(x)[0] == 1 else g
  if np.ndim(x) == g.ndim - 1:
    g = g.sum(0)
  return g


def assert_nan_pattern_and_close(got, ref, tol, what=""):
  """nan exactly where the reference is nan, no inf, and close elsewhere."""
  got = np.asarray(got, np.float64)
  ref = np.broadcast_to(np.asarray(ref, np.float64), got.shape)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"nan pattern {what}")
  assert not np.isinf(got).any(), what
  fin = ~np.isnan(ref)
  assert rel_err(got[fin], ref[fin]) < tol, what


def rows_with(counts, least, k, rng, exclude=()):
  """k distinct rows holding at least `least` entries, not in exclude."""
  cand = np.setdiff1d(np.flatnonzero(counts >= least), np.asarray(exclude, np.int64))
  assert cand.size >= k, "pattern too sparse for the test"
  return rng.choice(cand, size=k, replace=False)


def qkv(rng, A, d, dv, dtype=jnp.float32, hq=None, hk=None):
  m, n = A.shape
  mk = lambda h, *s: jnp.asarray(  # noqa: E731
    rng.standard_normal(((h,) if h else ()) + s), dtype
  )
  return mk(hq, m, d), mk(hk, n, d), mk(hk, n, dv)


# -- rule 1: a nan (or +inf) logit makes its row nan ------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_logit_makes_the_row_nan(rng, bad):
  A = make_pattern(rng, 37, 29, density=0.3, empty_rows=3)
  m = A.shape[0]
  r = np.asarray(A.rows)
  row = rows_with(np.bincount(r, minlength=m), 3, 1, rng)[0]
  e0 = rng.choice(np.flatnonzero(r == row))

  # edge_softmax: values, jvp, grad
  v = rng.standard_normal((1, A.nnz)) * 2
  v[0, e0] = bad
  vj = jnp.asarray(v, jnp.float32)
  y_ref = row_softmax64(r, v)
  assert np.isnan(y_ref[0, r == row]).all() and not np.isnan(y_ref[0, r != row]).any()
  f = lambda x: jst.edge_softmax(A, x).values  # noqa: E731
  assert_nan_pattern_and_close(jax.jit(f)(vj), y_ref, F32_TOL, "edge_softmax")
  t = rng.standard_normal((1, A.nnz))
  _, jv = jax.jvp(f, (vj,), (jnp.asarray(t, jnp.float32),))
  assert_nan_pattern_and_close(jv, softmax_jvp64(r, m, y_ref, t), F32_GRAD_TOL, "jvp")
  g = jax.grad(lambda x: jnp.sum(f(x) * t))(vj)
  assert_nan_pattern_and_close(g, softmax_jvp64(r, m, y_ref, t), F32_GRAD_TOL, "grad")

  # sparse_attention: the bad logit in the bias
  q, k, vv = qkv(rng, A, d=8, dv=6)
  bias = rng.standard_normal(A.nnz)
  bias[e0] = bad
  bj = jnp.asarray(bias, jnp.float32)
  att = lambda *a: jst.sparse_attention(A, *a[:3], scale=0.5, bias=a[3])  # noqa: E731
  w = rng.standard_normal((m, 6))
  o_ref, g_ref = attention64(A, q, k, vv, 0.5, bias, w=w)
  assert np.isnan(o_ref[0, row]).all() and not np.isnan(np.delete(o_ref[0], row, 0)).any()
  assert_nan_pattern_and_close(jax.jit(att)(q, k, vv, bj), o_ref[0], F32_TOL, "attention")
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(att(*a) * w), argnums=(0, 1, 2, 3)))(q, k, vv, bj)
  for name, got, ref in zip("q k v bias".split(), grads, g_ref):
    assert_nan_pattern_and_close(got, ref[0], F32_GRAD_TOL, f"d{name}")
  tans = [jnp.asarray(rng.standard_normal(x.shape), jnp.float32) for x in (q, k, vv, bj)]
  _, jv = jax.jvp(att, (q, k, vv, bj), tuple(tans))
  _, jv_ref = attention64(A, q, k, vv, 0.5, bias, tangents=tans)
  assert_nan_pattern_and_close(jv, jv_ref[0], F32_GRAD_TOL, "attention jvp")


# -- rules 2 and 3: fully masked rows give zeros, masked entries weight 0 ---------------------
def masked_logits(rng, A, heads, scale=2.0):
  """Random logits [heads, nnz] with -inf on every entry of some rows (some in one head only)
  and on some entries of other rows. Returns them and the masks (full rows [heads, m], entries
  [heads, nnz])."""
  m = A.shape[0]
  r = np.asarray(A.rows)
  counts = np.bincount(r, minlength=m)
  full = rows_with(counts, 1, 4, rng)
  partial = rows_with(counts, 2, 4, rng, exclude=full)
  s = rng.standard_normal((heads, A.nnz)) * scale
  full_rows = np.zeros((heads, m), bool)
  full_rows[:, full[:3]] = True
  full_rows[0, full[3]] = True  # masked in head 0 only
  for i in partial:
    sel = np.flatnonzero(r == i)
    drop = rng.choice(sel, size=rng.integers(1, sel.size), replace=False)
    s[:, drop] = -np.inf
  s[full_rows[:, r]] = -np.inf
  return s, full_rows, np.isneginf(s)


def test_masked_rows_and_entries(rng):
  """Both operators (edge_softmax held rules 2 and 3 before the attention did)."""
  check_masked_edge_softmax(rng)
  check_masked_attention(rng)


def check_masked_edge_softmax(rng):
  A = make_pattern(rng, 43, 31, density=0.3, empty_rows=3)
  m, H = A.shape[0], 2
  r = np.asarray(A.rows)
  s, full_rows, masked = masked_logits(rng, A, H)
  x = jnp.asarray(s, jnp.float32)
  f = jax.jit(lambda x: jst.edge_softmax(A, x).values)
  y = np.asarray(f(x), np.float64)
  y_ref = row_softmax64(r, s)
  assert np.isfinite(y).all() and rel_err(y, y_ref) < F32_TOL
  assert (y[masked] == 0).all()  # masked entries and fully masked rows: exactly 0
  # rows with something left still sum to one
  sums = rowsum_rows(A, y)
  live = (np.bincount(r, minlength=m) > 0) & ~full_rows
  np.testing.assert_allclose(sums[live], 1.0, atol=1e-5)
  t = rng.standard_normal((H, A.nnz))
  jv = np.asarray(jax.jvp(f, (x,), (jnp.asarray(t, jnp.float32),))[1])
  g = np.asarray(jax.grad(lambda x: jnp.sum(f(x) * t))(x))
  ref = softmax_jvp64(r, m, y_ref, t)
  for got in (jv, g):
    assert np.isfinite(got).all() and rel_err(got, ref) < F32_GRAD_TOL
    assert (got[masked] == 0).all()
  # second order too (edge_softmax has it)
  hv = jax.grad(lambda x: jnp.sum(jax.grad(lambda z: jnp.sum(jnp.tanh(f(z)) * t))(x) ** 2))(x)
  assert np.isfinite(np.asarray(hv)).all() and (np.asarray(hv)[masked] == 0).all()
  check_grads(lambda x: f(x) * 3.0, (x,), order=2, modes=["fwd", "rev"], atol=3e-2, rtol=3e-2)


def check_masked_attention(rng):
  A = make_pattern(rng, 43, 31, density=0.3, empty_rows=3)
  m, H, scale = A.shape[0], 2, 0.6
  r = np.asarray(A.rows)
  s, full_rows, masked = masked_logits(rng, A, H)
  bias = jnp.asarray(s, jnp.float32)
  q, k, v = qkv(rng, A, d=8, dv=5, hq=H)  # per-head Q, shared K and V
  att = lambda *a: jst.sparse_attention(A, *a[:3], scale=scale, bias=a[3])  # noqa: E731
  w = rng.standard_normal((H, m, 5))
  o_ref, g_ref = attention64(A, q, k, v, scale, s, w=w)
  out = np.asarray(jax.jit(att)(q, k, v, bias), np.float64)
  assert np.isfinite(out).all() and rel_err(out, o_ref) < F32_TOL
  empty = np.bincount(r, minlength=m) == 0
  assert (out[full_rows] == 0).all() and (out[:, empty] == 0).all()
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(att(*a) * w), argnums=(0, 1, 2, 3)))(q, k, v, bias)
  for name, got, ref, x in zip("q k v bias".split(), grads, g_ref, (q, k, v, bias)):
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all(), name
    assert rel_err(got, to_heads(ref, x)) < F32_GRAD_TOL, name
  dq, _, _, dbias = (np.asarray(g) for g in grads)
  assert (dq[full_rows] == 0).all() and (dbias[masked] == 0).all()
  # the JVP kernel
  tans = [jnp.asarray(rng.standard_normal(x.shape), jnp.float32) for x in (q, k, v, bias)]
  _, jv = jax.jvp(att, (q, k, v, bias), tuple(tans))
  jv = np.asarray(jv, np.float64)
  _, jv_ref = attention64(A, q, k, v, scale, s, tangents=tans)
  assert np.isfinite(jv).all() and rel_err(jv, jv_ref) < F32_GRAD_TOL
  assert (jv[full_rows] == 0).all()
  # and the gradients of a row that is entirely masked: every input of it gets exactly 0
  only = np.flatnonzero(full_rows.all(0))[0]
  wo = np.zeros((H, m, 5))
  wo[:, only] = rng.standard_normal((H, 5))
  go = jax.grad(lambda *a: jnp.sum(att(*a) * wo), argnums=(0, 1, 2, 3))(q, k, v, bias)
  for name, g in zip("q k v bias".split(), go):
    assert (np.asarray(g) == 0).all(), name
  check_grads(att, (q, k, v, bias), order=1, modes=["fwd", "rev"], atol=2e-2, rtol=2e-2)


def test_attention_primitives_row_conventions(rng):
  """At the primitive level: lse is +inf on empty and fully masked rows and nan on a nan row,
  the backward's per-edge pass (attention_bwd_p) and whole backward (attention_grads_p) give
  exact zeros there and nan on the nan row; the bias operand must be float32."""
  A = make_pattern(rng, 41, 35, density=0.3, empty_rows=3)
  m, H, scale = A.shape[0], 2, 0.4
  r = np.asarray(A.rows)
  s, full_rows, masked = masked_logits(rng, A, H)
  nan_row = rows_with(
    np.bincount(r, minlength=m), 2, 1, rng, exclude=np.flatnonzero(full_rows.any(0))
  )[0]
  s[1, rng.choice(np.flatnonzero((r == nan_row) & ~masked[1]))] = np.nan
  q, k, v = qkv(rng, A, d=8, dv=8, hq=H, hk=H)
  bias = jnp.asarray(s, jnp.float32)
  params = dict(
    shape=A.shape,
    scale=scale,
    has_bias=True,
    grouped=A.grouped[0],
    grouped_t=A.grouped[1],
    options=jst.KernelOptions(),
  )
  o, lse = attention.attention_fwd_p.bind(q, k, v, bias, *A.pattern_operands(), **params)
  lse = np.asarray(lse, np.float64)
  logits = scale * np.einsum(
    "hed,hed->he", np.asarray(q, np.float64)[:, r], np.asarray(k, np.float64)[:, np.asarray(A.cols)]
  ) + np.asarray(s, np.float64)
  empty = np.bincount(r, minlength=m) == 0
  for h in range(H):
    for i in range(m):
      if empty[i] or full_rows[h, i]:
        assert lse[h, i] == np.inf, (h, i)
      elif h == 1 and i == nan_row:
        assert np.isnan(lse[h, i])
      else:
        x = logits[h, r == i]
        ref = x.max() + np.log(np.sum(np.exp(x - x.max())))
        assert abs(lse[h, i] - ref) < 1e-5 * (1 + abs(ref)), (h, i)
  do = jnp.asarray(rng.standard_normal((H, m, 8)), jnp.float32)
  bwd = dict(shape=A.shape, scale=scale, has_bias=True)
  p, ds = attention.attention_bwd_p.bind(
    q, k, v, bias, o, jnp.asarray(lse, jnp.float32), do, *A.pattern_operands(), **bwd
  )
  p, ds = np.asarray(p), np.asarray(ds)
  bad = np.zeros_like(masked)
  bad[1, r == nan_row] = True
  for x in (p, ds):
    assert (x[masked & ~bad] == 0).all() and np.isnan(x[bad]).all() and np.isfinite(x[~bad]).all()
  p_ref = row_softmax64(r, np.where(bad, np.nan, logits))
  assert rel_err(p[~bad], p_ref[~bad]) < 1e-5
  dq, dk, dv, db = attention.attention_grads_p.bind(
    q, k, v, bias, o, jnp.asarray(lse, jnp.float32), do, *A.pattern_operands(), **params
  )
  dq, db = np.asarray(dq), np.asarray(db)
  assert (dq[full_rows] == 0).all() and np.isnan(dq[1, nan_row]).all()
  assert (db[masked & ~bad] == 0).all() and np.isnan(db[bad]).all()
  with pytest.raises(checks.OperandError, match="float32"):
    attention.attention_fwd_p.bind(
      q, k, v, bias.astype(jnp.float16), *A.pattern_operands(), **params
    )


# -- a matrix without nonzeros ----------------------------------------------------------------
def test_no_nonzeros(rng):
  E = SparseMatrix.from_coo(np.zeros(0, np.int64), np.zeros(0, np.int64), shape=(11, 6))
  assert E.nnz == 0
  for shape in ((0,), (3, 0)):
    for dtype in (jnp.float32, jnp.bfloat16):
      x = jnp.zeros(shape, dtype)
      y = jst.edge_softmax(E, x)
      assert y.values.shape == shape and y.values.dtype == dtype
      g = jax.grad(lambda x: jnp.sum(jst.edge_softmax(E, x).values.astype(jnp.float32)))(x)
      assert g.shape == shape and g.dtype == dtype
      _, t = jax.jvp(lambda x: jst.edge_softmax(E, x).values, (x,), (jnp.ones_like(x),))
      assert t.shape == shape
  assert jax.vmap(lambda x: jst.edge_softmax(E, x).values)(jnp.zeros((4, 0))).shape == (4, 0)
  # attention over it, with an empty bias
  q, k, v = qkv(rng, E, d=4, dv=3)
  for b in (jnp.zeros((0,), jnp.float16), jnp.zeros((2, 0), jnp.float32)):
    out = jst.sparse_attention(E, q, k, v, bias=b)
    assert out.shape == ((11, 3) if b.ndim == 1 else (2, 11, 3))
    assert (np.asarray(out) == 0).all()
    grads = jax.grad(
      lambda *a: jnp.sum(jst.sparse_attention(E, *a[:3], bias=a[3])), argnums=(0, 1, 2, 3)
    )(q, k, v, b)
    assert grads[3].shape == b.shape and grads[3].dtype == b.dtype
    for g in grads[:3]:
      assert (np.asarray(g) == 0).all()


# -- float32 bias with 16-bit Q, K, V ---------------------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_float32_bias_keeps_range_and_precision(rng, dtype):
  """A float32 bias of magnitude 1e5 (a row offset and a mask, with unit-size variation that
  the 16-bit types cannot hold at that magnitude) with 16-bit Q, K, V: the result equals a
  float64 reference from the float32 bias (float32 logits of magnitude 2e5 round by up to
  0.008, a weight error of up to 0.8%; measured 0.1-0.5% in all). d = dv = 32: the tensor-core
  backward's widths."""
  A = make_pattern(rng, 40, 48, density=0.3, empty_rows=2)
  m = A.shape[0]
  r = np.asarray(A.rows)
  counts = np.bincount(r, minlength=m)
  offset = rng.choice([0.0, 1e5, -1e5], size=m)
  bias = rng.standard_normal(A.nnz) + offset[r]
  bias[rng.random(A.nnz) < 0.2] -= 2e5  # masked entries
  hub = rows_with(counts, 2, 3, rng)  # one entry raised far above its row
  for i in hub:
    bias[rng.choice(np.flatnonzero(r == i))] += 1e5
  bias32 = np.asarray(bias, np.float32)
  q, k, v = qkv(rng, A, d=32, dv=32, dtype=dtype)
  w = rng.standard_normal((m, 32))
  att = lambda *a: jst.sparse_attention(A, *a[:3], bias=a[3])  # noqa: E731
  scale = 1.0 / np.sqrt(32)
  o_ref, g_ref = attention64(A, q, k, v, scale, bias32, w=w)
  tol = {jnp.float16: 5e-3, jnp.bfloat16: 1.5e-2}[dtype]
  b = jnp.asarray(bias32)
  out = jax.jit(att)(q, k, v, b)
  assert out.dtype == dtype and np.isfinite(np.asarray(out, np.float32)).all()
  assert rel_err(out, o_ref[0]) < tol
  loss = lambda *a: jnp.sum(att(*a).astype(jnp.float32) * w)  # noqa: E731
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, b)
  assert [g.dtype for g in grads] == [dtype, dtype, dtype, jnp.float32]
  for name, got, ref in zip("q k v bias".split(), grads, g_ref):
    assert np.isfinite(np.asarray(got, np.float32)).all(), name
    assert rel_err(got, ref[0]) < 2 * tol, name
  tans = [jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in (q, k, v, b)]
  _, jv = jax.jvp(att, (q, k, v, b), tuple(tans))
  _, jv_ref = attention64(A, q, k, v, scale, bias32, tangents=tans)
  assert rel_err(jv, jv_ref[0]) < 2 * tol
  # a 16-bit bias is widened exactly and its gradient keeps its dtype
  b16 = jnp.asarray(rng.standard_normal(A.nnz) * 3, dtype)
  o_ref, g_ref = attention64(A, q, k, v, scale, b16, w=w)
  assert rel_err(att(q, k, v, b16), o_ref[0]) < tol
  gb = jax.grad(loss, argnums=3)(q, k, v, b16)
  assert gb.dtype == dtype and gb.shape == b16.shape
  assert rel_err(gb, g_ref[3][0]) < 2 * tol


# -- operand errors ---------------------------------------------------------------------------
def test_attention_operand_errors(rng):
  A = make_pattern(rng, 10, 8)
  q, k, v = qkv(rng, A, d=4, dv=3)
  with pytest.raises(checks.OperandError, match=r"\(10, 0\).*\(8, 0\).*d = 0"):
    jst.sparse_attention(A, q[:, :0], k[:, :0], v)
  with pytest.raises(checks.OperandError, match=r"\(10, 0\).*\(8, 0\).*d = 0"):
    jst.sparse_attention(A, q[:, :0], k[:, :0], v, scale=1.0)
  q2 = jnp.stack([q, q])
  k3 = jnp.stack([k, k, k])
  with pytest.raises(checks.OperandError, match=r"head counts.*\(2, 10, 4\).*\(3, 8, 4\)"):
    jst.sparse_attention(A, q2, k3, v)
  with pytest.raises(checks.OperandError, match=rf"bias.*\(3, {A.nnz}\).*do not broadcast"):
    jst.sparse_attention(A, q2, k, v, bias=jnp.zeros((3, A.nnz)))
  with pytest.raises(checks.OperandError, match=rf"{A.nnz} nonzeros.*\({A.nnz + 1},\)"):
    jst.sparse_attention(A, q, k, v, bias=jnp.zeros(A.nnz + 1))
  with pytest.raises(checks.OperandError, match=r"bias.*int32"):
    jst.sparse_attention(A, q, k, v, bias=jnp.zeros(A.nnz, jnp.int32))
  # d = 0 under jit: still a trace-time error
  with pytest.raises(checks.OperandError, match="d = 0"):
    jax.jit(lambda a, b: jst.sparse_attention(A, a, b, v))(q[:, :0], k[:, :0])
