"""edge_softmax and sparse_attention on the CPU kernels, against float64 numpy references."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_coo, rel_err
from jax.test_util import check_grads

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]
TOL = {jnp.float32: 1e-5, jnp.float16: 2e-3, jnp.bfloat16: 1.5e-2}
SHAPES = [(1, 1), (7, 13), (17, 9), (40, 33), (64, 100), (9, 131)]


def make_pattern(rng, m, n, density=0.3, empty_rows=0):
  rows, cols, _ = random_coo(rng, m, n, density)
  if rows.size == 0:
    rows, cols = np.array([m - 1]), np.array([0])
  if empty_rows:
    drop = rng.choice(m, size=min(empty_rows, m - 1), replace=False)
    keep = ~np.isin(rows, drop)
    rows, cols = rows[keep], cols[keep]
  return SparseMatrix.from_coo(rows, cols, shape=(m, n))


def softmax_ref(A, values):
  """float64 row softmax over the nonzeros (values [..., nnz] in format order)."""
  v = np.asarray(values, np.float64)
  r = np.asarray(A.rows)
  out = np.zeros_like(v)
  for i in np.unique(r):
    sel = r == i
    x = v[..., sel]
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out[..., sel] = e / e.sum(axis=-1, keepdims=True)
  return out


def softmax_jvp_ref(A, y, t):
  """float64 derivative of the row softmax at output y applied to t: y * (t - rowsum(y * t))
  (self-adjoint, so also the vjp of cotangent t). y, t: [H, nnz] in format order."""
  y, t = np.asarray(y, np.float64), np.asarray(t, np.float64)
  r = np.asarray(A.rows)
  rowsum = np.stack([np.bincount(r, h, minlength=A.shape[0])[r] for h in y * t])
  return y * (t - rowsum)


# -- edge_softmax -----------------------------------------------------------------------------
@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_softmax_matches_float64(rng, m, n, dtype):
  A = make_pattern(rng, m, n, empty_rows=2)
  v = jnp.asarray(rng.standard_normal(A.nnz) * 3, dtype)
  Y = jst.edge_softmax(A.with_values(v))
  assert isinstance(Y, SparseMatrix) and Y.values.dtype == dtype and Y.values.shape == (A.nnz,)
  ref = softmax_ref(A, np.asarray(v, np.float64))
  assert rel_err(Y.values, ref) < TOL[dtype]
  # every row with nonzeros sums to one
  sums = np.bincount(np.asarray(A.rows), np.asarray(Y.values, np.float64), minlength=m)
  present = np.bincount(np.asarray(A.rows), minlength=m) > 0
  np.testing.assert_allclose(sums[present], 1.0, atol=20 * TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_softmax_heads_and_vmap(rng, dtype):
  A = make_pattern(rng, 37, 29)
  v = jnp.asarray(rng.standard_normal((3, A.nnz)), dtype)
  out = jst.edge_softmax(A.with_values(v)).values
  assert out.shape == (3, A.nnz)
  assert rel_err(out, softmax_ref(A, np.asarray(v, np.float64))) < TOL[dtype]
  f = lambda x: jst.edge_softmax(A, x).values
  batched = jax.vmap(f)(v)
  loop = jnp.stack([f(v[i]) for i in range(3)])
  np.testing.assert_array_equal(np.asarray(batched, np.float32), np.asarray(loop, np.float32))
  # vmap over a head-carrying batch
  vv = jnp.asarray(rng.standard_normal((2, 3, A.nnz)), dtype)
  b2 = jax.jit(jax.vmap(f))(vv)
  assert rel_err(b2, softmax_ref(A, np.asarray(vv, np.float64))) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_softmax_large_logits(rng, dtype):
  A = make_pattern(rng, 50, 40, density=0.2)
  v = rng.uniform(-1e4, 1e4, A.nnz)
  v = jnp.asarray(v, dtype)
  out = np.asarray(jst.edge_softmax(A, v).values, np.float64)
  assert np.all(np.isfinite(out))
  assert rel_err(out, softmax_ref(A, np.asarray(v, np.float64))) < TOL[dtype]


def test_edge_softmax_grads(rng):
  A = make_pattern(rng, 23, 19, empty_rows=3)
  v = jnp.asarray(rng.standard_normal((2, A.nnz)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((2, A.nnz)), jnp.float32)
  f = lambda x: jnp.sum(jst.edge_softmax(A, x).values * w)
  check_grads(
    lambda x: jst.edge_softmax(A, x).values,
    (v,),
    order=1,
    modes=["fwd", "rev"],
    atol=2e-2,
    rtol=2e-2,
  )
  check_grads(f, (v,), order=2, modes=["fwd", "rev"], atol=5e-2, rtol=5e-2)
  # analytic gradient: dL/dx = y * (w - rowsum(y * w))
  ref = softmax_jvp_ref(A, softmax_ref(A, np.asarray(v, np.float64)), w)
  assert rel_err(jax.jit(jax.grad(f))(v), ref) < 1e-4
  # grad under vmap equals a loop
  g = jax.vmap(jax.grad(lambda x, ww: jnp.sum(jst.edge_softmax(A, x).values * ww)))(v, w)
  assert rel_err(g, ref) < 1e-4


def test_edge_softmax_second_derivatives(rng):
  """Hessians (forward-over-reverse and reverse-over-reverse) equal a dense softmax's."""
  A = make_pattern(rng, 7, 6, density=0.45, empty_rows=1)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  mask = np.zeros(A.shape, bool)
  mask[r, c] = True
  w = jnp.asarray(rng.standard_normal(A.nnz), jnp.float32)
  v = jnp.asarray(rng.standard_normal(A.nnz), jnp.float32)

  def dense(v):
    s = jnp.where(mask, jnp.zeros(A.shape).at[r, c].set(v), -jnp.inf)
    return jnp.nan_to_num(jax.nn.softmax(s, axis=1))[r, c]

  f = lambda v: jnp.sum(jnp.tanh(jst.edge_softmax(A, v).values) * w)
  g = lambda v: jnp.sum(jnp.tanh(dense(v)) * w)
  for hess in (jax.hessian, lambda f: jax.jacrev(jax.jacrev(f))):
    assert rel_err(hess(f)(v), hess(g)(v)) < 1e-5


