"""Small pieces shared by the primitives' transformation rules."""

from __future__ import annotations

import jax
from jax.interpreters import ad


def zero_tangent(x):
  """A symbolic zero tangent for primal x (ad.Zero.from_primal_value is not in every jax)."""
  return ad.Zero(jax.typeof(x).to_tangent_aval())


def check_pattern_unbatched(dims, first_pattern: int) -> None:
  """vmap may batch values and dense operands, never the pattern arrays."""
  if any(d is not None for d in dims[first_pattern:]):
    raise NotImplementedError(
      "jaxsparse_tc: vmap over the sparsity pattern is not supported; "
      "batch the values or the dense operands"
    )


def batch_size(args, dims) -> int:
  return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def bilinear_jvp(prim):
  """The JVP rule of a primitive bilinear in its first two operands (the rest: the pattern)."""

  def jvp(primals, tangents, **params):
    a, b, *pattern = primals
    da, db = tangents[:2]
    out = prim.bind(a, b, *pattern, **params)
    parts = []
    if type(da) is not ad.Zero:
      parts.append(prim.bind(da, b, *pattern, **params))
    if type(db) is not ad.Zero:
      parts.append(prim.bind(a, db, *pattern, **params))
    if not parts:
      return out, zero_tangent(out)
    return out, parts[0] if len(parts) == 1 else parts[0] + parts[1]

  return jvp
