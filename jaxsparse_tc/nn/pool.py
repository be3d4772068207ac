"""Graph-level readout: global add / mean / max pooling by graph (PyG's global_*_pool).

`graph_index` [n] gives each node's graph (a GraphBatch's `node_graph`); `num_graphs` is the
static number of graph slots (`batch.num_graphs`). Nodes whose index is outside
[0, num_graphs) (a GraphBatch's padding nodes) are dropped. Graphs without nodes pool to 0.
Each function also takes the batch itself: `global_add_pool(h, batch)`.
"""

from jaxsparse_tc._src.nn.pool import (
  global_add_pool,
  global_max_pool,
  global_mean_pool,
)

__all__ = ["global_add_pool", "global_mean_pool", "global_max_pool"]
