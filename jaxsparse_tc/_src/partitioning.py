"""Each primitive's sharding rule under `jax.jit` (XLA's SPMD partitioner), declared with its
lowering (lowering.register_ffi_lowering) through `jax.experimental.custom_partitioning`.

A jitted program whose dense operands are sharded (NamedSharding over a mesh) asks these rules
how to split a primitive instead of gathering every operand onto every device:

- the **head axis** (dim 0 of every dense operand and result, `[H, ...]`) partitions freely:
  each device runs its heads, no communication (operands with 1 head broadcast and stay whole);
- a primitive's **feature operands** (SpMM's X `[H, n, d]`, with the result `[H, m, d]`, along
  d) partition freely: each device multiplies its columns of X;
- everything else cannot be split by a replicated pattern: rows of X (the graph's columns),
  rows of the result, the nonzeros (values, SDDMM's output) and the pattern arrays; SDDMM's and
  attention's feature axis is contracted. Operands sharded along those are gathered first (the
  *fallback*: XLA inserts the all-gathers; a warning names the operand once per primitive), or,
  with `set_fallback("error")`, the compilation fails with an error naming the operand and
  pointing to `jaxsparse_tc.distributed` (a row-partitioned graph, `ShardedMatrix`, is how rows
  are split).

On one device and inside `shard_map` (all mesh axes manual) custom_partitioning lowers the
kernel directly. The rule wraps a second primitive, the operator's kernel (`<name>_kernel`, the
same operands, abstract evaluation and FFI lowering, no other rules), so that lowering the
partitioned program does not come back to the rule.
"""

from __future__ import annotations

import warnings

import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec

from jaxsparse_tc._src import jax_private

__all__ = ["PartitionError", "set_fallback", "get_fallback", "register_partitioned_lowering"]

_FALLBACKS = ("gather", "error")
_state = {"fallback": "gather", "warned": set()}


class PartitionError(ValueError):
  """A primitive's operand is sharded along an axis the primitive cannot split."""


def set_fallback(mode: str) -> None:
  """What an operand sharded along an unpartitionable axis gets: "gather" (default: XLA
  gathers it, with a warning) or "error" (compilation fails with a PartitionError)."""
  if mode not in _FALLBACKS:
    raise ValueError(f"fallback must be one of {_FALLBACKS}; got {mode!r}")
  _state["fallback"] = mode


def get_fallback() -> str:
  return _state["fallback"]


# -- the partitioning decision --------------------------------------------------------------------
def _spec_of(shape_struct, ndim):
  """(mesh, spec as a list of per-dim axis tuples) of an operand's sharding, or (None, None)
  where it is not a NamedSharding."""
  s = getattr(shape_struct, "sharding", None)
  if not isinstance(s, NamedSharding):
    return None, None
  spec = list(s.spec) + [None] * (ndim - len(s.spec))
  norm = []
  for entry in spec[:ndim]:
    if entry is None:
      norm.append(())
    elif isinstance(entry, (tuple, list)):
      norm.append(tuple(entry))
    else:
      norm.append((entry,))
  return s.mesh, norm


def _axes_size(mesh, axes) -> int:
  return int(np.prod([mesh.shape[a] for a in axes])) if axes else 1


