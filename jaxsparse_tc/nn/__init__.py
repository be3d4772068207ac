"""Graph neural network layers on jaxsparse_tc's operators.

- `jaxsparse_tc.nn.graph`: self-loops, GCN normalization, message-passing matrices from PyG-style
  `edge_index` (rows = targets).
- `jaxsparse_tc.nn.functional`: the layers' math as pure functions.
- `jaxsparse_tc.nn.flax` (needs flax) and `jaxsparse_tc.nn.equinox` (needs equinox): GCNConv,
  GATConv, AGNNConv, TransformerConv, GraphTransformerLayer and two-layer node classifiers.
  Neither framework is imported until its submodule is: `from jaxsparse_tc.nn import flax as nnf`.
"""

import importlib

from jaxsparse_tc.nn import functional, graph

__all__ = ["functional", "graph", "flax", "equinox"]


def __getattr__(name):
  if name in ("flax", "equinox"):
    return importlib.import_module(f"jaxsparse_tc.nn.{name}")
  raise AttributeError(f"module 'jaxsparse_tc.nn' has no attribute {name!r}")
