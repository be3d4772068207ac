"""Varying manual axes (shard_map's `check_vma` type system) for the library's primitives.

Inside `jax.shard_map(..., check_vma=True)` every value's type records the mesh axes along which
it varies. JAX's own primitives require their operands to agree and insert the implicit
broadcast (`pcast(..., to="varying")`, whose transpose is a psum) where a replicated operand
meets a varying one. The library's primitives bind through `match`, which does the same, so
that a replicated matrix with sharded features (or the reverse) differentiates correctly: the
cotangent of a replicated operand comes back summed over the axes, replicated again.

Outside shard_map, or with check_vma=False, `match` returns its operands unchanged.
"""

from __future__ import annotations

import jax


def _varying(x) -> frozenset:
  try:
    aval = jax.typeof(x)
  except Exception:  # pragma: no cover (not an array)
    return frozenset()
  vma = getattr(aval, "vma", None)
  if vma is None:
    mat = getattr(aval, "mat", None)
    vma = getattr(mat, "varying", None)
  return frozenset(vma or ())


def _to_varying(x, axes: tuple):
  pcast = getattr(jax.lax, "pcast", None)
  if pcast is not None:
    return pcast(x, axes, to="varying")
  return jax.lax.pvary(x, axes)  # pragma: no cover (jax before pcast)


def match(*operands):
  """The operands, each made varying over the union of their varying manual axes."""
  sets = [_varying(x) for x in operands]
  union = frozenset().union(*sets)
  if not union:
    return operands
  order = tuple(sorted(union, key=str))
  return tuple(
    x if s == union else _to_varying(x, tuple(a for a in order if a not in s))
    for x, s in zip(operands, sets)
  )
