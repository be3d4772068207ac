"""FFI lowering shared by the primitives: pass the operands a kernel reads, by name."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import numpy as np

from jaxsparse_tc._src import extensions
from jaxsparse_tc._src.partitioning import register_partitioned_lowering
from jaxsparse_tc._src.pattern import PatternOperands

# What a kernel reads of the pattern operands, e.g. `lambda P: P.a` (A's window arrays).
PatternPick = Callable[[PatternOperands], Sequence]
# An FFI attribute's value from the primitive's params.
AttrRule = Callable[[dict], object]


def param(name: str, typ=np.int32) -> AttrRule:
  """An attribute equal to the primitive's param `name`, as `typ`."""
  return lambda params: typ(params[name])


@functools.lru_cache(maxsize=4096)  # as many (primitive, params) as jax's own eager cache
def _jitted(prim, params: tuple):
  kwargs = dict(params)
  return jax.jit(lambda *args: prim.bind(*args, **kwargs))


def eager_impl(prim):
  """A primitive's eager evaluation: one compiled program per set of params (jit caches it per
  shape and dtype)."""

  def impl(*args, **params):
    return _jitted(prim, tuple(sorted(params.items())))(*args)

  return impl


def register_ffi_lowering(
  prim,
  op: str,
  num_dense: int,
  *,
  cpu_pattern: PatternPick,
  cuda_pattern: PatternPick | None = None,
  attrs=None,
  cuda_attrs=None,
  cuda_workspace=None,
  composed_rule=None,
  cuda_supports=None,
  features=(),
):
  """Lowers `prim` (operands: `num_dense` dense arrays, then PatternOperands.flat()) to the FFI
  target of operator `op` (a name of the op table, csrc/common/ops.h) on CPU and, where the
  CUDA extension was built, on CUDA.

  A kernel reads the dense operands and the pattern arrays its pick returns: `cpu_pattern`, and
  on CUDA `cuda_pattern` (default: the same). `attrs` maps each FFI attribute to an AttrRule
  (both platforms); `cuda_attrs` those only the CUDA handler takes (kernel options).

  `cuda_workspace(dense_avals, pattern_avals, avals_out, params) -> bytes`: the CUDA handler's
  workspace, an extra uint8 result that XLA plans with the program's other buffers and that is
  dropped here. (Not the FFI scratch allocator: its memory is freed when the handler returns,
  while a CUDA graph captured from the handler keeps the address.)

  `composed_rule`: the lowering on a platform the op table gives no handler for the operator
  (its reference composed from other primitives). `cuda_supports(avals_in, params) -> bool`:
  where it says no, the CUDA lowering is `composed_rule` too (a kernel for some dtypes and
  shapes only, the composed reference elsewhere). An operator without a CPU handler needs a
  `composed_rule`; one without a CUDA handler runs it on GPUs where one is given.
  """
  target = extensions.target(op)
  if composed_rule is None and not extensions.has_cpu_kernel(op):
    raise ValueError(
      f"{prim.name}: operator {op!r} has no CPU handler (csrc/common/ops.h); give a composed_rule"
    )
  attrs = dict(attrs or {})
  cuda_attrs = {**attrs, **(cuda_attrs or {})}
  cuda_pattern = cuda_pattern or cpu_pattern

  def lower(ctx, operands, params, pick, attr_rules, workspace=None):
    pattern = PatternOperands.unflat(range(num_dense, len(operands)))
    picked = [*range(num_dense), *pick(pattern)]
    avals_in = [ctx.avals_in[i] for i in picked]
    values = {name: rule(params) for name, rule in attr_rules.items()}
    if workspace is None:
      sub = ctx.replace(avals_in=avals_in)
      return jax.ffi.ffi_lowering(target)(sub, *(operands[i] for i in picked), **values)
    pattern_avals = PatternOperands.unflat(ctx.avals_in[num_dense:])
    nbytes = workspace(ctx.avals_in[:num_dense], pattern_avals, ctx.avals_out, params)
    ws = ctx.avals_out[0].update(shape=(max(int(nbytes), 1),), dtype=np.dtype(np.uint8))
    sub = ctx.replace(avals_in=avals_in, avals_out=[*ctx.avals_out, ws])
    return jax.ffi.ffi_lowering(target)(sub, *(operands[i] for i in picked), **values)[:-1]

  def rule(ctx, *operands, **params):
    return lower(ctx, operands, params, cpu_pattern, attrs)

  def cuda_rule(ctx, *operands, **params):
    if cuda_supports is not None and not cuda_supports(ctx.avals_in, params):
      return composed_rule(ctx, *operands, **params)
    if any(getattr(a, "dtype", None) == np.float64 for a in ctx.avals_in):
      raise NotImplementedError(
        f"{prim.name}: float64 runs on the CPU kernels only; cast to float32 on GPU"
      )
    return lower(ctx, operands, params, cuda_pattern, cuda_attrs, cuda_workspace)

  prim.def_impl(eager_impl(prim))
  rules = {"cpu": rule if extensions.has_cpu_kernel(op) else composed_rule}
  if extensions.has_cuda_kernel(op):
    rules["cuda"] = cuda_rule
  elif composed_rule is not None:
    rules["cuda"] = composed_rule
  register_partitioned_lowering(prim, num_dense, tuple(features), rules)
