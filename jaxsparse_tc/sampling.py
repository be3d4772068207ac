"""Neighbour sampling with fixed shapes: one compiled program for every mini-batch of a graph.

Mini-batch training on a large graph (PyG's NeighborLoader, DGL's sample_neighbors + blocks):
each batch of seed nodes samples, layer by layer outwards, some in-neighbours of its targets;
the layers' bipartite blocks feed a GNN from the outermost layer in. The sampler is in the C++
CPU extension (multithreaded; the draws of node v in layer l come from a random stream hashed
from (seed, l, v), so a seed gives the same sample whatever the thread count).

    sampler = NeighborSampler.from_edge_index(edge_index, num_nodes, [10, 5], batch_size=512)
    for batch in NeighborLoader(sampler, train_nodes, seed=0, progress=True):
      loss, grads = step(params, batch)           # one trace for all batches

    # inside step:
    h = x[batch.input_nodes]
    for block in batch.blocks:                     # outermost layer first
      agg = jst.spmm(block.A, h)                   # [num_src, d]: row i sums target i's sources
      h = layer(block.dst(agg), block.dst(h))      # [num_dst, d]: the targets' rows
    loss = masked_mean(per_seed_loss(h, y[batch.seeds]), batch.seed_mask)

Direction (PyG's): a message flows from `edge_index[0]` to `edge_index[1]`; the CSR has rows =
targets. In each layer the targets are a prefix of the sources (DGL and PyG do the same), so a
block's output rows for its targets are its input rows' prefix.

Fixed shapes: every block is padded to a budget (nn.batch.Budget, padded_matrix: the mechanism
of the graph-classification batches): targets T_1 = batch_size, sources S_l <= T_l (1 + f_l)
(or `max_sources`), T_{l+1} = S_l, edges E_l <= T_l f_l. Padding is inert: the padded
matrix's extra entries are zero-valued and lie in padding rows and columns only; padding
target rows end in padding seed rows, which `seed_mask` drops from the loss, so the gradient
reaching padding rows is zero.
"""

from jaxsparse_tc._src.sampling import (
  Block,
  NeighborLoader,
  NeighborSampler,
  SampledBatch,
  SampledLayer,
  csr_from_edge_index,
  sample_neighbors,
)

__all__ = [
  "sample_neighbors",
  "csr_from_edge_index",
  "SampledLayer",
  "Block",
  "SampledBatch",
  "NeighborSampler",
  "NeighborLoader",
]
