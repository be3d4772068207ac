"""Locality reordering's internals; the public API is jaxsparse_tc.reorder (docs/REORDER.md).

inputs: graph inputs to COO arrays, argument checks; stats: block statistics; orderings: the
C++ orderings and the Reordering they give; permute: the node-permutation primitive; matrix:
ReorderedMatrix, a matrix stored reordered behind the caller's node order.
"""
