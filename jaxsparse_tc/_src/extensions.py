"""Loads the compiled extensions and registers their FFI targets with JAX.

The contract between Python and the kernels is defined in C++ (csrc/common/ops.h) and read from
the CPU extension here: the operators' FFI targets (`target`), which platforms implement them
(`has_cpu_kernel`, `has_cuda_kernel`) and the codes of the attributes passed as integers
(`KERNEL_CODES`, `PRECISION_CODES`, `ATTENTION_BACKWARD_CODES`).
"""

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

# {operator name: FFI target (versioned: jaxsparse_tc_<name>_v<N>)}.
OPS: dict[str, str] = dict(_cpu.OPS)
# {name: code} of KernelOptions.spmm / .sddmm, of precision, of KernelOptions.attention_backward.
KERNEL_CODES: dict[str, int] = dict(_cpu.KERNEL_CODES)
PRECISION_CODES: dict[str, int] = dict(_cpu.PRECISION_CODES)
ATTENTION_BACKWARD_CODES: dict[str, int] = dict(_cpu.ATTENTION_BACKWARD_CODES)

if _cuda is not None and dict(_cuda.OPS) != OPS:  # pragma: no cover - a mixed build
  raise ImportError(
    "jaxsparse_tc's CUDA and CPU extensions were built from different operator tables "
    f"(csrc/common/ops.h): CUDA {dict(_cuda.OPS)}, CPU {OPS}; rebuild both"
  )

CPU_TARGETS = frozenset(_cpu.registrations())
for _name, _capsule in _cpu.registrations().items():
  jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

CUDA_TARGETS = frozenset(_cuda.registrations()) if _cuda is not None else frozenset()
if _cuda is not None:
  for _name, _capsule in _cuda.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")


def target(op: str) -> str:
  """The FFI target of operator `op` (a name of the op table, e.g. "spmm")."""
  try:
    return OPS[op]
  except KeyError:
    raise ValueError(
      f"unknown operator {op!r}; the op table (csrc/common/ops.h) has {sorted(OPS)}"
    ) from None


def has_cpu_kernel(op: str) -> bool:
  """Whether the CPU extension has a handler for operator `op`."""
  return target(op) in CPU_TARGETS


def has_cuda_kernel(op: str) -> bool:
  """Whether the CUDA extension was built and has a handler for operator `op`."""
  return target(op) in CUDA_TARGETS


def cpu_extension():
  """The CPU extension module (always built)."""
  return _cpu


def cuda_extension():
  """The CUDA extension module (None where it was not built)."""
  return _cuda


def cuda_built() -> bool:
  """True when the CUDA extension was built and loaded (whether or not a GPU is present)."""
  return _cuda is not None


def has_cuda() -> bool:
  """True when the CUDA kernels can run here: the CUDA extension loaded and jax sees a CUDA
  device. `cuda_built()` asks only whether the extension was built."""
  if _cuda is None:
    return False
  try:
    return len(jax.devices("cuda")) > 0
  except RuntimeError:  # no CUDA backend in this jax (CPU-only jaxlib, or no driver)
    return False
