"""The node-permutation primitive: a dense operand moved between node orders.

Moving a dense operand between node orders is a gather by a permutation. Its tangent is the
same gather and its transpose the gather by the inverse permutation, not the scatter-add that
jnp.take's transpose would be (serial on CPU, atomics on GPU): a small primitive says so, for
jvp, grad and vmap alike. Operands: x [..., n, d], index [n], inverse [n] (int32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

permute_rows_p = Primitive("jaxsparse_tc_permute_rows")


def _permute_rows_impl(x, index, inverse):
  del inverse
  return jnp.take(x, index, axis=-2, mode="clip")  # a permutation: always in bounds


def _permute_rows_jvp(primals, tangents):
  x, index, inverse = primals
  out = permute_rows_p.bind(x, index, inverse)
  if type(tangents[0]) is ad.Zero:
    return out, ad.Zero(jax.typeof(out).to_tangent_aval())
  return out, permute_rows_p.bind(tangents[0], index, inverse)


def _permute_rows_transpose(ct, x, index, inverse):
  if type(ct) is ad.Zero:
    return [None, None, None]
  return [permute_rows_p.bind(ct, inverse, index), None, None]


def _permute_rows_batch(args, dims):
  x, index, inverse = args
  if dims[1] is not None or dims[2] is not None:
    raise NotImplementedError("jaxsparse_tc: vmap over a node permutation is not supported")
  return permute_rows_p.bind(jnp.moveaxis(x, dims[0], 0), index, inverse), 0


permute_rows_p.def_impl(_permute_rows_impl)
permute_rows_p.def_abstract_eval(lambda x, index, inverse: x.update(shape=x.shape, dtype=x.dtype))
mlir.register_lowering(permute_rows_p, mlir.lower_fun(_permute_rows_impl, multiple_results=False))
ad.primitive_jvps[permute_rows_p] = _permute_rows_jvp
ad.primitive_transposes[permute_rows_p] = _permute_rows_transpose
batching.primitive_batchers[permute_rows_p] = _permute_rows_batch


def take_nodes(x, index, inverse):
  """x[..., index, :] for a dense [n, d] or [H, n, d] operand and a node permutation `index`
  (`inverse` its inverse)."""
  x = jnp.asarray(x)
  if x.ndim < 2:
    raise ValueError(f"expected a dense operand [n, d] or [H, n, d]; got shape {x.shape}")
  return permute_rows_p.bind(x, index, inverse)
