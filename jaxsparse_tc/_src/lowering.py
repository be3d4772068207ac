"""FFI lowering shared by the primitives: pass the leading operands a kernel reads."""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.interpreters import mlir

from jaxsparse_tc._src.extensions import CUDA_TARGETS

try:
  from jax._src.dispatch import apply_primitive  # eager evaluation through a cached jit
except ImportError:  # pragma: no cover
  from jax.interpreters.xla import apply_primitive


def register_ffi_lowering(prim, target: str, num_kernel_operands: int, *,
                          cuda_extra_operands: tuple[int, ...] = (), cuda_workspace=None,
                          cpu_rule=None, cuda_supports=None, cuda_only_attrs: tuple[str, ...] = (),
                          **static_attrs):
  """Lowers `prim` to FFI `target` on CPU (always) and CUDA (when built).

  Primitives carry both orientations of the pattern for their transpose rules; a kernel reads
  only the first `num_kernel_operands`, and on CUDA also the operands at the indices
  `cuda_extra_operands` (appended in that order). `static_attrs` maps each FFI attribute to
  the param it comes from: a param name (an int32 attribute) or a (param name, numpy scalar
  type) pair.

  `cuda_workspace(avals_in, avals_out, params) -> bytes` (avals_in: the operands the kernel
  reads): the CUDA handler's workspace, an extra uint8 result that XLA plans with the program's
  other buffers and that is dropped here. (Not the FFI scratch allocator: its memory is freed
  when the handler returns, while a CUDA graph captured from the handler keeps the address.)

  `cpu_rule`: a lowering rule for CPU in place of an FFI target (an operator whose CPU
  reference is composed from other primitives). `cuda_supports(avals_in, params) -> bool`: where
  it says no, the CUDA lowering is `cpu_rule` too (a kernel for some dtypes and shapes only, the
  composed reference elsewhere). `cuda_only_attrs`: attributes the CPU handler does not take.
  """
  attr_types = {attr: src if isinstance(src, tuple) else (src, np.int32)
                for attr, src in static_attrs.items()}

  def lower(ctx, operands, params, picked, workspace=None, cuda=False):
    attrs = {attr: typ(params[name]) for attr, (name, typ) in attr_types.items()
             if cuda or attr not in cuda_only_attrs}
    avals_in = [ctx.avals_in[i] for i in picked]
    if workspace is None:
      sub = ctx.replace(avals_in=avals_in)
      return jax.ffi.ffi_lowering(target)(sub, *(operands[i] for i in picked), **attrs)
    nbytes = max(int(workspace(avals_in, ctx.avals_out, params)), 1)
    ws = ctx.avals_out[0].update(shape=(nbytes,), dtype=np.dtype(np.uint8))
    sub = ctx.replace(avals_in=avals_in, avals_out=[*ctx.avals_out, ws])
    return jax.ffi.ffi_lowering(target)(sub, *(operands[i] for i in picked), **attrs)[:-1]

  def rule(ctx, *operands, **params):
    return lower(ctx, operands, params, range(num_kernel_operands))

  def cuda_rule(ctx, *operands, **params):
    if cuda_supports is not None and not cuda_supports(ctx.avals_in, params):
      return cpu_rule(ctx, *operands, **params)
    if any(getattr(a, "dtype", None) == np.float64 for a in ctx.avals_in):
      raise NotImplementedError(
          f"{prim.name}: float64 runs on the CPU kernels only; cast to float32 on GPU")
    return lower(ctx, operands, params, [*range(num_kernel_operands), *cuda_extra_operands],
                 cuda_workspace, cuda=True)

  prim.def_impl(functools.partial(apply_primitive, prim))
  mlir.register_lowering(prim, cpu_rule or rule, platform="cpu")
  if target in CUDA_TARGETS:
    mlir.register_lowering(prim, cuda_rule, platform="cuda")
