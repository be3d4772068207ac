"""Equinox graph layers over jaxsparse_tc's sparse operators.

    import jax, equinox as eqx
    from jaxsparse_tc.nn import equinox as nne, graph

    A = graph.gcn_norm(edge_index, num_nodes)          # rows = targets
    conv = nne.GCNConv(1433, 16, key=jax.random.key(0))
    y = conv(A, x)                                       # [num_nodes, 16]

The twins of `jaxsparse_tc.nn.flax`: the same layers, math (`jaxsparse_tc.nn.functional`),
parameter names and layouts (weights [in, out] in `lin.kernel`; LayerNorm `scale`/`bias`), so
weights copy across leaf by leaf. Layers are called `layer(A, x, *, key=None)` (A: rows =
targets, messages flow edge_index[0] -> edge_index[1]); `key` feeds dropout and is needed only
while dropout is active (turn it off with `eqx.nn.inference_mode(model)`). The equinox MLP has
no BatchNorm (equinox keeps batch statistics in a separate state); use LayerNorm-free MLPs or
the Flax layers for BatchNorm models. Layers compute in the dtype of their features: GCN, SAGE
and GIN cast A's values to it (`nn.functional`).
"""

from jaxsparse_tc._src.nn.equinox import (
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
  LayerNorm,
  Linear,
  SAGEConv,
  TransformerConv,
  glorot,
)

__all__ = [
  "Linear",
  "LayerNorm",
  "MLP",
  "GCNConv",
  "GATConv",
  "GATv2Conv",
  "AGNNConv",
  "SAGEConv",
  "GINConv",
  "TransformerConv",
  "GraphTransformerLayer",
  "GCN",
  "GAT",
  "AGNN",
  "GraphTransformer",
  "glorot",
]
