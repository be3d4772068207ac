"""A SparseMatrix's pattern arrays: checked where they can go wrong (the public constructor, a
pytree rebuilt with replaced pattern leaves, an operator's binding), size limits refused before
anything is allocated, and values that cannot be represented refused at construction."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsparse_tc as jst
from jaxsparse_tc._src import integrity
from jaxsparse_tc._src.integrity import PatternError

# Integrity is host-side; the CPU kernels are the reference here (GPU kernels under corrupt
# patterns: tests/test_gpu_safety.py).
pytestmark = pytest.mark.usefixtures("on_cpu")


def _matrix(rng, m=50, n=40, nnz=400):
  return jst.SparseMatrix.from_coo(
    rng.integers(0, m, nnz), rng.integers(0, n, nnz), rng.normal(size=nnz), shape=(m, n)
  )


def _reference(A, x):
  dense = np.zeros(A.shape)
  np.add.at(dense, (np.asarray(A.rows), np.asarray(A.cols)), np.asarray(A.values, np.float64))
  return dense @ np.asarray(x, np.float64)


def test_constructor_refuses_a_shape_the_pattern_does_not_have(rng):
  A = _matrix(rng, m=50, n=50)
  parts = (A.values, A.pattern, A.pattern_t, A.perm_t, A.perm_t_inv, A.input_to_format)
  with pytest.raises(PatternError, match=r"window_col_ptr has 8 entries, expected .* = 6"):
    jst.SparseMatrix(*parts, (40, 50))
  with pytest.raises(PatternError, match="pattern_t.window_col_ptr"):
    jst.SparseMatrix(*parts, (50, 40))
  B = jst.SparseMatrix(*parts, (50, 50))  # the right shape is accepted
  x = rng.normal(size=(50, 3)).astype(np.float32)
  np.testing.assert_allclose(B @ x, _reference(A, x), rtol=1e-5, atol=1e-5)


def test_constructor_checks_the_contents_of_concrete_arrays(rng):
  A = _matrix(rng)
  bad = A.pattern._replace(block_value_ptr=A.pattern.block_value_ptr.at[1].add(3))
  with pytest.raises(PatternError, match="block_value_ptr"):
    jst.SparseMatrix(A.values, bad, A.pattern_t, A.perm_t, A.perm_t_inv, A.input_to_format, A.shape)
  bad_cols = A.pattern._replace(window_cols=A.pattern.window_cols.at[0].set(A.shape[1] + 7))
  with pytest.raises(PatternError, match="window_cols"):
    jst.SparseMatrix(
      A.values, bad_cols, A.pattern_t, A.perm_t, A.perm_t_inv, A.input_to_format, A.shape
    )
  perm = A.perm_t.at[0].set(A.perm_t[1])  # no longer a permutation
  with pytest.raises(PatternError, match="perm"):
    jst.SparseMatrix(
      A.values, A.pattern, A.pattern_t, perm, A.perm_t_inv, A.input_to_format, A.shape
    )


def test_tree_arithmetic_over_a_matrix_is_refused_not_run(rng):
  A = _matrix(rng)
  with pytest.raises(PatternError, match="pattern"):
    jax.tree.map(lambda a, b: a + b, A, A)  # adds the integer pattern arrays too
  with pytest.raises(PatternError, match="dtype float32, expected int32"):
    jax.tree.map(lambda a: a * 0.5, A)
  # Mapping that leaves the pattern arrays alone, or maps the values only, is fine.
  same = jax.tree.map(lambda a: a, A)
  scaled = A.with_values(A.values * 2)
  x = rng.normal(size=(A.shape[1], 4)).astype(np.float32)
  np.testing.assert_allclose(same @ x, _reference(A, x), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(scaled @ x, 2 * _reference(A, x), rtol=1e-5, atol=1e-5)


def test_an_optimizer_style_update_of_a_params_tree_errors_or_is_right(rng):
  A = _matrix(rng)
  x = rng.normal(size=(A.shape[1], 4)).astype(np.float32)
  params = {"w": jnp.asarray(rng.normal(size=(4, 4)), jnp.float32), "A": A}

  def loss(p):
    return jnp.sum((p["A"] @ x) @ p["w"])

  # jax.grad refuses the integer leaves: a clear error before anything runs.
  with pytest.raises(TypeError, match="int32"):
    jax.grad(loss)(params)

  # A hand-written update over every leaf, casting back to each leaf's dtype (as
  # optax.apply_updates does): refused when the tree is rebuilt.
  def sgd(p):
    return jax.tree.map(lambda a: (a - 0.01 * jnp.ones_like(a)).astype(a.dtype), p)

  with pytest.raises(PatternError):
    sgd(params)
  # The same update inside jit: the pattern cannot be read at trace time, so the kernel's own
  # checks (CPU) refuse it when it runs.
  with pytest.raises(Exception, match="pattern|window|block|column|row"):
    jax.block_until_ready(jax.jit(lambda p: loss(sgd(p)))(params))
  # Updating only the float leaves (what optimizers do with filters) gives the right answer.
  grads = jax.grad(loss, allow_int=True)(params)
  new = jax.tree.map(
    lambda p, g: p - 0.1 * g if jnp.issubdtype(p.dtype, jnp.floating) else p, params, grads
  )
  want = (_reference(new["A"], x) @ np.asarray(new["w"], np.float64)).sum()
  np.testing.assert_allclose(float(loss(new)), want, rtol=1e-4)


def test_rebuilding_with_other_leaves_keeps_transformations_working(rng):
  A = _matrix(rng)
  x = jnp.asarray(rng.normal(size=(A.shape[1], 4)), jnp.float32)
  # vmap's in_axes prefixes are broadcast over the matrix's treedef (rebuilt with axis specs
  # as leaves).
  vals = jnp.stack([A.values, 2 * A.values])
  ys = jax.vmap(lambda A, v: A.with_values(v) @ x, in_axes=(None, 0))(A, vals)
  np.testing.assert_allclose(ys[1], 2 * ys[0], rtol=1e-5)
  np.testing.assert_allclose(ys[0], _reference(A, x), rtol=1e-4, atol=1e-4)
  # eval_shape gives ShapeDtypeStructs as leaves.
  shapes = jax.eval_shape(lambda A: A, A)
  assert shapes.shape == A.shape and shapes.pattern.rows.shape == A.pattern.rows.shape


def test_matrices_of_one_shape_share_a_trace_and_jit_outputs_are_not_reread(rng, monkeypatch):
  traces = []

  @jax.jit
  def step(A, x):
    traces.append(1)
    return A.with_values(A.values * 1.5), A @ x

  r, c = rng.integers(0, 50, 400), rng.integers(0, 40, 400)
  A, B = (jst.SparseMatrix.from_coo(r, c, rng.normal(size=400), shape=(50, 40)) for _ in "AB")
  x = jnp.ones((A.shape[1], 2), jnp.float32)
  calls = []
  real = integrity.check_contents
  monkeypatch.setattr(integrity, "check_contents", lambda *a: calls.append(1) or real(*a))
  for M in (A, B, A):
    out, _ = step(M, x)
  assert len(traces) == 1
  # The returned matrix (built from the program's outputs) is not read back to be checked.
  assert calls == []
  np.testing.assert_allclose(out.values, 1.5 * A.values, rtol=1e-6)


def test_sizes_past_the_format_are_refused_before_allocating():
  limit = str(integrity.MAX_DIM)
  with pytest.raises(ValueError, match=limit):
    jst.SparseMatrix.from_coo(np.array([2**33]), np.array([0]))  # shape inferred
  with pytest.raises(ValueError, match=limit):
    jst.SparseMatrix.from_coo(np.array([0, 1]), np.array([0, 0]), shape=(2**31 + 8, 1))
  with pytest.raises(ValueError, match=limit):
    jst.SparseMatrix.from_edge_index(np.array([[0], [1]]), num_nodes=2**32)
  # At the limit the indices' checks apply as usual.
  with pytest.raises(ValueError, match="out of range"):
    jst.SparseMatrix.from_coo(np.array([5]), np.array([0]), shape=(3, 1))


def test_values_that_cannot_be_represented_are_refused():
  r, c = np.array([0, 1, 1]), np.array([1, 0, 0])
  with pytest.raises(ValueError, match="complex"):
    jst.SparseMatrix.from_coo(r, c, np.array([1 + 2j, 1, 1]))
  with pytest.raises(ValueError, match="dtype"):
    jst.SparseMatrix.from_coo(r, c, np.array(["a", "b", "c"]))
  with pytest.raises(ValueError, match="65504"):  # float16 duplicates summing past the range
    jst.SparseMatrix.from_coo(r, c, np.array([1, 4e4, 4e4], np.float16))
  with pytest.raises(ValueError, match="float32's range"):
    jst.SparseMatrix.from_coo(r, c, np.array([1.0, 1e300, 1.0]))
  ok = jst.SparseMatrix.from_coo(r, c, np.array([1, 3e4, 3e4], np.float16))
  assert ok.dtype == jnp.float16 and float(jnp.max(ok.values)) == 6e4


def test_astype_refuses_values_past_the_target_range(rng):
  A = jst.SparseMatrix.from_coo(np.array([0, 1]), np.array([1, 0]), np.array([1e5, 2.0]))
  with pytest.raises(ValueError, match="float16"):
    A.astype(jnp.float16)
  assert A.astype(jnp.bfloat16).dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="float type"):
    A.astype(jnp.int32)
  # Traced values cast as jnp.astype does.
  out = jax.jit(lambda v: A.with_values(v).astype(jnp.float16).values)(A.values / 1e3)
  assert out.dtype == jnp.float16


def test_ahead_of_time_lowering_takes_a_matrix(rng):
  A = _matrix(rng)
  x = jnp.ones((A.shape[1], 3), jnp.float32)
  compiled = jax.jit(lambda A, x: A @ x).lower(A, x).compile()
  np.testing.assert_allclose(compiled(A, x), _reference(A, x), rtol=1e-5, atol=1e-5)


def test_cotangents_with_respect_to_a_matrix(rng):
  """(Co)tangent trees of a matrix hold float0 for its integer leaves: they are no matrix to
  check, and differentiating with respect to a matrix argument works."""
  A = _matrix(rng)
  x = jnp.asarray(rng.normal(size=(A.shape[1], 3)), jnp.float32)
  y, vjp = jax.vjp(lambda A: A @ x, A)
  (ct,) = vjp(jnp.ones_like(y))
  assert ct.pattern.rows.dtype == jax.dtypes.float0
  want = np.ones((A.shape[0], 3)) @ np.asarray(x, np.float64).T  # d sum(A @ x) / dA, dense
  got = np.asarray(ct.values, np.float64)
  want = want[np.asarray(A.rows), np.asarray(A.cols)]
  # a float32 sum of 3 products: an entry near cancellation is off by float32 rounding of the
  # terms, so the tolerance is relative to the largest entry, not to each one
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
  g = jax.grad(lambda A: jnp.sum(A @ x), allow_int=True)(A)
  np.testing.assert_allclose(np.asarray(g.values), got, rtol=1e-6)


def test_stacked_matrices_scan_and_are_checked_when_used(rng):
  """Matrices of one pattern shape stack along a leading axis (lax.scan over them works); a
  stacked matrix used directly is refused by the operator's structure check."""
  r, c = rng.integers(0, 30, 200), rng.integers(0, 30, 200)
  mats = [jst.SparseMatrix.from_coo(r, c, rng.normal(size=200), shape=(30, 30)) for _ in "ab"]
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *mats)
  x = jnp.asarray(rng.normal(size=(30, 2)), jnp.float32)
  _, ys = jax.lax.scan(lambda carry, A: (carry, A @ x), 0, stacked)
  for M, y in zip(mats, ys):
    np.testing.assert_allclose(y, _reference(M, x), rtol=1e-5, atol=1e-5)
  with pytest.raises(PatternError, match="shape"):
    stacked @ x
