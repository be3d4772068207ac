"""The jax versions this package supports, checked when this module is imported (first thing
the package does).

The extensions are built against the XLA FFI headers of the oldest supported jax (the build
requirement in pyproject.toml pins it): handlers built against an older FFI API load on newer
jaxlibs, not the reverse. The upper bound excludes minor series that were never tested.
pyproject.toml's `dependencies` states the same range (tests/test_packaging.py checks it).
"""

from __future__ import annotations

import re

import jax

OLDEST = (0, 5, 3)  # the build requirement's jax: the oldest tested
BELOW = (0, 12)  # the first minor series not tested
SUPPORTED = ">=0.5.3,<0.12"


def parse(version: str) -> tuple[int, int, int]:
  """(major, minor, patch) of a jax version string such as "0.5.3" or "0.11.0.dev20260101"."""
  match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
  if match is None:
    raise ValueError(f"unrecognised jax version {version!r}")
  return int(match[1]), int(match[2]), int(match[3] or 0)


def check(version: str) -> None:
  """Raises ImportError unless jax `version` lies in the supported range."""
  parsed = parse(version)
  if parsed < OLDEST or parsed[:2] >= BELOW:
    raise ImportError(
      f"jaxsparse_tc supports jax {SUPPORTED} (its kernels use the XLA FFI of that range); "
      f"the running jax is {version}. Install a supported one: pip install 'jax{SUPPORTED}'"
    )


check(jax.__version__)
