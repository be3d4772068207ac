"""edge_softmax and sparse_attention on the CPU kernels, against float64 numpy references."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from conftest import random_coo, rel_err
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
  check_grads(lambda x: jst.edge_softmax(A, x).values, (v,), order=1, modes=["fwd", "rev"],
              atol=2e-2, rtol=2e-2)
  check_grads(f, (v,), order=2, modes=["fwd", "rev"], atol=2e-2, rtol=2e-2)
  # analytic gradient: dL/dx = y * (w - rowsum(y * w))
  y = softmax_ref(A, np.asarray(v, np.float64))
  yw = y * np.asarray(w, np.float64)
  r = np.asarray(A.rows)
  rs = np.stack([np.bincount(r, h, minlength=23)[r] for h in yw])
  ref = y * (np.asarray(w, np.float64) - rs)
  assert rel_err(jax.jit(jax.grad(f))(v), ref) < 1e-5
  # grad under vmap equals a loop
  g = jax.vmap(jax.grad(lambda x, ww: jnp.sum(jst.edge_softmax(A, x).values * ww)))(v, w)
  assert rel_err(g, ref) < 1e-5


def test_edge_softmax_errors(rng):
  A = make_pattern(rng, 5, 5)
  with pytest.raises(ValueError):
    jst.edge_softmax(A, jnp.zeros(A.nnz + 1))
  with pytest.raises(TypeError):
    jst.edge_softmax(A, jnp.zeros(A.nnz, jnp.int32))
