"""spmm and sddmm on the CPU kernels: values, dtypes, heads, jit, grad, jvp, vmap, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_coo, rel_err
from jax.test_util import check_grads

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix

# The CPU kernels: GPU kernels are checked against them in tests/test_gpu_*.py.
pytestmark = pytest.mark.usefixtures("on_cpu")

TOL = {jnp.float32: 1e-5, jnp.float16: 1e-2, jnp.bfloat16: 1e-2}
CASES = [(1, 1, 1), (7, 13, 3), (17, 9, 16), (40, 33, 17), (64, 100, 8), (9, 131, 33)]


def make(rng, m, n, density=0.3, heads=None):
  rows, cols, _ = random_coo(rng, m, n, density)
  if rows.size == 0:  # keep at least one nonzero in the small cases
    rows, cols = np.array([m - 1]), np.array([0])
  vals = rng.standard_normal(rows.size if heads is None else (heads, rows.size))
  return SparseMatrix.from_coo(rows, cols, vals.astype(np.float32), shape=(m, n))


def dense64(A):
  return np.asarray(A.todense(), np.float64)


@pytest.mark.parametrize("m,n,d", CASES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_spmm_matches_float64(rng, m, n, d, dtype):
  A = make(rng, m, n).astype(dtype)  # both operands in the dtype: its kernels run
  x = jnp.asarray(rng.standard_normal((n, d)), dtype)
  out = jst.spmm(A, x)
  assert out.shape == (m, d) and out.dtype == dtype
  ref = dense64(A) @ np.asarray(x, np.float64)
  assert rel_err(out, ref) < TOL[dtype]
  np.testing.assert_allclose(np.asarray(A @ x, np.float64), np.asarray(out, np.float64))


@pytest.mark.parametrize("m,n,d", CASES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_sddmm_matches_float64(rng, m, n, d, dtype):
  A = make(rng, m, n)
  x = jnp.asarray(rng.standard_normal((m, d)), dtype)
  y = jnp.asarray(rng.standard_normal((n, d)), dtype)
  S = jst.sddmm(A, x, y)
  assert isinstance(S, SparseMatrix) and S.values.dtype == dtype and S.shape == A.shape
  full = np.asarray(x, np.float64) @ np.asarray(y, np.float64).T
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  assert rel_err(S.values, full[r, c]) < TOL[dtype]
  # Scaled by float32 values: computed and returned in the promoted dtype (float32).
  scaled = jst.sddmm(A, x, y, scale_by_values=True)
  assert scaled.values.dtype == jnp.float32
  assert rel_err(scaled.values, full[r, c] * np.asarray(A.values, np.float64)) < 1e-5
  A16 = A.astype(dtype)  # values in X's dtype: a result in it
  scaled = jst.sddmm(A16, x, y, scale_by_values=True)
  assert scaled.values.dtype == dtype
  assert rel_err(scaled.values, full[r, c] * np.asarray(A16.values, np.float64)) < TOL[dtype]


def test_real_graph(rng, cora):
  A = SparseMatrix.from_scipy(cora)
  A = A.with_values(jnp.asarray(rng.uniform(0.5, 1.5, A.nnz), jnp.float32))
  x = rng.standard_normal((cora.shape[0], 32)).astype(np.float32)
  ref = A.to_scipy().astype(np.float64) @ x.astype(np.float64)
  assert rel_err(jst.spmm(A, x), ref) < 1e-5
  S = jst.sddmm(A, x, x, scale_by_values=True)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  ref = np.einsum("ed,ed->e", x[r].astype(np.float64), x[c]) * np.asarray(A.values)
  assert rel_err(S.values, ref) < 1e-5


def test_heads_native(rng):
  A = make(rng, 20, 12, heads=3)
  x = rng.standard_normal((3, 12, 5)).astype(np.float32)
  out = jst.spmm(A, x)
  assert out.shape == (3, 20, 5)
  for h in range(3):
    assert rel_err(out[h], dense64(A)[h] @ x[h]) < 1e-5
  # one value set, several dense heads; several value sets, one dense operand
  out = jst.spmm(A.with_values(A.values[0]), x)
  assert rel_err(out, np.einsum("mn,hnd->hmd", dense64(A)[0], x)) < 1e-5
  out = jst.spmm(A, x[0])
  assert rel_err(out, np.einsum("hmn,nd->hmd", dense64(A), x[0])) < 1e-5
  xq = rng.standard_normal((3, 20, 5)).astype(np.float32)
  S = jst.sddmm(A, xq, x)
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  assert rel_err(S.values, np.einsum("hed,hed->he", xq[:, r], x[:, c])) < 1e-5


def test_empty_matrix_and_empty_rows(rng):
  Z = SparseMatrix.from_coo([], [], shape=(10, 6))
  x = rng.standard_normal((6, 4)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jst.spmm(Z, x)), np.zeros((10, 4)))
  assert jst.sddmm(Z, rng.standard_normal((10, 4)).astype(np.float32), x).values.shape == (0,)
  A = SparseMatrix.from_coo([3], [2], [2.0], shape=(30, 6))
  out = np.asarray(jst.spmm(A, x))
  np.testing.assert_allclose(out[3], 2 * x[2], rtol=1e-6)
  assert np.count_nonzero(np.delete(out, 3, axis=0)) == 0


def test_nan_propagates(rng):
  A = make(rng, 16, 16, density=0.5)
  x = rng.standard_normal((16, 4)).astype(np.float32)
  col = int(np.asarray(A.cols)[0])
  row = int(np.asarray(A.rows)[0])
  x[col, 1] = np.nan
  out = np.asarray(jst.spmm(A, x))
  assert np.isnan(out[row, 1])
  S = jst.sddmm(A, rng.standard_normal((16, 4)).astype(np.float32), x)
  assert np.isnan(np.asarray(S.values)[0])
  hit = np.asarray(A.cols) == col
  assert np.all(np.isnan(np.asarray(S.values)[hit])) and not np.any(
    np.isnan(np.asarray(S.values)[~hit])
  )


def test_jit_equals_eager(rng):
  A = make(rng, 33, 21)
  x = rng.standard_normal((21, 7)).astype(np.float32)
  y = rng.standard_normal((33, 7)).astype(np.float32)
  f = lambda v, x, y: (jst.spmm(A.with_values(v), x), jst.sddmm(A, y, x).values)
  eager = f(A.values, x, y)
  jitted = jax.jit(f)(A.values, x, y)
  for a, b in zip(eager, jitted):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  # the matrix itself can be a jit argument
  out = jax.jit(lambda A, x: A @ x)(A, x)
  np.testing.assert_allclose(np.asarray(out), np.asarray(eager[0]), rtol=1e-6, atol=1e-6)


# -- differentiation (float64 on the CPU kernels, so finite differences are exact enough) -----
def test_spmm_check_grads(rng, x64):
  A = make(rng, 19, 13)
  A = A.with_values(A.values.astype(jnp.float64))
  x = rng.standard_normal((13, 5))
  f = lambda v, x: jst.spmm(A.with_values(v), x)
  check_grads(f, (A.values, x), order=2, modes=["fwd", "rev"])
  Ah = make(rng, 19, 13, heads=2)
  Ah = Ah.with_values(Ah.values.astype(jnp.float64))
  xh = rng.standard_normal((2, 13, 5))
  check_grads(
    lambda v, x: jst.spmm(Ah.with_values(v), x), (Ah.values, xh), order=1, modes=["fwd", "rev"]
  )
  # broadcast heads: cotangents are summed back over the heads
  check_grads(
    lambda v, x: jst.spmm(Ah.with_values(v), x), (Ah.values, x), order=1, modes=["fwd", "rev"]
  )


def test_sddmm_check_grads(rng, x64):
  A = make(rng, 14, 11)
  A = A.with_values(A.values.astype(jnp.float64))
  x = rng.standard_normal((14, 6))
  y = rng.standard_normal((11, 6))
  f = lambda x, y: jst.sddmm(A, x, y).values
  check_grads(f, (x, y), order=2, modes=["fwd", "rev"])
  g = lambda v, x, y: jst.sddmm(A.with_values(v), x, y, scale_by_values=True).values
  check_grads(g, (A.values, x, y), order=1, modes=["fwd", "rev"])
  xh = rng.standard_normal((3, 14, 6))
  check_grads(lambda x, y: jst.sddmm(A, x, y).values, (xh, y), order=1, modes=["fwd", "rev"])


def test_check_grads_float32(rng):
  """The float32 path too, first order (finite differences in float32 are coarse)."""
  A = make(rng, 12, 10)
  x = rng.standard_normal((10, 4)).astype(np.float32)
  y = rng.standard_normal((12, 4)).astype(np.float32)
  check_grads(
    lambda v, x: jst.spmm(A.with_values(v), x),
    (A.values, x),
    order=1,
    modes=["fwd", "rev"],
    atol=2e-2,
    rtol=2e-2,
  )
  check_grads(
    lambda y, x: jst.sddmm(A, y, x).values,
    (y, x),
    order=1,
    modes=["fwd", "rev"],
    atol=2e-2,
    rtol=2e-2,
  )


def test_grad_matches_dense_formula(rng):
  A = make(rng, 25, 18)
  x = rng.standard_normal((18, 4)).astype(np.float32)
  ct = rng.standard_normal((25, 4)).astype(np.float32)
  loss = lambda v, x: jnp.sum(jst.spmm(A.with_values(v), x) * ct)
  dv, dx = jax.jit(jax.grad(loss, argnums=(0, 1)))(A.values, x)
  a = dense64(A)
  assert rel_err(dx, a.T @ ct) < 1e-5
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  assert rel_err(dv, (ct.astype(np.float64) @ x.T)[r, c]) < 1e-5
  _, tangent = jax.jvp(lambda x: jst.spmm(A, x), (x,), (ct[:18],))
  assert rel_err(tangent, a @ ct[:18]) < 1e-5


# -- vmap --------------------------------------------------------------------------------------
def test_vmap_equals_loop(rng):
  A = make(rng, 22, 15)
  xs = rng.standard_normal((4, 15, 6)).astype(np.float32)
  vs = rng.standard_normal((4, A.nnz)).astype(np.float32)
  ys = rng.standard_normal((4, 22, 6)).astype(np.float32)
  spmm_x = lambda x: jst.spmm(A, x)
  spmm_v = lambda v: jst.spmm(A.with_values(v), xs[0])
  spmm_vx = lambda v, x: jst.spmm(A.with_values(v), x)
  sddmm_xy = lambda y, x: jst.sddmm(A, y, x).values
  cases = [
    (jax.vmap(spmm_x)(xs), [spmm_x(x) for x in xs]),
    (jax.vmap(spmm_v)(vs), [spmm_v(v) for v in vs]),
    (jax.vmap(spmm_vx)(vs, xs), [spmm_vx(v, x) for v, x in zip(vs, xs)]),
    (jax.vmap(sddmm_xy)(ys, xs), [sddmm_xy(y, x) for y, x in zip(ys, xs)]),
    (jax.vmap(sddmm_xy, in_axes=(None, 0))(ys[0], xs), [sddmm_xy(ys[0], x) for x in xs]),
    (
      jax.vmap(spmm_x, in_axes=2, out_axes=2)(np.moveaxis(xs, 0, 2)),
      np.moveaxis(np.stack([spmm_x(x) for x in xs]), 0, 2),
    ),
    (
      jax.jit(jax.vmap(jax.vmap(spmm_vx, in_axes=(0, None)), in_axes=(None, 0)))(vs[:2], xs),
      [[spmm_vx(v, x) for v in vs[:2]] for x in xs],
    ),
  ]
  for batched, loop in cases:
    np.testing.assert_allclose(
      np.asarray(batched), np.stack(loop) if isinstance(loop, list) else loop, rtol=1e-5, atol=1e-5
    )
  # grad of a vmapped loss equals the sum of per-example grads
  g = jax.grad(lambda xs: jnp.sum(jax.vmap(spmm_x)(xs) ** 2))(xs)
  g_loop = np.stack([jax.grad(lambda x: jnp.sum(spmm_x(x) ** 2))(x) for x in xs])
  np.testing.assert_allclose(np.asarray(g), g_loop, rtol=1e-5, atol=1e-5)


def test_vmap_is_one_primitive_call(rng):
  A = make(rng, 10, 10)
  jaxpr = jax.make_jaxpr(jax.vmap(lambda v: jst.spmm(A.with_values(v), jnp.ones((10, 3)))))(
    jnp.ones((5, A.nnz))
  )
  assert str(jaxpr).count("jaxsparse_tc_spmm") == 1


def test_vmap_over_pattern_is_refused(rng):
  A = make(rng, 10, 10)
  x = jnp.ones((10, 3))
  batched = jax.tree.map(lambda a: jnp.stack([a, a]), A)
  with pytest.raises(NotImplementedError, match="pattern"):
    jax.vmap(lambda A: A @ x)(batched)


# -- precision ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
  "precision",
  [
    None,
    "default",
    "highest",
    jax.lax.Precision.HIGHEST,
    jax.lax.Precision.DEFAULT,
    "float32",
    "tensorfloat32",
  ],
)
def test_precision_values_accepted(rng, precision):
  A = make(rng, 9, 9)
  x = rng.standard_normal((9, 3)).astype(np.float32)
  assert rel_err(jst.spmm(A, x, precision=precision), dense64(A) @ x) < 1e-5
  jst.sddmm(A, x, x, precision=precision)


def _traced_precisions(fn, *args):
  eqns = jax.make_jaxpr(fn)(*args).eqns
  return [e.params["precision"] for e in eqns if "precision" in e.params]


def test_precision_none_follows_jax_default_matmul_precision(rng):
  """precision=None reads jax.default_matmul_precision at trace time, as jnp.matmul does; an
  explicit argument wins over it."""
  from jaxsparse_tc._src import precision as precision_lib

  A = make(rng, 9, 9)
  x = rng.standard_normal((9, 3)).astype(np.float32)
  ops = [lambda x: jst.spmm(A, x), lambda x: jst.sddmm(A, x, x)]
  for op in ops:
    assert _traced_precisions(op, x) == [precision_lib.DEFAULT]
    with jax.default_matmul_precision("highest"):
      assert _traced_precisions(op, x) == [precision_lib.HIGHEST]
      got = jst.spmm(A, x)
    with jax.default_matmul_precision("tensorfloat32"):
      assert _traced_precisions(op, x) == [precision_lib.DEFAULT]
  with jax.default_matmul_precision("highest"):
    assert _traced_precisions(lambda x: jst.spmm(A, x, precision="default"), x) == [
      precision_lib.DEFAULT
    ]
  assert rel_err(got, dense64(A) @ x) < 1e-5


def test_bad_precision_raises(rng):
  A = make(rng, 9, 9)
  with pytest.raises(ValueError, match="precision"):
    jst.spmm(A, np.ones((9, 3), np.float32), precision="ultra")


# -- trace-time errors -----------------------------------------------------------------------------
def test_shape_and_dtype_errors_at_trace_time(rng):
  A = make(rng, 12, 7)
  good_x = jax.ShapeDtypeStruct((7, 4), jnp.float32)

  def trace(f, *args):
    return jax.eval_shape(f, *args)

  trace(lambda x: jst.spmm(A, x), good_x)  # fine
  with pytest.raises(ValueError, match=r"\(12, 7\).*\(8, 4\)"):
    trace(lambda x: jst.spmm(A, x), jax.ShapeDtypeStruct((8, 4), jnp.float32))
  with pytest.raises(TypeError, match=r"int32"):
    trace(lambda x: jst.spmm(A, x), jax.ShapeDtypeStruct((7, 4), jnp.int32))
  with pytest.raises(ValueError, match=r"\(7,\)"):
    trace(lambda x: jst.spmm(A, x), jax.ShapeDtypeStruct((7,), jnp.float32))
  with pytest.raises(ValueError, match=r"\(12, 4\).*\(7, 5\)"):
    trace(
      lambda x, y: jst.sddmm(A, x, y),
      jax.ShapeDtypeStruct((12, 4), jnp.float32),
      jax.ShapeDtypeStruct((7, 5), jnp.float32),
    )
  with pytest.raises(TypeError, match=r"float16.*float32|float32.*float16"):
    trace(
      lambda x, y: jst.sddmm(A, x, y),
      jax.ShapeDtypeStruct((12, 4), jnp.float16),
      jax.ShapeDtypeStruct((7, 4), jnp.float32),
    )
  with pytest.raises(ValueError, match=r"\(12, 4\)"):
    trace(
      lambda x, y: jst.sddmm(A, x, y),
      jax.ShapeDtypeStruct((12, 4), jnp.float32),
      jax.ShapeDtypeStruct((12, 4), jnp.float32),
    )
  Ah = make(rng, 12, 7, heads=3)
  with pytest.raises(ValueError, match="head"):
    trace(lambda x: jst.spmm(Ah, x), jax.ShapeDtypeStruct((2, 7, 4), jnp.float32))
  with pytest.raises(ValueError, match=r"shape"):
    A.with_values(jnp.ones(3))


def test_float64_on_cpu_with_x64(rng, x64):
  rows, cols, vals = random_coo(rng, 23, 17, 0.3)
  A = SparseMatrix.from_coo(rows, cols, vals.astype(np.float64), shape=(23, 17))
  assert A.values.dtype == jnp.float64
  x = rng.standard_normal((17, 4))
  y = rng.standard_normal((23, 4))
  assert jst.spmm(A, x).dtype == jnp.float64
  assert rel_err(jst.spmm(A, x), dense64(A) @ x) < 1e-12
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  assert rel_err(jst.sddmm(A, y, x).values, (y @ x.T)[r, c]) < 1e-12


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_sddmm_float32_out(rng, dtype):
  """preferred_element_type=float32 (the attention backward's logits): 16-bit operands, the
  float32 accumulator out unrounded (products of 16-bit numbers are exact in float32, so only
  the summation order differs); gradients come back in the operands' dtype."""
  A = make(rng, 45, 37)
  x = jnp.asarray(rng.standard_normal((2, 45, 40)) * 30, dtype)  # large logits
  y = jnp.asarray(rng.standard_normal((2, 37, 40)) * 30, dtype)
  f = jax.jit(lambda x, y, A: jst.sddmm(A, x, y, preferred_element_type=jnp.float32).values)
  out = f(x, y, A)
  assert out.dtype == jnp.float32 and out.shape == (2, A.nnz)
  full = np.einsum("hmd,hnd->hmn", np.asarray(x, np.float64), np.asarray(y, np.float64))
  r, c = np.asarray(A.rows), np.asarray(A.cols)
  assert rel_err(out, full[:, r, c]) < 1e-6
  rounded = jst.sddmm(A, x[0], y[0]).values  # the default rounds to the operands' dtype
  assert rounded.dtype == dtype and rel_err(out[0], np.asarray(rounded, np.float64)) > 1e-6
  with pytest.raises(TypeError, match="preferred_element_type"):
    jst.sddmm(
      A, x, y, preferred_element_type=jnp.float16 if dtype == jnp.bfloat16 else jnp.bfloat16
    )
  with pytest.raises(ValueError, match="preferred_element_type"):  # float32 X: no wider type
    jst.sddmm(A, x.astype(jnp.float32), y.astype(jnp.float32), preferred_element_type=jnp.float64)
  w = jnp.asarray(rng.standard_normal((2, A.nnz)), jnp.float32)
  gx = jax.grad(lambda x: jnp.sum(f(x, y, A) * w))(x)
  assert gx.dtype == dtype
  ref = np.zeros(x.shape)  # d/dx of sum_e w_e <x[r_e], y[c_e]>: rows gather w_e y[c_e]
  np.add.at(
    ref, (slice(None), r), np.asarray(w, np.float64)[..., None] * np.asarray(y, np.float64)[:, c]
  )
  assert rel_err(gx, ref) < 1e-2