def test_edge_softmax_errors(rng):
  A = make_pattern(rng, 5, 5)
  with pytest.raises(ValueError):
    jst.edge_softmax(A, jnp.zeros(A.nnz + 1))
  with pytest.raises(TypeError):
    jst.edge_softmax(A, jnp.zeros(A.nnz, jnp.int32))


# -- sparse_attention -------------------------------------------------------------------------
def masked_softmax_ref(A, s, bias=None):
  """float64 row softmax of dense scores s [..., m, n] (+ bias [..., nnz]) over A's nonzeros;
  rows with no nonzeros give zeros."""
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  logits = np.full(s.shape, -np.inf)
  b = 0.0 if bias is None else np.asarray(bias, np.float64)
  logits[..., r, c] = s[..., r, c] + b
  mx = np.max(logits, axis=-1, keepdims=True)
  e = np.exp(logits - np.where(np.isfinite(mx), mx, 0.0))
  den = e.sum(-1, keepdims=True)
  return np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)


def attention_ref(A, q, k, v, scale=None, bias=None):
  """float64 dense masked softmax attention; rows with no nonzeros give zeros."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  d = q.shape[-1]
  scale = 1.0 / np.sqrt(d) if scale is None else scale
  s = scale * np.einsum("...id,...jd->...ij", q, k)
  H = max(x.shape[0] if x.ndim == 3 else 1 for x in (q, k, v))
  if q.ndim == 3 or k.ndim == 3 or v.ndim == 3 or (bias is not None and np.ndim(bias) == 2):
    s = np.broadcast_to(s, (H,) + A.shape)
  return masked_softmax_ref(A, s, bias) @ v


def attention_grads_ref(A, q, k, v, scale, bias, w):
  """float64 gradients of sum(attention * w) for q, k, v ([H_i, rows, features], H_i in {1, H})
  and bias ([H_b, nnz] or None), each summed to its operand's head count (dense, masked)."""
  q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
  H = w.shape[0]
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  qb, kb, vb = (np.broadcast_to(x, (H,) + x.shape[1:]) for x in (q, k, v))
  p = masked_softmax_ref(A, scale * qb @ np.swapaxes(kb, 1, 2), bias)
  o = p @ vb
  ds = p * (w @ np.swapaxes(vb, 1, 2) - np.sum(w * o, -1, keepdims=True))
  to_heads = lambda g, x: g.sum(0, keepdims=True) if x.shape[0] == 1 else g
  grads = [
    to_heads(scale * ds @ kb, q),
    to_heads(scale * np.swapaxes(ds, 1, 2) @ qb, k),
    to_heads(np.swapaxes(p, 1, 2) @ w, v),
  ]
  if bias is not None:
    grads.append(to_heads(ds[:, r, c], np.asarray(bias)))
  return grads


