"""SparseMatrix: the one tensor-core format (docs/FORMAT.md) as a JAX pytree."""

# _rebuild: the function a pickled SparseMatrix names (by this module's path) to rebuild it.
from jaxsparse_tc._src.serialization import _rebuild  # noqa: F401
from jaxsparse_tc._src.sparse_matrix import SparseMatrix

__all__ = ["SparseMatrix"]
