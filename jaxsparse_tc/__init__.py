"""jaxsparse_tc: tensor-core sparse operators as JAX primitives."""

from jaxsparse_tc._extensions import has_cuda
from jaxsparse_tc.sparse_matrix import SparseMatrix
from jaxsparse_tc.spmm import spmm
from jaxsparse_tc.sddmm import sddmm

__all__ = ["SparseMatrix", "spmm", "sddmm", "has_cuda"]
__version__ = "0.1.0"
