"""jax.export of programs that call jaxsparse_tc's operators.

jax.export refuses custom calls whose targets carry no compatibility promise unless each target
is named in `disabled_checks`. jaxsparse_tc's targets are versioned (jaxsparse_tc_<op>_v<N>,
csrc/common/ops.h): a change to an operator's operands, results or attributes gets a new
version, so an artifact serialized against an older binding fails to find its target instead of
calling a handler with a different signature. `export_disabled_checks` names every target of
the op table, for every platform.

The matrices are pytrees whose node types jax.export must know by name to serialize a function
that takes or returns them; they are registered here, at import. A process that deserializes an
artifact must therefore import jaxsparse_tc first: that registers the node types and the FFI
handlers the artifact calls.
"""

from __future__ import annotations

import json

from jax import export as jax_export  # a submodule jax does not import itself before 0.6

from jaxsparse_tc._src import extensions
from jaxsparse_tc._src import sparse_matrix as _sparse_matrix
from jaxsparse_tc._src.pattern import Pattern
from jaxsparse_tc._src.reorder.matrix import ReorderedMatrix
from jaxsparse_tc._src.sparse_matrix import SparseMatrix

# The pytree aux data's origin marker (a weak reference to the flattened matrix).
_Origin = _sparse_matrix._Origin


def export_disabled_checks() -> list[jax_export.DisabledSafetyCheck]:
  """The `disabled_checks` that let `jax.export.export` serialize jaxsparse_tc's operators:
  one `DisabledSafetyCheck.custom_call` per versioned FFI target of the op table (every
  operator, CPU and CUDA alike).

    exported = jax.export.export(jax.jit(f), disabled_checks=jst.export_disabled_checks())(*args)
    blob = exported.serialize()

  The process that runs `jax.export.deserialize(blob).call(...)` must `import jaxsparse_tc`
  first (it registers the FFI handlers and the matrices' pytree types); the same target
  versions must be present there, or compilation fails naming the missing target.
  """
  return [jax_export.DisabledSafetyCheck.custom_call(t) for t in sorted(extensions.OPS.values())]


def _matrix_auxdata_to_bytes(aux) -> bytes:
  shape, grouped, padded, _ = aux
  # The origin is a weak reference to the flattened matrix: not kept, as in another process
  # there is none (the rebuilt matrix is checked by structure, like any traced one).
  return json.dumps({"shape": list(shape), "grouped": list(grouped), "padded": padded}).encode()


def _matrix_auxdata_from_bytes(data: bytes):
  try:
    aux = json.loads(data)
    (m, n), (g, g_t), padded = aux["shape"], aux["grouped"], aux["padded"]
  except (ValueError, KeyError, TypeError):
    raise ValueError(
      f"jaxsparse_tc: malformed serialized matrix node {data!r}; expected JSON with shape "
      "[m, n], grouped [bool, bool] and padded (bool)"
    ) from None
  return (int(m), int(n)), (bool(g), bool(g_t)), bool(padded), _Origin(None)


jax_export.register_namedtuple_serialization(Pattern, serialized_name="jaxsparse_tc.Pattern")
for _cls in (SparseMatrix, ReorderedMatrix):
  jax_export.register_pytree_node_serialization(
    _cls,
    serialized_name=f"jaxsparse_tc.{_cls.__name__}",
    serialize_auxdata=_matrix_auxdata_to_bytes,
    deserialize_auxdata=_matrix_auxdata_from_bytes,
  )
