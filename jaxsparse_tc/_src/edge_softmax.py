"""edge_softmax_p: row-wise softmax over a SparseMatrix's nonzeros.

`Y[h, e] = exp(X[h, e] - max_row) / sum_row exp(X - max_row)` over the nonzeros e of each row
(float32 math, output in the input dtype). Rows without nonzeros have no values at all.

Rows, as attention.py's (forward and every derivative):
1. a nan or +inf value: every value of the row is nan (as jax.nn.softmax);
2. every value -inf (fully masked): the row's values are 0, and so are their gradients
   (Y = 0 makes the JVP map below 0);
3. otherwise the max-subtracted softmax; a -inf value gets weight exactly 0 and no gradient.

Differentiation. The JVP is `dY = Y * (dX - rowsum(Y * dX))`, computed by a second primitive
`edge_softmax_bwd_p(Y, t) = Y * (t - rowsum(Y * t))`. That map is linear in `t` and
self-adjoint (per row it is `diag(Y) - Y Y^T`), so its transpose is itself: `jax.grad`
transposes the JVP into the same kernel. Its own JVP (second order) is composed from it:
`rowsum(z)` broadcast to the row's nonzeros is `z - edge_softmax_bwd_p(1, z)`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.interpreters import ad, batching

from jaxsparse_tc._src import checks, heads, rules, vma
from jaxsparse_tc._src.lowering import register_ffi_lowering
from jaxsparse_tc._src.operator import operator
from jaxsparse_tc._src.pattern import NUM_PATTERN_OPERANDS
from jaxsparse_tc._src.primitives import edge_softmax_bwd_p, edge_softmax_p

__all__ = ["edge_softmax", "edge_softmax_p", "edge_softmax_bwd_p"]


@operator
def edge_softmax(A, values=None):
  """Row-wise softmax over the nonzeros of A (a SparseMatrix on the same pattern).

  Uses A's values ([nnz] or [H, nnz], format order), or `values` when given. float32 math,
  max-subtracted; the result has the input dtype (float32, float16 or bfloat16). A row with a
  nan (or +inf) value comes out all nan; a row of -inf values comes out 0, with zero gradients;
  a -inf value gets weight 0.
  """
  pattern = A.pattern_operands()  # checks the pattern arrays' structure first
  v = A.values if values is None else jnp.asarray(values)
  if v.ndim not in (1, 2) or v.shape[-1] != A.nnz:
    raise checks.OperandError(
      f"edge_softmax: A has shape {A.shape} and {A.nnz} nonzeros, so "
      f"values must have shape [{A.nnz}] or [H, {A.nnz}]; got {v.shape}"
    )
  checks.softmax_dtype("edge_softmax", "values", v)
  h = v.shape[0] if v.ndim == 2 else 1
  out = edge_softmax_p.bind(*vma.match(v.reshape((h, A.nnz)), *pattern))
  return A.with_values(out if v.ndim == 2 else out[0])


def _rowsum_bcast(z, pattern):
  """rowsum(z) broadcast to each row's nonzeros, as a linear function of z."""
  ones = jnp.ones((1, z.shape[1]), z.dtype)
  return z - edge_softmax_bwd_p.bind(ones, z, *pattern)


# -- edge_softmax_p ---------------------------------------------------------------------------
def _abstract_eval(values, *pattern):
  del pattern
  return values.update(shape=values.shape, dtype=values.dtype)


def _jvp(primals, tangents):
  values, *pattern = primals
  dvalues = tangents[0]
  y = edge_softmax_p.bind(values, *pattern)
  if type(dvalues) is ad.Zero:
    return y, rules.zero_tangent(y)
  return y, edge_softmax_bwd_p.bind(y, dvalues, *pattern)


def _batch(args, dims):
  values, *pattern = args
  rules.check_pattern_unbatched(dims, 1)
  size = values.shape[dims[0]]
  (values,), h = heads.merge_batch_into_heads([values], dims[:1], size)
  out = edge_softmax_p.bind(values, *pattern)
  return out.reshape((size, h) + out.shape[1:]), 0


edge_softmax_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[edge_softmax_p] = _jvp
batching.primitive_batchers[edge_softmax_p] = _batch
# CUDA also reads each value's row (its kernel strides over a window's values).
register_ffi_lowering(
  edge_softmax_p,
  "edge_softmax",
  1,
  cpu_pattern=lambda P: P.a,
  cuda_pattern=lambda P: (*P.a, P.rows_a),
)


# -- edge_softmax_bwd_p(y, t) = y * (t - rowsum(y * t)) -----------------------------------------
def _bwd_abstract_eval(y, t, *pattern):
  del pattern
  h = heads.num_heads(y.shape[0], t.shape[0])
  return t.update(shape=(h, t.shape[1]), dtype=t.dtype)


def _bwd_jvp(primals, tangents):
  y, t, *pattern = primals
  dy, dt = tangents[:2]
  out = edge_softmax_bwd_p.bind(y, t, *pattern)
  parts = []
  if type(dt) is not ad.Zero:
    parts.append(edge_softmax_bwd_p.bind(y, dt, *pattern))
  if type(dy) is not ad.Zero:
    # d/dy [y * (t - rowsum(y t))] . dy = dy * (t - rowsum(y t)) - y * rowsum(dy t)
    r = _rowsum_bcast(y * t, pattern)
    parts.append(dy * (t - r) - y * _rowsum_bcast(dy * t, pattern))
  if not parts:
    return out, rules.zero_tangent(out)
  tangent = parts[0] if len(parts) == 1 else parts[0] + parts[1]
  return out, jnp.broadcast_to(tangent, out.shape).astype(out.dtype)


def _bwd_transpose(ct, y, t, *pattern):
  none = [None] * NUM_PATTERN_OPERANDS
  if ad.is_undefined_primal(y):
    raise NotImplementedError("edge_softmax_bwd_p is linear in its second operand only")
  if type(ct) is ad.Zero:
    return [None, None] + none
  dt = edge_softmax_bwd_p.bind(y, ct, *pattern)  # self-adjoint
  return [None, heads.sum_to_heads(dt, t.aval.shape[0])] + none


def _bwd_batch(args, dims):
  y, t, *pattern = args
  rules.check_pattern_unbatched(dims, 2)
  size = y.shape[dims[0]] if dims[0] is not None else t.shape[dims[1]]
  (y, t), h = heads.merge_batch_into_heads([y, t], dims[:2], size)
  out = edge_softmax_bwd_p.bind(y, t, *pattern)
  return out.reshape((size, h) + out.shape[1:]), 0


edge_softmax_bwd_p.def_abstract_eval(_bwd_abstract_eval)
ad.primitive_jvps[edge_softmax_bwd_p] = _bwd_jvp
ad.primitive_transposes[edge_softmax_bwd_p] = _bwd_transpose
batching.primitive_batchers[edge_softmax_bwd_p] = _bwd_batch
register_ffi_lowering(
  edge_softmax_bwd_p,
  "edge_softmax_bwd",
  2,
  cpu_pattern=lambda P: P.a,
  cuda_pattern=lambda P: (*P.a, P.rows_a),
)
