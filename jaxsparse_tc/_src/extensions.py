"""Loads the compiled extensions and registers their FFI targets with JAX."""

from __future__ import annotations

import jax

try:
  from jaxsparse_tc import _cpu
except ImportError as e:  # pragma: no cover - a source tree that was never built
  raise ImportError(
    "jaxsparse_tc's compiled extension is missing: install the package (pip install -e .) "
    "rather than importing an unbuilt source tree"
  ) from e

try:  # built only where nvcc was found
  from jaxsparse_tc import _cuda
except ImportError:  # pragma: no cover - depends on the build
  _cuda = None

for _name, _capsule in _cpu.registrations().items():
  jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

CUDA_TARGETS = frozenset(_cuda.registrations()) if _cuda is not None else frozenset()
if _cuda is not None:
  for _name, _capsule in _cuda.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")


def cpu_extension():
  """The CPU extension module (always built)."""
  return _cpu


def cuda_extension():
  """The CUDA extension module (None where it was not built)."""
  return _cuda


def has_cuda() -> bool:
  """True when the CUDA extension was built (whether or not a GPU is present)."""
  return _cuda is not None
