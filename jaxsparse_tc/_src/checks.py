"""Trace-time checks of operands, with messages that name the shapes involved."""

from __future__ import annotations

import operator

import jax.numpy as jnp
import numpy as np

# float64 runs on the CPU kernels only (with jax_enable_x64); GPU kernels take the other three.
FLOAT_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16, jnp.float64)


class OperandError(TypeError, ValueError):
  """An operand's shape or dtype does not fit the operation.

  Both a TypeError (as jax.lax reports mismatches) and a ValueError (as numpy does).
  """


def is_supported_float(dtype) -> bool:
  return any(np.dtype(dtype) == np.dtype(t) for t in FLOAT_DTYPES)


def softmax_dtype(op: str, name: str, x) -> None:
  """The softmax operations compute in float32 and take float32, float16 and bfloat16 only
  (float64 would silently lose its precision), on CPU and GPU alike."""
  if not is_supported_float(x.dtype) or np.dtype(x.dtype) == np.float64:
    raise OperandError(
      f"{op}: {name} (shape {x.shape}) has dtype {x.dtype}; supported: "
      "float32, float16, bfloat16 (float32 math; cast float64 to float32)"
    )


def dense_operand(op: str, name: str, x, A, *, expected_rows: int) -> None:
  if x.ndim not in (2, 3) or x.shape[-2] != expected_rows:
    raise OperandError(
      f"{op}: A has shape {A.shape}, so {name} must have shape [{expected_rows}, d] or "
      f"[H, {expected_rows}, d]; got {name} with shape {x.shape}"
    )
  if not is_supported_float(x.dtype):
    raise OperandError(
      f"{op}: {name} (shape {x.shape}) has dtype {x.dtype}; supported: float32, float16, "
      f"bfloat16, float64 (CPU) (A has shape {A.shape})"
    )
  if not jnp.issubdtype(A.values.dtype, jnp.floating):
    raise OperandError(
      f"{op}: A's values (shape {A.values.shape}) have non-float dtype {A.values.dtype}"
    )


def promoted_dtype(op: str, A, x, x_dtype=None):
  """The dtype a product of A's values and the dense operand x (taken as `x_dtype` where
  given) is computed in: jnp.matmul's promotion of the two dtypes."""
  x_dtype = x.dtype if x_dtype is None else np.dtype(x_dtype)
  # Dtypes, not arrays: A's values never count as weakly typed.
  dtype = jnp.result_type(A.values.dtype, x_dtype)
  if not is_supported_float(dtype):
    raise OperandError(
      f"{op}: A's values ({A.values.dtype}) and X (shape {x.shape}, {x_dtype}) promote to "
      f"{dtype}, which the kernels do not take; supported: float32, float16, bfloat16, "
      "float64 (CPU)"
    )
  return np.dtype(dtype)


def same_dense(op: str, x, y, names=("X", "Y")) -> None:
  a, b = names
  if x.dtype != y.dtype:
    raise OperandError(
      f"{op}: {a} (shape {x.shape}, {x.dtype}) and {b} (shape {y.shape}, "
      f"{y.dtype}) must have the same dtype"
    )
  if x.shape[-1] != y.shape[-1]:
    raise OperandError(
      f"{op}: {a} has shape {x.shape} and {b} has shape {y.shape}; their last "
      "(feature) dimensions must be equal"
    )


def heads_match(op: str, A, x, h1: int, h2: int, other=None) -> None:
  if h1 > 1 and h2 > 1 and h1 != h2:
    first = f"A's values have shape {A.values.shape}" if other is None else f"X has shape {x.shape}"
    second = f"X has shape {x.shape}" if other is None else f"Y has shape {other.shape}"
    raise OperandError(f"{op}: {first} and {second}: head counts {h1} and {h2} differ")


def int_arg(name: str, v, *, low: int, high: int | None = None, none_ok: bool = True):
  """A Python/numpy integer argument in [low, high], or None where allowed; ValueError else."""
  if v is None and none_ok:
    return None
  try:
    if isinstance(v, (bool, np.bool_)):
      raise TypeError
    i = operator.index(v)
  except TypeError:
    raise ValueError(f"{name} must be an integer; got {v!r} ({type(v).__name__})") from None
  if i < low or (high is not None and i > high):
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ValueError(f"{name} must be an integer {bound}; got {i}")
  return i
