"""jaxsparse_tc: tensor-core sparse operators as JAX primitives."""

from jaxsparse_tc._extensions import has_cuda
from jaxsparse_tc.sparse_matrix import SparseMatrix
from jaxsparse_tc.spmm import spmm
from jaxsparse_tc.sddmm import sddmm
from jaxsparse_tc.edge_softmax import edge_softmax
from jaxsparse_tc.attention import sparse_attention

__all__ = ["SparseMatrix", "spmm", "sddmm", "has_cuda", "edge_softmax", "sparse_attention"]
__version__ = "0.1.0"
