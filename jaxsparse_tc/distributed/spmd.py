"""Sharding rules for the library's primitives under plain `jax.jit` (XLA's SPMD partitioner).

A jitted program whose dense operands are sharded (NamedSharding over a mesh) lowers each of
the library's primitives through `jax.experimental.custom_partitioning`, so that the partitioner
asks this module how to split it instead of gathering every operand onto every device:

- the **head axis** (dim 0 of every dense operand and result, `[H, ...]`) partitions freely:
  each device runs its heads, no communication (operands with 1 head broadcast and stay whole);
- SpMM's **feature axis** (X `[H, n, d]` and the result `[H, m, d]` along d) partitions
  freely: each device multiplies its columns of X;
- everything else cannot be split by a replicated pattern: rows of X (the graph's columns),
  rows of the result, the nonzeros (values, SDDMM's output) and the pattern arrays; SDDMM's and
  attention's feature axis is contracted. Operands sharded along those are gathered first (the
  *fallback*: XLA inserts the all-gathers; a warning names the operand once per primitive), or,
  with `set_fallback("error")`, the compilation fails with an error naming the operand and
  pointing to `jaxsparse_tc.distributed` (a row-partitioned graph, `ShardedMatrix`, is how rows
  are split).

Inside `shard_map` (all mesh axes manual) and on one device the primitives lower as before.
This module is imported by `jaxsparse_tc.distributed` and installs itself then (`install()`);
`uninstall()` restores the plain lowerings.
"""

from __future__ import annotations

import warnings

import numpy as np
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec

__all__ = ["install", "uninstall", "installed", "set_fallback", "get_fallback", "PartitionError"]

_FALLBACKS = ("gather", "error")
_state = {"fallback": "gather", "installed": {}, "warned": set()}


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


def installed() -> bool:
  return bool(_state["installed"])


def _primitives():
  from jaxsparse_tc._src import primitives as P

  return {
    P.spmm_p: 2,
    P.sddmm_p: 2,
    P.edge_softmax_p: 1,
    P.edge_softmax_bwd_p: 2,
    P.attention_fwd_p: 4,
    P.attention_jvp_p: 10,
    P.attention_bwd_p: 7,
    P.attention_grads_p: 7,
  }


def _registry():
  return getattr(mlir, "_platform_specific_lowerings", None)


def _multi_device_auto(ctx) -> bool:
  """Whether the lowering runs in an SPMD program with >1 device and some automatic axes."""
  from jax._src import sharding_impls as si

  ac = ctx.module_context.axis_context
  if isinstance(ac, si.SPMDAxisContext):
    if set(ac.manual_axes) == set(ac.mesh.axis_names):
      return False
    return ac.mesh.size > 1
  if isinstance(ac, si.ShardingContext):
    return ac.num_devices > 1 and ac.device_assignment is not None
  return False


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


def _plan(prim, num_dense, arg_shapes, result_shapes):
  """Decides (head axes, feature axes, problems) from the operands' shardings."""
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
      if i < num_dense and dim == 0 and a.shape[0] == heads and heads > 1:
        if not head_axes and heads % _axes_size(m, axes) == 0:
          head_axes = axes
          continue
        if axes == head_axes:
          continue
      if prim.name == "jaxsparse_tc_spmm" and i == 1 and dim == 2:
        if not feat_axes and a.shape[2] % _axes_size(m, axes) == 0:
          feat_axes = axes
          continue
        if axes == feat_axes:
          continue
      problems.append((i, dim, axes, a.shape))
  if set(head_axes) & set(feat_axes):
    problems.append((1, 2, feat_axes, arg_shapes[1].shape))
    feat_axes = ()
  return mesh, head_axes, feat_axes, problems


def _describe(prim, num_dense, problems) -> str:
  parts = []
  for i, dim, axes, shape in problems:
    what = (
      f"operand {i} (shape {tuple(shape)})"
      if i < num_dense
      else (f"pattern operand {i - num_dense} (shape {tuple(shape)})")
    )
    parts.append(f"{what} is sharded along dim {dim} over mesh axes {axes}")
  return (
    f"{prim.name}: " + "; ".join(parts) + ". A replicated sparsity pattern can only be "
    "split along the head axis (dim 0 of dense operands) and, for SpMM, X's feature axis; "
    "rows and nonzeros need the graph itself partitioned: "
    "jaxsparse_tc.distributed.shard_matrix / shard_coo (a ShardedMatrix)"
  )


def _operand_spec(shape, ndim, dim0_axes, feat_axes, is_dense, heads, spmm_x_or_out):
  spec = [None] * ndim
  if is_dense and ndim and dim0_axes and shape[0] == heads and heads > 1:
    spec[0] = dim0_axes if len(dim0_axes) > 1 else dim0_axes[0]
  if spmm_x_or_out and feat_axes and ndim == 3:
    spec[2] = feat_axes if len(feat_axes) > 1 else feat_axes[0]
  return PartitionSpec(*spec)


