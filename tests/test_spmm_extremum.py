"""spmm(A, X, reduce="max" | "min"): the CPU kernel against float64 references on random
patterns, the composed rule (what GPUs run) against the kernel, gradients, jvp, vmap, and the
empty-row and NaN rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_coo
from jax.test_util import check_grads

import jaxsparse_tc as jst
from jaxsparse_tc._src import spmm_extremum as ext
from jaxsparse_tc._src.pattern import PatternOperands


def _reference(A, x, reduce):
  """(out, arg) in float64 from A's entries in format order: the best product per row and
  feature, the first position on a tie, 0 and -1 in rows without entries."""
  v = np.atleast_2d(np.asarray(A.values, np.float64))  # [Hv, nnz]
  xx = np.asarray(x, np.float64)
  xx = xx.reshape((-1,) + xx.shape[-2:])  # [Hx, n, d]
  H = max(v.shape[0], xx.shape[0])
  m, d = A.shape[0], xx.shape[2]
  rows, cols = np.asarray(A.rows), np.asarray(A.cols)
  out, arg = np.zeros((H, m, d)), np.full((H, m, d), -1)
  better = np.greater if reduce == "max" else np.less
  for h in range(H):
    vh, xh = v[min(h, v.shape[0] - 1)], xx[min(h, xx.shape[0] - 1)]
    for e in range(A.nnz):
      p = vh[e] * xh[cols[e]]
      i = rows[e]
      take = (arg[h, i] < 0) | better(p, out[h, i])
      out[h, i] = np.where(take, p, out[h, i])
      arg[h, i] = np.where(take, e, arg[h, i])
  return out, arg


def _random_matrix(rng, kind, dtype, heads=None):
  m, n = {"one_row": (1, 13), "one_col": (17, 1), "empty": (9, 7)}.get(kind, (41, 33))
  if kind == "empty":
    rows, cols = np.zeros(0, np.int64), np.zeros(0, np.int64)
  else:
    rows, cols, _ = random_coo(rng, m, n, 0.15)
    if kind == "hub":  # a row with every column, rows without entries
      rows = np.concatenate([rows[rows % 3 != 0], np.full(n, 5)])
      cols = np.concatenate([cols[: rows.size - n], np.arange(n)])
    if kind == "duplicates":
      rows, cols = np.concatenate([rows, rows[:20]]), np.concatenate([cols, cols[:20]])
  shape_v = (rows.size,) if heads is None else (heads, rows.size)
  vals = rng.standard_normal(shape_v).astype(dtype)
  return jst.SparseMatrix.from_coo(rows, cols, vals, shape=(m, n))


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("kind", ["random", "hub", "duplicates", "one_row", "one_col", "empty"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, jnp.bfloat16, np.float64])
def test_matches_float64_reference(rng, x64, reduce, kind, dtype):
  A = _random_matrix(rng, kind, dtype)
  x = rng.standard_normal((A.shape[1], 6)).astype(dtype)
  out = jax.jit(lambda A, x: jst.spmm(A, x, reduce=reduce))(A, x)
  assert out.dtype == jnp.dtype(dtype) and out.shape == (A.shape[0], 6)
  ref, _ = _reference(A, x, reduce)
  tol = {np.float64: 1e-12, np.float32: 1e-6}.get(dtype, 1e-2)
  np.testing.assert_allclose(np.asarray(out, np.float64), ref[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("hv,hx", [(3, None), (None, 3), (3, 3)])
def test_heads(rng, hv, hx):
  A = _random_matrix(rng, "random", np.float32, heads=hv)
  x = rng.standard_normal(((hx,) if hx else ()) + (A.shape[1], 5)).astype(np.float32)
  out = jst.spmm(A, x, reduce="max")
  ref, _ = _reference(A, x, "max")
  np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_composed_rule_matches_the_kernel_with_ties(rng, reduce):
  """What GPUs run (XLA segment reductions) gives the kernel's outputs and positions, ties
  (small integers) included."""
  A = _random_matrix(rng, "duplicates", np.float32)
  A = A.with_values(jnp.asarray(rng.integers(-2, 3, A.nnz), jnp.float32))
  x = jnp.asarray(rng.integers(-2, 3, (A.shape[1], 7)), jnp.float32)
  P = A.pattern_operands()
  args = (A.values.reshape(1, -1), x[None], *P)
  kw = dict(shape=A.shape, is_min=reduce == "min")
  out, arg = jax.jit(lambda *a: ext.spmm_extremum_p.bind(*a, **kw))(*args)
  c_out, c_arg = jax.jit(lambda *a: ext._composed(*a, **kw))(*args)
  ref, ref_arg = _reference(A, x, reduce)
  np.testing.assert_array_equal(arg, ref_arg)
  np.testing.assert_array_equal(c_arg, ref_arg)
  np.testing.assert_array_equal(out, ref)
  np.testing.assert_array_equal(c_out, ref)
  assert isinstance(PatternOperands.unflat(P), PatternOperands)


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_gradients(rng, x64, reduce):
  A = _random_matrix(rng, "hub", np.float64)
  x = jnp.asarray(rng.standard_normal((A.shape[1], 4)))
  f = lambda v, x: jst.spmm(A.with_values(v), x, reduce=reduce)
  check_grads(f, (A.values, x), order=1, modes=("fwd", "rev"), eps=1e-6)
  # the cotangent lands on each output's winning entry: against the reference's positions
  w = rng.standard_normal((A.shape[0], 4))
  dv, dx = jax.grad(lambda v, x: jnp.sum(f(v, x) * w), argnums=(0, 1))(A.values, x)
  _, arg = _reference(A, x, reduce)
  cols, vals = np.asarray(A.cols), np.asarray(A.values)
  ref_dv, ref_dx = np.zeros(A.nnz), np.zeros(x.shape)
  for i, k in zip(*np.nonzero(arg[0] >= 0)):
    e = arg[0, i, k]
    ref_dv[e] += w[i, k] * x[cols[e], k]
    ref_dx[cols[e], k] += w[i, k] * vals[e]
  np.testing.assert_allclose(dv, ref_dv, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(dx, ref_dx, rtol=1e-12, atol=1e-12)


def test_vmap_over_features_and_values(rng):
  A = _random_matrix(rng, "random", np.float32)
  xs = jnp.asarray(rng.standard_normal((3, A.shape[1], 5)), jnp.float32)
  vs = jnp.asarray(rng.standard_normal((3, A.nnz)), jnp.float32)
  got = jax.vmap(lambda v, x: jst.spmm(A.with_values(v), x, reduce="min"))(vs, xs)
  for b in range(3):
    want = jst.spmm(A.with_values(vs[b]), xs[b], reduce="min")
    np.testing.assert_array_equal(got[b], want)
  got = jax.vmap(lambda x: jst.spmm(A, x, reduce="max"))(xs)
  np.testing.assert_array_equal(got[1], jst.spmm(A, xs[1], reduce="max"))


def test_empty_rows_and_nan(rng):
  """A row without entries gives 0 and no gradient; a NaN product makes its output NaN."""
  rows, cols = np.array([0, 0, 2, 2]), np.array([0, 1, 1, 2])
  A = jst.SparseMatrix.from_coo(rows, cols, np.ones(4, np.float32), shape=(4, 3))
  x = jnp.asarray(rng.standard_normal((3, 2)), jnp.float32)
  out = jst.spmm(A, x, reduce="max")
  assert np.all(np.asarray(out)[[1, 3]] == 0)
  np.testing.assert_allclose(out[0], np.maximum(x[0], x[1]))
  dx = jax.grad(lambda x: jnp.sum(jst.spmm(A, x, reduce="max")))(x)
  assert np.all(np.isfinite(dx)) and float(jnp.sum(dx)) == 4.0  # 2 rows x 2 features, one winner
  x = x.at[1, 0].set(jnp.nan)
  out = np.asarray(jst.spmm(A, x, reduce="max"))
  assert np.isnan(out[0, 0]) and np.isnan(out[2, 0]) and np.isfinite(out[:, 1]).all()


def test_reduce_is_checked_and_the_cpu_kernel_runs(rng):
  A = _random_matrix(rng, "random", np.float32)
  x = jnp.ones((A.shape[1], 3), jnp.float32)
  with pytest.raises(ValueError, match="reduce must be one of"):
    jst.spmm(A, x, reduce="mean")
  text = jax.jit(lambda A, x: jst.spmm(A, x, reduce="min")).lower(A, x).as_text()
  assert jst._src.extensions.target("spmm_extremum") in text


def test_reordered_and_sharded_matrices(rng):
  """A reordered matrix gives the same max, a ShardedMatrix the same min (its multi-device
  cases: tests/test_distributed.py)."""
  from jaxsparse_tc import distributed as dist
  from jaxsparse_tc.reorder import reorder

  n = 40
  rows, cols, vals = random_coo(rng, n, n, 0.1)
  A = jst.SparseMatrix.from_coo(rows, cols, vals.astype(np.float32), shape=(n, n))
  x = jnp.asarray(rng.standard_normal((n, 3)), jnp.float32)
  R = reorder(A, "rcm").wrap(A)
  np.testing.assert_array_equal(jst.spmm(R, x, reduce="max"), jst.spmm(A, x, reduce="max"))
  SA = dist.shard_coo(rows, cols, vals.astype(np.float32), num_nodes=n, mesh=dist.make_mesh(1))
  got = SA.unshard_rows(jst.spmm(SA, SA.shard_rows(x), reduce="min"))
  np.testing.assert_array_equal(got, jst.spmm(A, x, reduce="min"))
  with pytest.raises(ValueError, match="reduce must be one of"):
    jst.spmm(SA, SA.shard_rows(x), reduce="mean")
