"""jaxsparse_tc: tensor-core sparse operators as JAX primitives."""

from jaxsparse_tc._src.extensions import has_cuda
from jaxsparse_tc.sparse_matrix import SparseMatrix
from jaxsparse_tc._src.spmm import spmm
from jaxsparse_tc._src.sddmm import sddmm
from jaxsparse_tc._src.edge_softmax import edge_softmax
from jaxsparse_tc._src.attention import sparse_attention

__all__ = ["SparseMatrix", "spmm", "sddmm", "has_cuda", "edge_softmax", "sparse_attention"]
__version__ = "0.1.0"
