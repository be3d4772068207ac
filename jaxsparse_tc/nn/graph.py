"""Graph helpers: message-passing matrices, self-loops, GCN normalisation, edge features, and
PyG's small utilities (degree, to_undirected, subgraph, dropout_edge).

Direction (PyTorch Geometric's, used everywhere in jaxsparse_tc.nn): an `edge_index` is an
integer array [2, E]; a message flows from the source `edge_index[0, e]` to the target
`edge_index[1, e]`. Layers aggregate at targets with one SpMM, so a *message-passing matrix*
has rows = targets, columns = sources: `M[edge_index[1, e], edge_index[0, e]]`, and `M @ x`
sums each node's in-neighbours. `flow="target_to_source"` (PyG's other flow) builds the
transpose. `SparseMatrix.from_edge_index` follows the same convention.

Patterns are built on the host from a concrete `edge_index` (numpy; under `jax.jit` close over
it, or build the matrix outside). Values may be traced: `gcn_norm` and `message_passing_matrix`
take traced edge weights (under jit or grad), and `normalize_symmetric` renormalises traced
values on a fixed pattern.
"""

from jaxsparse_tc._src.nn.graph import (
  Flow,
  add_remaining_self_loops,
  add_self_loops,
  degree,
  dropout_edge,
  edge_features,
  gcn_norm,
  has_self_loops,
  message_passing_matrix,
  normalize_symmetric,
  remove_self_loops,
  subgraph,
  to_undirected,
)

__all__ = [
  "message_passing_matrix",
  "gcn_norm",
  "normalize_symmetric",
  "add_self_loops",
  "add_remaining_self_loops",
  "remove_self_loops",
  "edge_features",
  "has_self_loops",
  "degree",
  "to_undirected",
  "subgraph",
  "dropout_edge",
  "Flow",
]