class _Rule:
  """One primitive's rule: `num_dense` dense operands (then the pattern arrays) and the dense
  operands whose dim 2 splits with the results' dim 2 (`features`)."""

  def __init__(self, name: str, num_dense: int, features: tuple[int, ...]):
    self.name, self.num_dense, self.features = name, num_dense, features

  def plan(self, arg_shapes, result_shapes):
    """(mesh, head axes, feature axes, problems) from the operands' shardings."""
    heads = result_shapes[0].shape[0]
    head_axes, feat_axes, problems, mesh = (), (), [], None
    for i, a in enumerate(arg_shapes):
      m, spec = _spec_of(a, len(a.shape))
      if m is None:
        continue
      mesh = mesh or m
      for dim, axes in enumerate(spec):
        if not axes:
          continue
        if i < self.num_dense and dim == 0 and a.shape[0] == heads and heads > 1:
          if not head_axes and heads % _axes_size(m, axes) == 0:
            head_axes = axes
            continue
          if axes == head_axes:
            continue
        if i in self.features and dim == 2:
          if not feat_axes and a.shape[2] % _axes_size(m, axes) == 0:
            feat_axes = axes
            continue
          if axes == feat_axes:
            continue
        problems.append((i, dim, axes, a.shape))
    if set(head_axes) & set(feat_axes):
      for i in self.features:
        problems.append((i, 2, feat_axes, arg_shapes[i].shape))
      feat_axes = ()
    return mesh, head_axes, feat_axes, problems

  def describe(self, problems) -> str:
    parts = []
    for i, dim, axes, shape in problems:
      what = (
        f"operand {i} (shape {tuple(shape)})"
        if i < self.num_dense
        else f"pattern operand {i - self.num_dense} (shape {tuple(shape)})"
      )
      parts.append(f"{what} is sharded along dim {dim} over mesh axes {axes}")
    return (
      f"{self.name}: " + "; ".join(parts) + ". A replicated sparsity pattern can only be "
      "split along the head axis (dim 0 of dense operands) and, for SpMM, X's feature axis; "
      "rows and nonzeros need the graph itself partitioned: "
      "jaxsparse_tc.distributed.shard_matrix / shard_coo (a ShardedMatrix)"
    )

  def spec(self, shape, head_axes, feat_axes, dense, heads, features) -> PartitionSpec:
    spec = [None] * len(shape)
    if dense and len(shape) and head_axes and shape[0] == heads and heads > 1:
      spec[0] = head_axes if len(head_axes) > 1 else head_axes[0]
    if features and feat_axes and len(shape) == 3:
      spec[2] = feat_axes if len(feat_axes) > 1 else feat_axes[0]
    return PartitionSpec(*spec)

  def shardings(self, mesh, head_axes, feat_axes, arg_shapes, result_shapes):
    heads = result_shapes[0].shape[0]
    split = bool(self.features)
    args = tuple(
      NamedSharding(
        mesh,
        self.spec(a.shape, head_axes, feat_axes, i < self.num_dense, heads, i in self.features),
      )
      for i, a in enumerate(arg_shapes)
    )
    outs = tuple(
      NamedSharding(mesh, self.spec(r.shape, head_axes, feat_axes, True, heads, split))
      for r in result_shapes
    )
    return args, outs

  def decide(self, mesh, arg_shapes, results):
    m, head_axes, feat_axes, problems = self.plan(arg_shapes, results)
    if problems:
      msg = self.describe(problems)
      if _state["fallback"] == "error":
        raise PartitionError(msg)
      key = (self.name, tuple((i, d) for i, d, _, _ in problems))
      if key not in _state["warned"]:
        _state["warned"].add(key)
        warnings.warn(
          msg + " -- gathering those operands on every device (set_fallback("
          "'error') to fail instead)",
          stacklevel=2,
        )
    return (m if m is not None else mesh), head_axes, feat_axes

  def sharding_rule(self, avals_in, avals_out):
    """Shardy's rule: head dims share factor `h` (where they have the results' head count), the
    feature operands' and results' dim 2 factor `f`; every other dim its own factor (the
    partition callback turns a sharding there into a gather or an error)."""
    from jax.experimental.custom_partitioning import SdyShardingRule

    heads = avals_out[0].shape[0]

    def dims(prefix, aval, dense, feature):
      names = []
      for j, size in enumerate(aval.shape):
        if dense and j == 0 and size == heads and heads > 1:
          names.append("h")
        elif feature and j == 2:
          names.append("f")
        else:
          names.append(f"{prefix}_{j}")
      return tuple(names)

    split = bool(self.features)
    ins = tuple(
      dims(f"i{i}", a, i < self.num_dense, i in self.features) for i, a in enumerate(avals_in)
    )
    outs = tuple(dims(f"o{i}", a, True, split) for i, a in enumerate(avals_out))
    return SdyShardingRule(ins, outs)

  def partitioned(self, kernel: Primitive, params: dict, avals_in, avals_out):
    """A custom_partitioning function binding the kernel primitive with `params` (static)."""
    from jax.experimental.custom_partitioning import custom_partitioning

    multiple = kernel.multiple_results

    def call(*args):
      out = kernel.bind(*args, **params)
      return tuple(out) if multiple else out

    def flat(result_shape):
      return list(result_shape) if isinstance(result_shape, (tuple, list)) else [result_shape]

    def infer(mesh, arg_shapes, result_shape):
      results = flat(result_shape)
      mesh, head_axes, feat_axes = self.decide(mesh, arg_shapes, results)
      if mesh is None or getattr(mesh, "empty", False):
        return None
      _, outs = self.shardings(mesh, head_axes, feat_axes, arg_shapes, results)
      return outs if multiple else outs[0]

    def partition(mesh, arg_shapes, result_shape):
      results = flat(result_shape)
      mesh, head_axes, feat_axes = self.decide(mesh, arg_shapes, results)
      args, outs = self.shardings(mesh, head_axes, feat_axes, arg_shapes, results)
      return mesh, call, (outs if multiple else outs[0]), args

    cp = custom_partitioning(call)
    cp.def_partition(
      partition=partition,
      infer_sharding_from_operands=infer,
      propagate_user_sharding=lambda mesh, user_shape: getattr(user_shape, "sharding", None),
      sharding_rule=self.sharding_rule(avals_in, avals_out),
    )
    return cp


def register_partitioned_lowering(
  prim: Primitive, num_dense: int, features: tuple[int, ...], platform_rules: dict
) -> None:
  """Lowers `prim` through its sharding rule to a kernel primitive that `platform_rules`
  ({platform: lowering rule}) lower; where this JAX cannot (jax_private), `prim` takes the
  platform rules directly."""
  if not jax_private.require_devices_during_lowering(prim):
    for platform, rule in platform_rules.items():
      mlir.register_lowering(prim, rule, platform=platform)
    return
  kernel = Primitive(f"{prim.name}_kernel")
  kernel.multiple_results = prim.multiple_results
  kernel.def_effectful_abstract_eval(lambda *args, **params: prim.abstract_eval(*args, **params))
  for platform, rule in platform_rules.items():
    mlir.register_lowering(kernel, rule, platform=platform)
  sharding = _Rule(prim.name, num_dense, features)

  def rule(ctx, *operands, **params):
    cp = sharding.partitioned(kernel, params, ctx.avals_in, ctx.avals_out)
    return mlir.lower_fun(lambda *a: cp(*a), multiple_results=prim.multiple_results)(ctx, *operands)

  mlir.register_lowering(prim, rule)
