"""The package uses public JAX APIs only, but for the one internal hook kept in
jaxsparse_tc/_src/jax_private.py (its docstring says why); these tests fail when that changes or
when a JAX upgrade removes the hook."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import jaxsparse_tc

# The imported package's sources: the source tree's, or an installed wheel's.
PACKAGE = Path(jaxsparse_tc.__file__).resolve().parent
PRIVATE_HOOK = PACKAGE / "_src" / "jax_private.py"

# `import jax._src...`, `from jax._src import ...`, `from jax import _src`
_PRIVATE_IMPORT = re.compile(r"\bjax\._src\b|from\s+jax\s+import\s+[^\n]*\b_src\b")
# Rebinding an attribute of a JAX module (monkey-patching): `jax.x = ...`, `mlir.lower_fun = ...`.
# (Item assignment into JAX's rule tables, `ad.primitive_jvps[p] = rule`, is how a primitive's
# rules are registered, and is allowed.)
_JAX_MODULES = r"(?:jax|jnp|lax|mlir|ad|batching|xla|pe|core|dispatch|custom_partitioning)"
_PATCH = re.compile(rf"^\s*{_JAX_MODULES}(?:\.\w+)+\s*(?:=|\+=)(?!=)", re.MULTILINE)
_SETATTR = re.compile(rf"setattr\(\s*{_JAX_MODULES}\b")


def _sources():
  files = sorted(PACKAGE.rglob("*.py"))
  assert len(files) > 20, f"found only {len(files)} sources under {PACKAGE}"
  return files


def test_no_private_jax_imports_outside_the_hook_module():
  offenders = [
    f"{path.relative_to(PACKAGE.parent)}:{text.count(chr(10), 0, m.start()) + 1}"
    for path in _sources()
    if path != PRIVATE_HOOK
    for text in [path.read_text()]
    for m in _PRIVATE_IMPORT.finditer(text)
  ]
  assert not offenders, f"jax._src used outside {PRIVATE_HOOK.name}: {offenders}"


def test_no_assignment_into_jax_modules():
  offenders = [
    f"{path.relative_to(PACKAGE.parent)}: {m.group(0).strip()}"
    for path in _sources()
    for pattern in (_PATCH, _SETATTR)
    for m in pattern.finditer(path.read_text())
  ]
  assert not offenders, f"JAX module attributes assigned: {offenders}"


def test_the_checks_see_what_they_look_for(tmp_path):
  """The two patterns match the forms they exist to catch (so that the tests above can fail)."""
  assert _PRIVATE_IMPORT.search("from jax._src import dispatch")
  assert _PRIVATE_IMPORT.search("from jax import _src")
  assert _PATCH.search("mlir.register_lowering = wrapped")
  assert _PATCH.search("  jax.config.x = 1")
  assert not _PATCH.search("ad.primitive_jvps[p] = rule")
  assert not _PATCH.search("x = jax.numpy.zeros(3)")
  assert _SETATTR.search("setattr(mlir, 'lower_fun', f)")


def test_the_internal_hook_exists_and_lists_every_primitive():
  """Fails on a JAX release without `prim_requires_devices_during_lowering`: the primitives
  then lower without their sharding rules (jax_private.py)."""
  from jaxsparse_tc._src import jax_private
  from jaxsparse_tc._src import primitives as P

  assert jax_private._registry() is not None, (
    "this JAX has no prim_requires_devices_during_lowering: the sharding rules are off "
    "(see jaxsparse_tc/_src/jax_private.py)"
  )
  import jaxsparse_tc  # noqa: F401 (registers the lowerings)

  prims = [v for v in vars(P).values() if type(v).__name__ == "Primitive"]
  assert len(prims) >= 8
  missing = [p.name for p in prims if not jax_private.requires_devices_during_lowering(p)]
  assert not missing, missing


@pytest.mark.usefixtures("on_cpu")
def test_a_primitive_lowers_through_its_sharding_rule_on_one_device(rng):
  """On one device the rule's custom_partitioning lowers the kernel directly: the compiled
  program calls the FFI target and has no partitioning call left."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from conftest import random_coo

  import jaxsparse_tc as jst

  rows, cols, vals = random_coo(rng, 30, 20, 0.15)
  A = jst.SparseMatrix.from_coo(rows, cols, vals, shape=(30, 20))
  x = jnp.asarray(rng.standard_normal((20, 4)), jnp.float32)
  f = jax.jit(lambda x: A @ x)
  text = f.lower(x).as_text()
  assert "jaxsparse_tc_spmm" in text and "CustomSPMDPartitioning" not in text
  ref = np.zeros((30, 4))
  np.add.at(ref, rows, np.asarray(vals, np.float64)[:, None] * np.asarray(x, np.float64)[cols])
  np.testing.assert_allclose(np.asarray(f(x)), ref, rtol=1e-5, atol=1e-5)