def qkv(rng, A, d=16, dv=8, dtype=jnp.float32, h=None, amp=1.0):
  m, n = A.shape
  lead = () if h is None else (h,)
  mk = lambda *s: jnp.asarray(rng.standard_normal(lead + s) * amp, dtype)
  return mk(m, d), mk(n, d), mk(n, dv)


ATT_TOL = {jnp.float32: 1e-5, jnp.float16: 4e-3, jnp.bfloat16: 3e-2}


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_matches_float64(rng, m, n, dtype):
  A = make_pattern(rng, m, n, empty_rows=2)
  q, k, v = qkv(rng, A, d=16, dv=24, dtype=dtype, amp=1.5)
  out = jax.jit(jst.sparse_attention)(A, q, k, v)
  assert out.shape == (m, 24) and out.dtype == dtype
  assert rel_err(out, attention_ref(A, q, k, v)) < ATT_TOL[dtype]
  bias = jnp.asarray(rng.standard_normal(A.nnz) * 2, dtype)
  out = jst.sparse_attention(A, q, k, v, scale=0.3, bias=bias)
  assert rel_err(out, attention_ref(A, q, k, v, 0.3, bias)) < ATT_TOL[dtype]


def test_attention_empty_rows(rng):
  A = make_pattern(rng, 40, 30, empty_rows=15)
  q, k, v = qkv(rng, A)
  out = np.asarray(jst.sparse_attention(A, q, k, v))
  empty = np.bincount(np.asarray(A.rows), minlength=40) == 0
  assert empty.sum() >= 10
  assert np.all(out[empty] == 0) and np.all(np.isfinite(out))
  assert rel_err(out, attention_ref(A, q, k, v)) < 1e-5
  # and the gradient of an all-empty matrix is zero, finite
  E = SparseMatrix.from_coo(np.zeros(0, np.int64), np.zeros(0, np.int64), shape=(9, 5))
  qe, ke, ve = qkv(rng, E)
  g = jax.grad(lambda a: jnp.sum(jst.sparse_attention(E, a, ke, ve)))(qe)
  assert np.all(np.asarray(g) == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_large_logits(rng, dtype):
  A = make_pattern(rng, 48, 40, density=0.25, empty_rows=3)
  q, k, v = qkv(rng, A, d=16, dv=8, dtype=dtype, amp=25.0)  # logits ~ 25*25*4 = 2.5e3
  bias = jnp.asarray(rng.uniform(-1e4, 1e4, A.nnz), dtype)
  for b in (None, bias):
    out = np.asarray(jst.sparse_attention(A, q, k, v, scale=1.0, bias=b), np.float64)
    assert np.all(np.isfinite(out))
    ref = attention_ref(A, q, k, v, 1.0, b)
    assert np.abs(attention_ref(A, q, k, v, 1.0, None)).max() > 0
    # float32 logits of magnitude L carry absolute rounding ~L * 6e-8 into exp(): ~6e-4 at 1e4
    assert rel_err(out, ref) < max(ATT_TOL[dtype] * 2, 1e-3)
  g = jax.grad(
    lambda a: jnp.sum(jst.sparse_attention(A, a, k, v, scale=1.0, bias=bias).astype(jnp.float32))
  )(q)
  assert np.all(np.isfinite(np.asarray(g, np.float32)))


@pytest.mark.parametrize("with_heads", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_check_grads(rng, with_heads, with_bias):
  A = make_pattern(rng, 21, 17, density=0.3, empty_rows=2)
  h = 2 if with_heads else None
  q, k, v = qkv(rng, A, d=8, dv=5, h=h)
  args = [q, k, v]
  if with_bias:
    args.append(jnp.asarray(rng.standard_normal(((h,) if h else ()) + (A.nnz,)), jnp.float32))
  f = lambda *a: jst.sparse_attention(A, *a[:3], scale=0.7, bias=a[3] if len(a) > 3 else None)
  # float32 central differences: 1e-2 failed ~1 seed in a few hundred (the numerical side: the
  # analytic gradient matched float64 differences to 5e-7); test_attention_grad_matches_float64
  # (below) is the tight check
  check_grads(f, args, order=1, modes=["fwd", "rev"], atol=2e-2, rtol=2e-2)


def test_attention_grad_matches_float64(rng):
  """grad through the fused backward vs central differences on the float64 reference."""
  A = make_pattern(rng, 19, 15, density=0.35, empty_rows=2)
  q, k, v = qkv(rng, A, d=8, dv=6)
  bias = jnp.asarray(rng.standard_normal(A.nnz), jnp.float32)
  w = rng.standard_normal((19, 6))
  loss = lambda *a: jnp.sum(jst.sparse_attention(A, *a[:3], bias=a[3]) * w)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)
  ref_loss = lambda *a: float(np.sum(attention_ref(A, *a[:3], None, a[3]) * w))
  base = [np.asarray(x, np.float64) for x in (q, k, v, bias)]
  for i, g in enumerate(grads):
    num = np.zeros_like(base[i])
    for idx in np.ndindex(base[i].shape):
      plus = [b.copy() for b in base]
      minus = [b.copy() for b in base]
      plus[i][idx] += 1e-6
      minus[i][idx] -= 1e-6
      num[idx] = (ref_loss(*plus) - ref_loss(*minus)) / 2e-6
    assert rel_err(g, num) < 1e-4, i
  # forward-mode agrees with reverse mode
  t = [jnp.asarray(rng.standard_normal(x.shape), jnp.float32) for x in (q, k, v, bias)]
  _, jv = jax.jvp(loss, (q, k, v, bias), tuple(t))
  dot = sum(float(jnp.vdot(g, ti)) for g, ti in zip(grads, t))
  assert abs(float(jv) - dot) < 1e-4 * (abs(dot) + 1)


def hub_pattern(rng, m, n, hub, density=0.1):
  """A random pattern plus row 0 with `hub` nonzeros and two empty rows."""
  rows, cols, _ = random_coo(rng, m, n, density)
  keep = (rows != 0) & (rows != 1) & (rows != m - 1)
  rows = np.concatenate([np.zeros(hub, np.int64), rows[keep]])
  cols = np.concatenate([rng.permutation(n)[:hub], cols[keep]])
  return SparseMatrix.from_coo(rows, cols, shape=(m, n))


def test_attention_grads_match_float64_heads(rng):
  """Backward with heads broadcast (one Q head, H K/V heads), a hub row and empty rows."""
  A = hub_pattern(rng, 60, 50, hub=45)
  H = 2
  q = qkv(rng, A, d=12, dv=7, h=1)[0]
  _, k, v = qkv(rng, A, d=12, dv=7, h=H)
  bias = jnp.asarray(rng.standard_normal((H, A.nnz)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((H, 60, 7)), jnp.float32)
  loss = lambda *a: jnp.sum(jst.sparse_attention(A, *a[:3], bias=a[3], scale=0.4) * w)
  got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)
  for g, r in zip(got, attention_grads_ref(A, q, k, v, 0.4, bias, w)):
    assert g.shape == r.shape
    assert rel_err(g, r) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_heads_and_vmap(rng, dtype):
  A = make_pattern(rng, 33, 27, empty_rows=2)
  H = 3
  q, k, v = qkv(rng, A, d=16, dv=8, dtype=dtype, h=H)
  bias = jnp.asarray(rng.standard_normal((H, A.nnz)), dtype)
  native = jst.sparse_attention(A, q, k, v, bias=bias)
  assert native.shape == (H, 33, 8)
  assert rel_err(native, attention_ref(A, q, k, v, None, bias)) < ATT_TOL[dtype]
  f = lambda a, b, c, bb: jst.sparse_attention(A, a, b, c, bias=bb)
  batched = jax.jit(jax.vmap(f))(q, k, v, bias)
  loop = jnp.stack([f(q[i], k[i], v[i], bias[i]) for i in range(H)])
  np.testing.assert_allclose(
    np.asarray(batched, np.float32), np.asarray(loop, np.float32), rtol=1e-6, atol=1e-6
  )
  # shared K/V (one head) broadcast against per-head Q
  out = jst.sparse_attention(A, q, k[0], v[0])
  assert rel_err(out, attention_ref(A, q, k[:1], v[:1])) < ATT_TOL[dtype]
  if dtype == jnp.float32:
    loss = lambda a, b, c, bb: jnp.sum(f(a, b, c, bb) ** 2)
    gv = jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)
    gl = [jax.grad(loss, argnums=(0, 1, 2, 3))(q[i], k[i], v[i], bias[i]) for i in range(H)]
    for j in range(4):
      np.testing.assert_allclose(
        np.asarray(gv[j]), np.stack([np.asarray(g[j]) for g in gl]), rtol=1e-5, atol=1e-6
      )
    # jvp under vmap
    t = tuple(jnp.ones_like(x) for x in (q, k, v, bias))
    jv = jax.vmap(lambda *a: jax.jvp(f, a[:4], a[4:])[1])(q, k, v, bias, *t)
    jl = jnp.stack(
      [jax.jvp(f, (q[i], k[i], v[i], bias[i]), tuple(x[i] for x in t))[1] for i in range(H)]
    )
    np.testing.assert_allclose(np.asarray(jv), np.asarray(jl), rtol=1e-5, atol=1e-6)


