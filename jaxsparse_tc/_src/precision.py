"""Matmul precision for float32 inputs, in the vocabulary of jax.lax."""

from __future__ import annotations

import jax

from jaxsparse_tc._src.extensions import PRECISION_CODES

# Values of the FFI attribute `precision` (csrc/common/ops.h Precision). DEFAULT: float32 at
# least as accurate as tf32 (tf32 tensor cores, or exact CUDA cores); HIGHEST: exact float32 on
# CUDA cores.
DEFAULT = PRECISION_CODES["default"]
HIGHEST = PRECISION_CODES["highest"]

_NAMES = {
  None: DEFAULT,
  "default": DEFAULT,
  "fastest": DEFAULT,
  "tensorfloat32": DEFAULT,
  "high": DEFAULT,
  "bfloat16": DEFAULT,
  "highest": HIGHEST,
  "float32": HIGHEST,
}


def canonicalize(precision) -> int:
  """FFI value of a precision argument. None follows JAX's own default for float32 matmuls
  (`jax.default_matmul_precision(...)` / the jax_default_matmul_precision option), read at
  trace time as jnp.matmul reads it; names JAX knows that are not listed here (algorithm
  names) count as 'default'."""
  if precision is None:
    configured = jax.config.jax_default_matmul_precision
    return _NAMES.get(configured.lower() if isinstance(configured, str) else None, DEFAULT)
  if isinstance(precision, jax.lax.Precision):
    return HIGHEST if precision == jax.lax.Precision.HIGHEST else DEFAULT
  if isinstance(precision, str) and precision.lower() in _NAMES:
    return _NAMES[precision.lower()]
  raise ValueError(
    f"precision must be None, 'default', 'highest' or a jax.lax.Precision; got {precision!r}"
  )
