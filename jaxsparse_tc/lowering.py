"""FFI lowering shared by the primitives: pass the leading operands a kernel reads."""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.interpreters import mlir

from jaxsparse_tc._extensions import CUDA_TARGETS

try:
  from jax._src.dispatch import apply_primitive  # eager evaluation through a cached jit
except ImportError:  # pragma: no cover
  from jax.interpreters.xla import apply_primitive


def register_ffi_lowering(prim, target: str, num_kernel_operands: int, **static_attrs):
  """Lowers `prim` to FFI `target` on CPU (always) and CUDA (when built).

  Primitives carry both orientations of the pattern for their transpose rules; a kernel reads
  only the first `num_kernel_operands`. `static_attrs` maps each FFI attribute to the param it
  comes from: a param name (an int32 attribute) or a (param name, numpy scalar type) pair.
  """
  attr_types = {attr: src if isinstance(src, tuple) else (src, np.int32)
                for attr, src in static_attrs.items()}

  def rule(ctx, *operands, **params):
    attrs = {attr: typ(params[name]) for attr, (name, typ) in attr_types.items()}
    sub = ctx.replace(avals_in=ctx.avals_in[:num_kernel_operands])
    return jax.ffi.ffi_lowering(target)(sub, *operands[:num_kernel_operands], **attrs)

  def cuda_rule(ctx, *operands, **params):
    if any(getattr(a, "dtype", None) == np.float64 for a in ctx.avals_in):
      raise NotImplementedError(
          f"{prim.name}: float64 runs on the CPU kernels only; cast to float32 on GPU")
    return rule(ctx, *operands, **params)

  prim.def_impl(functools.partial(apply_primitive, prim))
  mlir.register_lowering(prim, rule, platform="cpu")
  if target in CUDA_TARGETS:
    mlir.register_lowering(prim, cuda_rule, platform="cuda")
