"""The implementation of jaxsparse_tc.nn.pool, whose docstring documents it."""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np


def _args(x, graph_index, num_graphs):
  batch = None
  if hasattr(graph_index, "node_graph") and hasattr(graph_index, "graph_mask"):
    batch = graph_index
    if num_graphs is not None:
      raise TypeError("pass either a GraphBatch or (graph_index, num_graphs), not both")
    graph_index, num_graphs = batch.node_graph, batch.num_graphs
  if num_graphs is None:
    raise TypeError(
      "num_graphs (the static number of graph slots) is required with a "
      "graph_index array; or pass the GraphBatch itself"
    )
  given = num_graphs
  try:
    if isinstance(given, (bool, np.bool_)):
      raise TypeError
    num_graphs = operator.index(given)
  except TypeError:
    num_graphs = -1
  if num_graphs < 0:
    raise ValueError(
      f"num_graphs must be a static non-negative integer (the graph slots); got {given!r}"
    )
  x = jnp.asarray(x)
  graph_index = jnp.asarray(graph_index)
  if x.ndim < 1:
    raise ValueError(f"x must hold node features [num_nodes, ...]; got shape {x.shape}")
  if graph_index.ndim != 1 or graph_index.shape[0] != x.shape[0]:
    what = "the batch's node slots" if batch is not None else "one graph per node of x"
    raise ValueError(
      f"x has shape {x.shape}, so graph_index must have shape [{x.shape[0]}] ({what}); got "
      f"{graph_index.shape}"
      + (": pool the features of this batch's nodes, batch.x's rows" if batch is not None else "")
    )
  if not jnp.issubdtype(graph_index.dtype, jnp.integer):
    raise TypeError(f"graph_index must hold integers; got {graph_index.dtype}")
  return x, graph_index, int(num_graphs)


def global_add_pool(x, graph_index, num_graphs: int | None = None):
  """Sum of each graph's node features: [num_graphs, ...]."""
  x, gi, g = _args(x, graph_index, num_graphs)
  return jax.ops.segment_sum(x, gi, num_segments=g)


def global_mean_pool(x, graph_index, num_graphs: int | None = None):
  """Mean of each graph's node features (0 for a graph without nodes)."""
  x, gi, g = _args(x, graph_index, num_graphs)
  total = jax.ops.segment_sum(x, gi, num_segments=g)
  count = jax.ops.segment_sum(jnp.ones(gi.shape, x.dtype), gi, num_segments=g)
  return total / jnp.maximum(count, 1).reshape((g,) + (1,) * (x.ndim - 1))


def global_max_pool(x, graph_index, num_graphs: int | None = None):
  """Feature-wise maximum over each graph's nodes (0 for a graph without nodes)."""
  x, gi, g = _args(x, graph_index, num_graphs)
  out = jax.ops.segment_max(x, gi, num_segments=g)
  count = jax.ops.segment_sum(jnp.ones(gi.shape, jnp.int32), gi, num_segments=g)
  return jnp.where((count > 0).reshape((g,) + (1,) * (x.ndim - 1)), out, 0)
