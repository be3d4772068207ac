"""The max/min SpMM, `spmm(A, X, reduce="max" | "min")`: out[h, i, k] is the largest (smallest)
product A_h[i, j] X_h[j, k] over row i's entries, 0 in a row without entries, NaN where a
product is NaN (as jnp.max). The max aggregation of GraphSAGE / PyG's `aggr="max"` is this
product with A's values set to 1.

Primitive `spmm_extremum_p`: (values [Hv, nnz], x [Hx, n, d], *pattern) -> (out [H, m, d], arg
int32 [H, m, d]), arg the format position of the entry each output came from (the first in
format order on a tie; -1 in a row without entries). The derivative of a max is its winning
entry's: the JVP gathers through arg, and JAX transposes those gathers (no transpose rule). The
CPU kernel is csrc/cpu/kernels/spmm_extremum.inc; on GPUs the composed rule below runs (XLA's
segment reductions) until the op table lists a CUDA handler.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from jaxsparse_tc._src import heads, rules
from jaxsparse_tc._src.lowering import register_ffi_lowering
from jaxsparse_tc._src.pattern import PatternOperands
from jaxsparse_tc._src.primitives import spmm_extremum_p

REDUCTIONS = ("sum", "max", "min")


def spmm_extremum(values, x, pattern, *, shape, reduce: str):
  """(out, positions) of spmm_extremum_p for checked operands: values [Hv, nnz], x [Hx, n, d]
  of one dtype; positions int32 [H, m, d], the winning entry's format position (-1: an empty
  row)."""
  return spmm_extremum_p.bind(values, x, *pattern, shape=shape, is_min=reduce == "min")


def _entry_cols(P: PatternOperands):
  """A's column of each value, in A's format order."""
  return P.rows_t[P.perm_t_inv]


def _take_values(v, e):
  """v[h, e[h, i, k]] for values v [Hv, nnz] (Hv 1 broadcasts) and positions e [H, m, d]."""
  if v.shape[0] == 1:
    return v[0][e]
  return jnp.take_along_axis(v, e.reshape(e.shape[0], -1), axis=1).reshape(e.shape)


def _take_rows(x, cols):
  """x[h, cols[h, i, k], k] for x [Hx, n, d] (Hx 1 broadcasts) and columns cols [H, m, d]."""
  if x.shape[0] == 1:
    return jax.vmap(lambda c: jnp.take_along_axis(x[0], c, axis=0))(cols)
  return jnp.take_along_axis(x, cols, axis=1)


def _abstract_eval(values, x, *pattern, shape, is_min):
  del pattern, is_min
  h = heads.num_heads(values.shape[0], x.shape[0])
  out = x.update(shape=(h, shape[0], x.shape[2]), dtype=x.dtype)
  return out, out.update(dtype=np.dtype(np.int32), weak_type=False)


def _jvp(primals, tangents, *, shape, is_min):
  values, x, *pattern = primals
  dvalues, dx = tangents[:2]
  out, arg = spmm_extremum_p.bind(*primals, shape=shape, is_min=is_min)
  if type(dvalues) is ad.Zero and type(dx) is ad.Zero:
    return (out, arg), (rules.zero_tangent(out), rules.zero_tangent(arg))
  hit = arg >= 0
  e = jnp.where(hit, arg, 0)
  cols = _entry_cols(PatternOperands.unflat(pattern))[e]
  dout = jnp.zeros(out.shape, out.dtype)
  if type(dvalues) is not ad.Zero:
    dout = dout + _take_values(dvalues, e) * _take_rows(x, cols)
  if type(dx) is not ad.Zero:
    dout = dout + _take_values(values, e) * _take_rows(dx, cols)
  return (out, arg), (jnp.where(hit, dout, 0).astype(out.dtype), rules.zero_tangent(arg))


def _batch(args, dims, **params):
  values, x, *pattern = args
  rules.check_pattern_unbatched(dims, 2)
  size = rules.batch_size(args, dims)
  (values, x), h = heads.merge_batch_into_heads([values, x], dims[:2], size)
  out, arg = spmm_extremum_p.bind(values, x, *pattern, **params)
  unmerge = lambda a: a.reshape((size, h) + a.shape[1:])
  return (unmerge(out), unmerge(arg)), (0, 0)


def _composed(values, x, *pattern, shape, is_min):
  """The operator in XLA ops: per-entry products (float32 for 16-bit operands, as the kernel),
  their segment max per row, and the first entry that reaches it."""
  P = PatternOperands.unflat(pattern)
  rows, cols = P.rows_a, _entry_cols(P)
  m, nnz = shape[0], values.shape[1]
  acc = jnp.promote_types(x.dtype, jnp.float32)
  sign = -1 if is_min else 1
  prod = sign * values.astype(acc)[:, :, None] * x.astype(acc)[:, cols, :]  # [H, nnz, d]
  per_head = lambda f, a: jax.vmap(lambda a: f(a, rows, num_segments=m))(a)
  best = per_head(jax.ops.segment_max, prod)
  at = best[:, rows, :]
  hit = (prod == at) | (jnp.isnan(prod) & jnp.isnan(at))
  first = per_head(jax.ops.segment_min, jnp.where(hit, jnp.arange(nnz)[None, :, None], nnz))
  arg = jnp.where(first < nnz, first, -1).astype(jnp.int32)
  return jnp.where(arg >= 0, sign * best, 0).astype(x.dtype), arg


spmm_extremum_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[spmm_extremum_p] = _jvp
batching.primitive_batchers[spmm_extremum_p] = _batch
register_ffi_lowering(
  spmm_extremum_p,
  "spmm_extremum",
  2,
  cpu_pattern=lambda P: P.a,
  attrs={"is_min": lambda p: np.int32(p["is_min"])},
  composed_rule=mlir.lower_fun(_composed, multiple_results=True),
  features=(1,),  # X's columns split across devices with the result's (both results')
)
