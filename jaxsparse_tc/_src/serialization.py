"""Saving SparseMatrix: pickle and flax.serialization rebuild it through its checked constructor.

A matrix restored from bytes is checked like one built from arrays (dtypes, shapes and the
format's invariants, docs/FORMAT.md): a file that was truncated, edited or written by another
format version is refused with a PatternError or ValueError rather than handed to the kernels.

flax is optional and heavy to import, so the flax.serialization handlers are registered when
flax.serialization is first imported (at once where it already is), never importing it here.
"""

from __future__ import annotations

import copyreg
import importlib.abc
import sys

import jax.numpy as jnp

from jaxsparse_tc._src.pattern import Pattern
from jaxsparse_tc._src.sparse_matrix import SparseMatrix

_ARRAYS = ("values", "pattern", "pattern_t", "perm_t", "perm_t_inv", "input_to_format")


def _rebuild(
  values, pattern, pattern_t, perm_t, perm_t_inv, input_to_format, shape, grouped, padded
):
  """A matrix from its saved parts, through the constructor's integrity checks."""
  return SparseMatrix(
    values,
    Pattern(*pattern),
    Pattern(*pattern_t),
    perm_t,
    perm_t_inv,
    input_to_format,
    shape,
    grouped,
    padded,
  )


# Pickles name the rebuild function by its public path, as they name SparseMatrix (the
# implementation's place under _src may move; the public module re-exports it), and hold the
# patterns as plain tuples for the same reason.
_rebuild.__module__ = "jaxsparse_tc.sparse_matrix"


def _reduce(A: SparseMatrix):
  parts = tuple(getattr(A, name) for name in _ARRAYS)
  parts = tuple(tuple(p) if isinstance(p, Pattern) else p for p in parts)
  return _rebuild, (*parts, A.shape, A.grouped, A.padded)


# The dispatch table applies to SparseMatrix itself; subclasses (ReorderedMatrix) pickle as
# plain objects.
copyreg.pickle(SparseMatrix, _reduce)


# -- flax.serialization ---------------------------------------------------------------------------
def _to_state_dict(A: SparseMatrix) -> dict:
  return {
    "values": A.values,
    "pattern": dict(A.pattern._asdict()),
    "pattern_t": dict(A.pattern_t._asdict()),
    "perm_t": A.perm_t,
    "perm_t_inv": A.perm_t_inv,
    "input_to_format": A.input_to_format,
    "shape": list(A.shape),
    "grouped": list(A.grouped),
    "padded": A.padded,
  }


def _from_state_dict(target: SparseMatrix, state: dict) -> SparseMatrix:
  """The saved matrix (its own pattern and shape: `target` only says that a SparseMatrix goes
  here, as flax restores into a template tree), as device arrays like the builders'."""
  del target
  expected = set(_ARRAYS) | {"shape", "grouped", "padded"}
  if not isinstance(state, dict) or set(state) != expected:
    got = sorted(state) if isinstance(state, dict) else type(state).__name__
    raise ValueError(
      f"jaxsparse_tc: the saved state of a SparseMatrix must have the fields {sorted(expected)}; "
      f"got {got}"
    )
  patterns = []
  for name in ("pattern", "pattern_t"):
    fields = state[name]
    if not isinstance(fields, dict) or set(fields) != set(Pattern._fields):
      got = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
      raise ValueError(
        f"jaxsparse_tc: the saved SparseMatrix's {name} must have the fields "
        f"{list(Pattern._fields)}; got {got}"
      )
    patterns.append(tuple(jnp.asarray(fields[f]) for f in Pattern._fields))
  return _rebuild(
    jnp.asarray(state["values"]),
    *patterns,
    jnp.asarray(state["perm_t"]),
    jnp.asarray(state["perm_t_inv"]),
    jnp.asarray(state["input_to_format"]),
    tuple(state["shape"]),
    tuple(state["grouped"]),
    bool(state["padded"]),
  )


def _register_flax(flax_serialization) -> None:
  flax_serialization.register_serialization_state(
    SparseMatrix, _to_state_dict, _from_state_dict, override=True
  )


class _RegisteringLoader(importlib.abc.Loader):
  """flax.serialization's own loader, registering the handlers once the module has run."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    _register_flax(module)

  def __getattr__(self, name):  # get_source, get_code, ...: the wrapped loader's
    return getattr(self._loader, name)


class _FlaxSerializationHook(importlib.abc.MetaPathFinder):
  """Finds flax.serialization with the other finders and wraps its loader; removes itself."""

  def find_spec(self, fullname, path, target=None):
    if fullname != "flax.serialization":
      return None
    if self in sys.meta_path:
      sys.meta_path.remove(self)
    for finder in sys.meta_path:
      find_spec = getattr(finder, "find_spec", None)
      spec = find_spec(fullname, path, target) if find_spec else None
      if spec is not None:
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
          spec.loader = _RegisteringLoader(spec.loader)
        return spec
    return None


if "flax.serialization" in sys.modules:
  _register_flax(sys.modules["flax.serialization"])
else:
  sys.meta_path.insert(0, _FlaxSerializationHook())
