"""The public operators' entry: a container of matrices runs an operator its own way.

A matrix type that defines `__jaxsparse_tc_op__(self, name, *dense, **keywords)`
(distributed.ShardedMatrix, reorder.ReorderedMatrix) receives `jst.spmm(A, ...)` etc. with the
operator's name, its positional parameters (the dense operands) in order and its keyword-only
ones by name, defaults filled in: one calling convention whatever way the user called.
"""

from __future__ import annotations

import functools
import inspect


def operator(fn):
  """`fn(A, ...)` as a public operator (see the module docstring)."""
  sig = inspect.signature(fn)
  name = fn.__name__

  @functools.wraps(fn)
  def op(A, *args, **kwargs):
    run = getattr(type(A), "__jaxsparse_tc_op__", None)
    if run is None:
      return fn(A, *args, **kwargs)
    bound = sig.bind(A, *args, **kwargs)
    bound.apply_defaults()
    params = list(sig.parameters.values())[1:]
    dense = [bound.arguments[p.name] for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = {p.name: bound.arguments[p.name] for p in params if p.kind is p.KEYWORD_ONLY}
    return run(A, name, *dense, **keywords)

  return op