def test_attention_errors(rng):
  A = make_pattern(rng, 10, 8)
  q, k, v = qkv(rng, A)
  with pytest.raises(ValueError):
    jst.sparse_attention(A, q[:5], k, v)
  with pytest.raises(TypeError):
    jst.sparse_attention(A, q, k.astype(jnp.float16), v)
  with pytest.raises(ValueError):
    jst.sparse_attention(A, q, k, v, bias=jnp.zeros(A.nnz + 2))
  with pytest.raises(ValueError):
    jst.sparse_attention(A, q, k[:, :3], v)


def test_attention_higher_order_raises(rng):
  """Second derivatives (through the backward, which reads the saved lse as a constant) would
  be wrong, so every way to ask for them raises instead of returning numbers."""
  A = make_pattern(rng, 9, 7, density=0.4)
  q, k, v = qkv(rng, A, d=4, dv=3)
  loss = lambda q, k, v: jnp.sum(jst.sparse_attention(A, q, k, v) ** 2)
  jax.grad(loss, argnums=(0, 1, 2))(q, k, v)  # first order still works
  for second in (
    lambda: jax.hessian(loss)(q, k, v),
    lambda: jax.grad(lambda q: jnp.sum(jax.grad(loss)(q, k, v) ** 2))(q),
    lambda: jax.jvp(jax.grad(loss), (q, k, v), (q, k, v)),
    lambda: jax.jacfwd(jax.jacfwd(loss))(q, k, v),
  ):
    with pytest.raises(NotImplementedError, match="order > 1"):
      second()


