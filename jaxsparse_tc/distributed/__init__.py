"""Multi-device sparse operators on JAX's own SPMD machinery (`jax.sharding`, `shard_map`, XLA
collectives).

Row-partitioned graphs (`ShardedMatrix`): a square matrix cut into contiguous row blocks
balanced by nonzeros, one per device of a mesh axis, each a local SparseMatrix whose columns
index a local + halo space; the library's operators (`jst.spmm`, `jst.sddmm`,
`jst.edge_softmax`, `jst.sparse_attention`, and so the GNN layers) run on it in one `shard_map`
each, exchanging dense rows by all-gather or by a halo all_to_all (chosen from the halo size at
build, overridable), with gradients through the exchanges.

    import jaxsparse_tc as jst
    from jaxsparse_tc import distributed as dist

    mesh = dist.make_mesh()                      # all devices, axis "shards"
    SA = dist.shard_matrix(A, mesh)              # or dist.shard_coo(rows, cols, values, ...)
    X = SA.shard_rows(x)                         # [n, d] -> [P*M, d], sharded
    Y = jst.spmm(SA, X)                          # = SA.shard_rows(A @ x)
    y = SA.unshard_rows(Y)                       # back to [n, d]
    Xe = dist.exchange(SA, X)                    # the rows each shard reads, once:
    Y = jst.spmm(SA, Xe)                         # then the SpMM exchanges nothing

Plain `jax.jit` with sharded dense operands and an ordinary SparseMatrix needs nothing from
here: each primitive carries its sharding rule (heads and SpMM's feature columns split across
devices); `jaxsparse_tc.distributed.spmd.set_fallback` chooses what other shardings get.
"""

from jaxsparse_tc._src.distributed import ops
from jaxsparse_tc._src.distributed.ops import (
  edge_softmax,
  exchange,
  sddmm,
  shard_map_compat,
  sparse_attention,
  spmm,
)
from jaxsparse_tc._src.distributed.sharded_matrix import bind_operators
from jaxsparse_tc.distributed import spmd
from jaxsparse_tc.distributed.matrix import (
  DEFAULT_AXIS,
  EXCHANGES,
  PartArrays,
  PartLayout,
  ShardArrays,
  ShardedMatrix,
  ShardLayout,
  check_host_mesh,
  local_row_range,
  local_shards,
  make_mesh,
  partition_rows,
  shard_coo,
  shard_coo_local,
  shard_matrix,
  shard_scipy,
  stack_batches,
)

bind_operators(ops)  # jst.spmm etc. on a ShardedMatrix dispatch to these

__all__ = [
  "ShardedMatrix",
  "ShardLayout",
  "ShardArrays",
  "PartLayout",
  "PartArrays",
  "make_mesh",
  "check_host_mesh",
  "partition_rows",
  "shard_coo",
  "shard_coo_local",
  "local_row_range",
  "local_shards",
  "stack_batches",
  "shard_matrix",
  "shard_scipy",
  "spmm",
  "sddmm",
  "edge_softmax",
  "sparse_attention",
  "exchange",
  "shard_map_compat",
  "spmd",
  "DEFAULT_AXIS",
  "EXCHANGES",
]
