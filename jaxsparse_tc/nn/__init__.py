"""Graph neural network layers on jaxsparse_tc's operators.

Direction (PyTorch Geometric's, everywhere): messages flow from `edge_index[0]` (sources) to
`edge_index[1]` (targets); message-passing matrices have rows = targets.

- `jaxsparse_tc.nn.graph`: message-passing matrices from `edge_index`, self-loops, GCN
  normalisation (traceable in the edge weights), edge features in format order, degree,
  to_undirected, subgraph, dropout_edge.
- `jaxsparse_tc.nn.batch`: fixed-shape padded batches of many graphs (Graph, Budget,
  batch_graphs, GraphLoader): one compiled program for every batch of a dataset.
- `jaxsparse_tc.nn.pool`: global add / mean / max pooling by graph.
- `jaxsparse_tc.nn.functional`: the layers' math as pure functions.
- `jaxsparse_tc.nn.flax` (needs flax) and `jaxsparse_tc.nn.equinox` (needs equinox): GCNConv,
  GATConv, GATv2Conv, AGNNConv, SAGEConv, GINConv, TransformerConv, GraphTransformerLayer, MLP
  and two-layer node classifiers. Neither framework is imported until its submodule is:
  `from jaxsparse_tc.nn import flax as nnf`.
"""

import importlib

from jaxsparse_tc.nn import batch, functional, graph, pool

__all__ = ["batch", "functional", "graph", "pool", "flax", "equinox"]


def __getattr__(name):
  if name in ("flax", "equinox"):
    return importlib.import_module(f"jaxsparse_tc.nn.{name}")
  raise AttributeError(f"module 'jaxsparse_tc.nn' has no attribute {name!r}")
