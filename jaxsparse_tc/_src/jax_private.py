"""The package's one use of JAX internals, kept here and checked by tests/test_public_jax.py.

`jax.experimental.custom_partitioning` (how each primitive declares its sharding rule,
_src/partitioning.py) can lower only when `jax.jit` gives the lowering the program's devices,
and jit does so only for the primitives listed in JAX's internal
`prim_requires_devices_during_lowering` set. `custom_partitioning_p` is listed; a primitive that
emits custom_partitioning from its own lowering rule (rather than at trace time, where it would
give up the primitive's differentiation and batching rules: custom_partitioning has none) has to
be listed too, and no public API does that. Without it, lowering raises inside JAX.

If a JAX release removes the set, `require_devices_during_lowering` returns False and the
primitives lower to their kernels directly (sharded operands are then gathered by XLA); the
test fails so that the upgrade is noticed.
"""

from __future__ import annotations


def _registry():
  try:
    from jax._src import dispatch
  except ImportError:  # pragma: no cover
    return None
  registry = getattr(dispatch, "prim_requires_devices_during_lowering", None)
  return registry if isinstance(registry, set) else None


def require_devices_during_lowering(prim) -> bool:
  """Lists `prim` as needing the devices at lowering; False where this JAX has no such list."""
  registry = _registry()
  if registry is None:
    return False
  registry.add(prim)
  return True


def requires_devices_during_lowering(prim) -> bool:
  """Whether `prim` is listed (for the test)."""
  registry = _registry()
  return registry is not None and prim in registry
