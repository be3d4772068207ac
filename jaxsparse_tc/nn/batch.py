"""Fixed-shape batches of many graphs: one compiled program for every batch of a dataset.

A batch is the disjoint union of its graphs (PyG's `Batch`) plus a node-to-graph vector, padded
to a `Budget` (jraph's padding idea) so that *every array* of the batch has the same shape in
every batch: node features, edge slots, graph slots, and all the arrays of the sparse format
(docs/FORMAT.md), whose lengths otherwise depend on the graph's structure (window columns,
blocks, schedules). `jax.jit` then traces once per budget.

    graphs = [Graph(edge_index, num_nodes, x=..., y=label), ...]
    budget = Budget.for_dataset(graphs, batch_size=64)
    for batch in GraphLoader(graphs, budget, batch_size=64, shuffle=True, seed=0):
      loss, grads = step(params, batch)            # one trace for all batches

Direction (PyG's): a message flows from `edge_index[0]` (source) to `edge_index[1]` (target);
`batch.A` has rows = targets, `batch.A @ x` sums each node's in-neighbours.

How padding works (and why it contributes nothing):
- Nodes: real nodes first, then padding nodes up to `budget.num_nodes` (a multiple of 8). Padding
  nodes have zero features, belong to no graph (`node_graph` = `num_graphs`, which segment
  reductions drop), and have `node_mask` False.
- Nonzeros: the pattern gets *exactly* `budget.nnz` nonzeros: the real ones, then zero-valued
  dummy entries in dense 8x8 tiles among padding nodes only (rows and columns), so no real row
  ever sees one. Every value position belongs to a block, so every kernel writes every output
  value (no uninitialised entries), and the kernels' size-dependent choices (piece sizes, which
  read nnz) are the same for every batch.
- The other format arrays (condensed columns, blocks, window schedule, row schedule, of A and
  A^T) are padded to bounds that follow from `num_nodes` and `nnz`: unowned trailing entries
  (columns and empty blocks that no window points at) and repeats of the empty last window's
  and last row's schedule items (the last 8 node slots are always padding with no entries).
  Kernels reach blocks only through windows, and an empty item writes its zero rows.
- Edge slots: `budget.num_edges` input-order slots (`batch.edge_index`, `batch.edge_attr`,
  `batch.A.input_to_format`); padding slots point at dummy entries among padding nodes.
So real nodes' outputs, and every gradient that reaches real nodes or parameters through
masked losses, equal the per-graph results; tests/test_batching.py checks both, and counts
traces.

Limits: a batch holds at most `budget.nodes` real nodes, `budget.edges` edges and
`budget.graphs` graphs (GraphLoader closes a batch early when the next graph does not fit; a
single graph over the budget is an error). The block budget is an upper bound (a block per 8
nonzeros plus one per window), which makes the GPU launch plan see sparse blocks and take the
CUDA-core row kernels (what it picks on GNN graphs anyway).
"""

from jaxsparse_tc._src.nn.batch import (
  Budget,
  Graph,
  GraphBatch,
  GraphLoader,
  batch_graphs,
  masked_mean,
  padded_matrix,
  unbatch_nodes,
)

__all__ = [
  "Graph",
  "Budget",
  "GraphBatch",
  "batch_graphs",
  "GraphLoader",
  "unbatch_nodes",
  "masked_mean",
  "padded_matrix",
]
