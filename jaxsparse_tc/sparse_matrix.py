"""SparseMatrix: the one tensor-core format (docs/FORMAT.md) as a JAX pytree."""

from jaxsparse_tc._src.sparse_matrix import (
  SparseMatrix,
)

__all__ = ["SparseMatrix"]