def test_softmax_ops_reject_float64(rng, x64):
  """float32 math: float64 operands are refused at trace time (CPU and GPU alike)."""
  A = make_pattern(rng, 6, 5)
  q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float64) for s in ((6, 4), (5, 4), (5, 4)))
  with pytest.raises(TypeError, match="float64 to float32"):
    jst.sparse_attention(A, q, k, v)
  with pytest.raises(TypeError, match="float64 to float32"):
    jst.edge_softmax(A, jnp.ones(A.nnz, jnp.float64))
  with pytest.raises(TypeError, match="Q .* and K .* same dtype"):
    jst.sparse_attention(A, q.astype(jnp.float32), k.astype(jnp.float16), v)


def _all_eqns(jaxpr):
  """Every equation of a jaxpr, those of sub-jaxprs in params (pjit, custom rules) included."""
  for e in jaxpr.eqns:
    yield e
    for p in e.params.values():
      sub = getattr(p, "jaxpr", p)  # ClosedJaxpr -> Jaxpr
      if hasattr(sub, "eqns"):
        yield from _all_eqns(sub)


@pytest.mark.parametrize("has_bias", [False, True])
def test_attention_grads_primitive(rng, has_bias):
  """attention_grads_p (the tensor-core backward's primitive) bound directly, for float32 and
  d = 8, which the kernels do not take: the composed lowering on every platform, against
  float64 gradients; its batch rule, and dbias [H, 0] without a bias."""
  from jaxsparse_tc._src import attention

  A = hub_pattern(rng, 40, 50, hub=45)
  H, m, scale = 2, A.shape[0], 0.3
  q, k, v = qkv(rng, A, d=8, dv=8, dtype=jnp.float32, h=H)
  bias = jnp.asarray(rng.standard_normal((H, A.nnz)), jnp.float32) if has_bias else None
  b = bias if has_bias else jnp.zeros((1, 1), jnp.float32)
  w = jnp.asarray(rng.standard_normal((H, m, 8)), jnp.float32)
  params = dict(
    shape=A.shape,
    scale=scale,
    has_bias=has_bias,
    grouped=A.grouped[0],
    grouped_t=A.grouped[1],
    options=jst.KernelOptions(),
  )
  o, lse = attention.attention_fwd_p.bind(q, k, v, b, *A.pattern_operands(), **params)
  grads = lambda ww: attention.attention_grads_p.bind(
    q,
    k,
    v,
    b,
    o,
    lse,
    ww,  # noqa: E731
    *A.pattern_operands(),
    **params,
  )
  dq, dk, dv, db = grads(w)
  ref = attention_grads_ref(A, q, k, v, scale, bias, w)
  for g, r in zip((dq, dk, dv, db), ref):
    if r is not None:
      assert rel_err(g, r) < 1e-4
  assert db.shape == ((H, A.nnz) if has_bias else (H, 0))
  batched = jax.vmap(grads)(jnp.stack([w, -2.0 * w]))
  for g, gb in zip((dq, dk, dv, db), batched):
    np.testing.assert_allclose(gb[1], -2.0 * g, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_attention_backward_keeps_operands_16bit(rng, dtype):
  """The backward makes no float32 copy of an [H, n, d] operand (that copy was most of its
  memory): the per-edge pass takes the 16-bit Q and K, and where it is composed (CPU, wide
  rows) its logits come from a float32-out SDDMM of them."""
  from jaxsparse_tc._src import attention
  from jaxsparse_tc._src.sddmm import sddmm_p

  A = make_pattern(rng, 40, 33)
  q, k, v = qkv(rng, A, d=16, dv=8, dtype=dtype, h=2)

  def upcasts(eqns):
    return [
      e
      for e in eqns
      if e.primitive.name == "convert_element_type"
      and e.outvars[0].aval.dtype == jnp.float32
      and e.outvars[0].aval.shape == q.shape
    ]

  eqns = list(
    _all_eqns(
      jax.make_jaxpr(
        jax.grad(lambda q: jnp.sum(jst.sparse_attention(A, q, k, v).astype(jnp.float32)))
      )(q).jaxpr
    )
  )
  passes = [e for e in eqns if e.primitive in (attention.attention_bwd_p, sddmm_p)]
  assert passes and all(e.invars[0].aval.dtype == dtype for e in passes)
  assert not upcasts(eqns), "a float32 copy of an [H, n, d] operand"
  o, lse = attention.attention_fwd_p.bind(
    q,
    k,
    v,
    jnp.zeros((1, 1), jnp.float32),
    *A.pattern_operands(),
    shape=A.shape,
    scale=0.25,
    has_bias=False,
    grouped=A.grouped[0],
    grouped_t=A.grouped[1],
    options=jst.KernelOptions(),
  )
  jaxpr = jax.make_jaxpr(
    functools.partial(attention._edge_pass, shape=A.shape, scale=0.25, has_bias=False)
  )(q, k, v, jnp.zeros((1, 1), jnp.float32), o, lse, o, *A.pattern_operands()).jaxpr
  composed = list(_all_eqns(jaxpr))
  sddmms = [e for e in composed if e.primitive is sddmm_p]
  assert sddmms and all(e.params["float32_out"] for e in sddmms)
  assert all(e.invars[0].aval.dtype == dtype for e in sddmms)
  assert not upcasts(composed), "a float32 copy of an [H, n, d] operand"
