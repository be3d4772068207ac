"""Locality reordering of a graph's nodes for the window format (docs/REORDER.md).

The tensor-core path pays where the 8 rows of a window share columns: a window's condensed
columns are the union of its rows' columns, cut into 8x8 blocks. `reorder` computes a node
permutation (in C++, csrc/cpu/reorder.cc) that puts rows sharing columns into the same window,
and the block statistics before and after. Two ways to use it:

* Explicit: permute the matrix and the node features once, run the whole model in the reordered
  space, map the outputs back at the end::

      r = jst.reorder(A, "affinity")             # A: SparseMatrix, scipy matrix or edge_index
      B = r.permute_matrix(A)                    # P A P^T, a plain SparseMatrix
      y = r.restore(model(B, r.permute(x)))      # outputs back in the caller's node order

* Transparent: `r.wrap(A)` (or `ReorderedMatrix.from_coo(...)`) is a matrix stored reordered
  whose operators (`@`, jst.spmm, sddmm, edge_softmax, sparse_attention) take and return the
  caller's node order; it permutes dense operands in and out (two gathers of [n, d] per SpMM).

Conventions: `perm[new] = old` (`x_new = x[perm]`, `B = A[perm][:, perm]`) and
`inverse[old] = new` (`y = y_new[inverse]`, new edge ids `inverse[edge_index]`).
"""

from jaxsparse_tc._src.reorder.matrix import ReorderedMatrix
from jaxsparse_tc._src.reorder.orderings import METHODS, Reordering, reorder
from jaxsparse_tc._src.reorder.permute import permute_rows_p as permute_rows_p  # the primitive
from jaxsparse_tc._src.reorder.stats import BlockStats, block_stats

__all__ = ["reorder", "Reordering", "ReorderedMatrix", "BlockStats", "block_stats", "METHODS"]
