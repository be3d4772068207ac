"""The CUDA lowering, checked without a GPU (cross-platform lowering): the handlers' workspace is
an XLA-planned result of the size their launch plan needs, and KernelOptions become FFI
attributes (part of jit's cache key); bad options fail before tracing. Skipped where the CUDA
extension was not built."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import jaxsparse_tc as jst
from jaxsparse_tc._src import pattern as pattern_lib
from jaxsparse_tc._src.extensions import cuda_built

pytestmark = pytest.mark.skipif(not cuda_built(), reason="CUDA extension not built")


def _results(fn, *args) -> list[tuple[str, tuple[int, ...]]]:
  """(element type, shape) of each result of the one custom call fn lowers to on CUDA."""
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
  assert len(calls) == 1, calls
  out = calls[0].rsplit("->", 1)[1]
  types = re.findall(r"tensor<([^>]*)>", out)
  parsed = []
  for t in types:
    *dims, dt = t.split("x")
    parsed.append((dt, tuple(int(x) for x in dims)))
  return parsed


def _long_row_graph(m=300, n=4000, long_row=7, seed=0):
  rng = np.random.default_rng(seed)
  g = sp.random(m, n, density=0.002, format="lil", random_state=seed, dtype=np.float32)
  g[long_row, :] = rng.uniform(0.5, 1.5, (1, n)).astype(np.float32)  # one row of n entries
  return sp.csr_matrix(g)


@pytest.mark.parametrize("dtype,d", [(jnp.float16, 64), (jnp.float32, 40)])
def test_spmm_row_workspace_is_a_result_of_the_planned_size(dtype, d):
  g = _long_row_graph()
  A = jst.SparseMatrix.from_scipy(g)
  A = A.with_values(A.values.astype(dtype))
  x = jnp.ones((g.shape[1], d), dtype)
  res = _results(jst.spmm, A, x)
  assert res[0][1] == (1, g.shape[0], d)
  assert res[1][0] == "ui8" and len(res) == 2
  # The row kernels' workspace: per extra CTA item of the long row, d fp32 sums and one
  # countdown per lane slab (lanes * 16 bytes of features).
  piece = pattern_lib.row_piece(g.nnz)
  cap = pattern_lib.row_cta_entries(piece)
  slots = -(-g.shape[1] // cap) - 1
  assert slots > 0
  itemsize = jnp.dtype(dtype).itemsize
  lanes = 2
  while lanes < 32 and lanes * (16 // itemsize) < d:
    lanes *= 2
  nslab = -(-d // (lanes * (16 // itemsize)))
  assert res[1][1] == (slots * d * 4 + slots * nslab * 4,)


def test_spmm_without_split_rows_has_a_token_workspace(cora):
  A = jst.SparseMatrix.from_scipy(cora)  # Cora: no row needs several CTA items
  x = jnp.ones((cora.shape[1], 16), jnp.float32)
  assert _results(jst.spmm, A, x)[1] == ("ui8", (1,))


def test_spmm_heads_scale_the_workspace():
  g = _long_row_graph()
  A = jst.SparseMatrix.from_scipy(g)
  x1 = jnp.ones((g.shape[1], 32), jnp.float32)
  x3 = jnp.ones((3, g.shape[1], 32), jnp.float32)
  one = _results(jst.spmm, A, x1)[1][1][0]
  three = _results(jst.spmm, A, x3)[1][1][0]
  assert three == 3 * one


def test_attention_forward_workspace_is_a_result():
  g = _long_row_graph(m=64, n=64 * 40)
  A = jst.SparseMatrix.from_scipy(g)
  q = jnp.ones((2, g.shape[0], 64), jnp.float16)
  k = jnp.ones((2, g.shape[1], 64), jnp.float16)
  res = _results(lambda A, q, k: jst.sparse_attention(A, q, k, k), A, q, k)
  assert [r[0] for r in res] == ["f16", "f32", "ui8"]
  # Split windows' slots: 8 rows x (dv + 2) fp32 and a counter, per head.
  assert res[2][1][0] > 1 and (res[2][1][0] % (2 * (8 * 66 * 4 + 4))) == 0


def _custom_call_attrs(fn, *args) -> str:
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
  assert len(calls) == 1, calls
  return calls[0]


@pytest.mark.parametrize("choice,code", [("auto", 0), ("rows", 1), ("windows", 2)])
def test_kernel_options_become_ffi_attributes(choice, code):
  g = _long_row_graph()
  A = jst.SparseMatrix.from_scipy(g).astype(jnp.float16)  # float16 values: the float16 kernels
  x = jnp.ones((g.shape[1], 16), jnp.float16)
  opts = jst.KernelOptions(spmm=choice, sddmm=choice)
  call = _custom_call_attrs(lambda A, x: jst.spmm(A, x, options=opts), A, x)
  assert re.search(rf"kernel = {code} : i32", call), call
  y = jnp.ones((g.shape[0], 16), jnp.float16)
  call = _custom_call_attrs(lambda A, y, x: jst.sddmm(A, y, x, options=opts).values, A, y, x)
  assert re.search(rf"kernel = {code} : i32", call), call


def test_kernel_options_choose_the_workspace():
  """The long row needs a row-kernel workspace; forcing the window kernels sizes theirs."""
  g = _long_row_graph()
  A = jst.SparseMatrix.from_scipy(g).astype(jnp.float16)  # float16 values: the float16 kernels
  x = jnp.ones((g.shape[1], 64), jnp.float16)
  sizes = {
    c: _results(lambda A, x: jst.spmm(A, x, options=jst.KernelOptions(spmm=c)), A, x)[1]
    for c in ("auto", "rows", "windows")
  }
  assert sizes["auto"] == sizes["rows"] != sizes["windows"]


def test_kernel_options_are_part_of_the_cache_key():
  g = _long_row_graph()
  A = jst.SparseMatrix.from_scipy(g)
  x = jnp.ones((g.shape[1], 16), jnp.float32)
  traces = []

  def f(x, options):
    traces.append(options)
    return jst.spmm(A, x, options=options)

  jf = jax.jit(f, static_argnames="options")
  for opts in (jst.KernelOptions(), jst.KernelOptions(), jst.KernelOptions(spmm="rows")):
    jf.trace(x, options=opts).lower(lowering_platforms=("cuda",))
  assert len(traces) == 2  # equal options share a trace; different ones do not


def test_bad_options_fail_before_tracing():
  with pytest.raises(ValueError, match="KernelOptions.spmm"):
    jst.KernelOptions(spmm="fastest")
  with pytest.raises(ValueError, match="attention_backward"):
    jst.KernelOptions(attention_backward="tc")
  g = _long_row_graph()
  A = jst.SparseMatrix.from_scipy(g)
  with pytest.raises(TypeError, match="KernelOptions"):
    jst.spmm(A, jnp.ones((g.shape[1], 8)), options={"spmm": "rows"})


@pytest.mark.parametrize("choice", ["auto", "fused", "composed"])
def test_attention_backward_option_picks_the_backward(choice):
  """d = 128 on a graph of >= 64k nonzeros: "auto" keeps the composed backward there (measured
  faster), "fused" forces the tensor-core kernels, "composed" the per-edge pass and SpMMs."""
  from jaxsparse_tc._src.primitives import attention_grads_p

  rng = np.random.default_rng(0)
  n = 4096
  A = jst.SparseMatrix.from_coo(
    rng.integers(0, n, 70_000), rng.integers(0, n, 70_000), shape=(n, n)
  )
  q = jnp.ones((1, n, 128), jnp.float16)
  opts = jst.KernelOptions(attention_backward=choice)
  jaxpr = jax.make_jaxpr(
    jax.grad(lambda q: jnp.sum(jst.sparse_attention(A, q, q, q, options=opts).astype(jnp.float32)))
  )(q)
  text = str(jaxpr)
  assert (attention_grads_p.name in text) == (choice == "fused")


@pytest.mark.parametrize("dtype,d,kernel", [(jnp.float16, 96, True), (jnp.float16, 384, False)])
def test_composed_backward_edge_pass_follows_the_plan(dtype, d, kernel):
  """The composed backward's per-edge pass is attention_bwd_p (one CUDA kernel) for rows of up to
  512 bytes and two SDDMMs past that: plan_attention_backward's answer, which Python asks."""
  from jaxsparse_tc._src.primitives import attention_bwd_p, attention_grads_p

  rng = np.random.default_rng(0)
  n = 256
  A = jst.SparseMatrix.from_coo(rng.integers(0, n, 2000), rng.integers(0, n, 2000), shape=(n, n))
  q = jnp.ones((1, n, d), dtype)
  jaxpr = jax.make_jaxpr(
    jax.grad(lambda q: jnp.sum(jst.sparse_attention(A, q, q, q).astype(jnp.float32)))
  )(q)
  text = str(jaxpr)
  assert attention_grads_p.name not in text
  assert (attention_bwd_p.name in text) == kernel


def test_spmm_max_lowers_to_its_cuda_handler():
  """spmm(A, X, reduce="max") on CUDA is one custom call, the max/min SpMM's target (no XLA
  segment reduction, no scatter)."""
  g = _long_row_graph()
  A = jst.SparseMatrix.from_scipy(g)
  x = jnp.ones((g.shape[1], 8), jnp.float32)
  fn = lambda A, x: jst.spmm(A, x, reduce="max")
  text = jax.jit(fn).trace(A, x).lower(lowering_platforms=("cuda",)).as_text()
  assert jst._src.extensions.target("spmm_extremum") in text
  assert text.count("stablehlo.custom_call") == 1 and "stablehlo.scatter" not in text
