"""Flax (nnx) graph layers over jaxsparse_tc's sparse operators.

    from flax import nnx
    from jaxsparse_tc.nn import flax as nnf, graph

    A = graph.gcn_norm(edge_index, num_nodes)          # rows = targets
    conv = nnf.GCNConv(1433, 16, rngs=nnx.Rngs(0))
    y = conv(A, x)                                       # [num_nodes, 16]

Every layer is called as `layer(A, x)` with `A` a `SparseMatrix` message-passing matrix
(rows = targets, columns = sources: messages flow edge_index[0] -> edge_index[1], PyG's
direction; `jaxsparse_tc.nn.graph`) and `x` [n, features] (SAGE, GIN, GAT, GATv2 and
Transformer also take a bipartite pair `(x_src, x_dst)` with A [n_dst, n_src]). GCN uses A's
values (the normalized adjacency, `graph.gcn_norm`); GIN and SAGE sum or average over A (build
it with `graph.message_passing_matrix(edge_index, n)`); the attention layers use only its
pattern, and GAT/GATv2 with `add_self_loops=True` (PyG's default) require the self-loops in it
(`graph.message_passing_matrix(edge_index, n, add_self_loops=True)`). Layers compute in the
dtype of their features: GCN, SAGE and GIN cast A's values to it (`nn.functional`). Dropout
follows nnx: active until `model.eval()`, drawn from the `dropout` stream of the `rngs` given
at construction.

Semantics and initializations follow PyTorch Geometric's GCNConv, GATConv, GATv2Conv,
AGNNConv, SAGEConv, GINConv and TransformerConv; weights are stored [in, out]
(`nnx.Linear.kernel`), so a PyG `lin.weight` is copied as its transpose. The Equinox twins
(`jaxsparse_tc.nn.equinox`) have the same parameter names and layouts.
"""

from jaxsparse_tc._src.nn.flax import (
  AGNN,
  GAT,
  GCN,
  MLP,
  AGNNConv,
  GATConv,
  GATv2Conv,
  GCNConv,
  GINConv,
  GraphTransformer,
  GraphTransformerLayer,
  SAGEConv,
  TransformerConv,
  glorot,
)

# For jaxsparse_tc/examples; not part of the API.
from jaxsparse_tc._src.nn.flax import _List as _List
from jaxsparse_tc._src.nn.flax import _torch_linear as _torch_linear

__all__ = [
  "GCNConv",
  "GATConv",
  "GATv2Conv",
  "AGNNConv",
  "SAGEConv",
  "GINConv",
  "MLP",
  "TransformerConv",
  "GraphTransformerLayer",
  "GCN",
  "GAT",
  "AGNN",
  "GraphTransformer",
  "glorot",
]