def _make_partitioned(prim, params, num_dense, avals_in, avals_out):
  """A custom_partitioning function binding prim with `params` (static)."""
  from jax.experimental.custom_partitioning import custom_partitioning

  is_spmm = prim.name == "jaxsparse_tc_spmm"
  multiple = prim.multiple_results

  def call(*args):
    out = prim.bind(*args, **params)
    return tuple(out) if multiple else out

  cp = custom_partitioning(call)

  def shardings(mesh, head_axes, feat_axes, arg_shapes, result_shapes):
    heads = result_shapes[0].shape[0]
    args = tuple(
      NamedSharding(
        mesh,
        _operand_spec(
          a.shape, len(a.shape), head_axes, feat_axes, i < num_dense, heads, is_spmm and i == 1
        ),
      )
      for i, a in enumerate(arg_shapes)
    )
    outs = tuple(
      NamedSharding(
        mesh, _operand_spec(r.shape, len(r.shape), head_axes, feat_axes, True, heads, is_spmm)
      )
      for r in result_shapes
    )
    return args, outs

  def flat_results(result_shape):
    return list(result_shape) if isinstance(result_shape, (tuple, list)) else [result_shape]

  def decide(mesh, arg_shapes, result_shape):
    results = flat_results(result_shape)
    m, head_axes, feat_axes, problems = _plan(prim, num_dense, arg_shapes, results)
    mesh = m if m is not None else mesh
    if problems:
      msg = _describe(prim, num_dense, problems)
      if _state["fallback"] == "error":
        raise PartitionError(msg)
      key = (prim.name, tuple((i, d) for i, d, _, _ in problems))
      if key not in _state["warned"]:
        _state["warned"].add(key)
        warnings.warn(
          msg + " -- gathering those operands on every device (set_fallback("
          "'error') to fail instead)",
          stacklevel=2,
        )
    return mesh, head_axes, feat_axes, results

  def infer(mesh, arg_shapes, result_shape):
    mesh, head_axes, feat_axes, results = decide(mesh, arg_shapes, result_shape)
    if mesh is None or getattr(mesh, "empty", False):
      return None
    _, outs = shardings(mesh, head_axes, feat_axes, arg_shapes, results)
    return outs if multiple else outs[0]

  def partition(mesh, arg_shapes, result_shape):
    mesh, head_axes, feat_axes, results = decide(mesh, arg_shapes, result_shape)
    args, outs = shardings(mesh, head_axes, feat_axes, arg_shapes, results)
    return mesh, call, (outs if multiple else outs[0]), args

  def propagate(mesh, user_shape):
    return getattr(user_shape, "sharding", None)

  cp.def_partition(
    partition=partition,
    infer_sharding_from_operands=infer,
    propagate_user_sharding=propagate,
    sharding_rule=_sharding_rule(is_spmm, num_dense, avals_in, avals_out),
  )
  return cp


def _sharding_rule(is_spmm, num_dense, avals_in, avals_out):
  """Shardy's rule: head dims share factor `h` (where they have the results' head count), SpMM's
  X and result feature dims factor `f`; every other dim its own factor (the partition callback
  turns a sharding there into a gather or an error)."""
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

  ins = tuple(dims(f"i{i}", a, i < num_dense, is_spmm and i == 1) for i, a in enumerate(avals_in))
  outs = tuple(dims(f"o{i}", a, True, is_spmm) for i, a in enumerate(avals_out))
  return SdyShardingRule(ins, outs)


def _wrap(prim, num_dense, original):
  def rule(ctx, *args, **params):
    if not _multi_device_auto(ctx):
      return original(ctx, *args, **params)
    cp = _make_partitioned(prim, params, num_dense, ctx.avals_in, ctx.avals_out)
    out = mlir.lower_fun(lambda *a: cp(*a), multiple_results=prim.multiple_results)(ctx, *args)
    return out

  rule._jaxsparse_tc_original = original
  return rule


def install() -> None:
  """Routes the primitives' lowerings in multi-device programs through the rules above."""
  reg = _registry()
  if reg is None or installed():
    if reg is None:
      warnings.warn(
        "jaxsparse_tc.distributed.spmd: this jax has no per-platform lowering "
        "registry; sharded operands of the library's primitives are gathered by XLA",
        stacklevel=2,
      )
    return
  try:  # custom_partitioning's lowering needs the devices: ask jit to provide them
    from jax._src import dispatch

    dispatch.prim_requires_devices_during_lowering.update(_primitives())
  except (ImportError, AttributeError):  # pragma: no cover
    pass
  for prim, num_dense in _primitives().items():
    for platform in ("cpu", "cuda", "rocm"):
      entry = reg.get(platform, {}).get(prim)
      if entry is None:
        continue
      original = getattr(entry, "rule", entry)
      if hasattr(original, "_jaxsparse_tc_original"):
        continue
      _state["installed"][(prim, platform)] = original
      mlir.register_lowering(prim, _wrap(prim, num_dense, original), platform=platform)


def uninstall() -> None:
  """Restores the plain lowerings."""
  for (prim, platform), original in list(_state["installed"].items()):
    mlir.register_lowering(prim, original, platform=platform)
  _state["installed"].clear()
