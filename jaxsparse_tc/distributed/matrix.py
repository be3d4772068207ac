"""ShardedMatrix: a square sparse matrix partitioned into contiguous row blocks over one axis of a
`jax.sharding.Mesh`, each block a local SparseMatrix whose columns index a local + halo space.

Layout (all shards share it; everything is padded to the largest shard):

- Node (dense-row) space: shard p owns global rows `bounds[p] .. bounds[p+1]`, stored at padded
  positions `p * M .. p * M + rows_p` of every dense operand `[P * M, d]` (or `[H, P * M, d]`),
  sharded along that axis: `M = rows_per_shard` is the largest block rounded up to 8, plus 8 spare
  rows, so that every shard ends in an empty window (the padding's anchor, see `_src/padding.py`);
  from 2^16 rows on, M is rounded up to a multiple of 1024 (ROW_ALIGN). Padded rows are zero on
  input and come out zero (plus whatever row-wise layers add: they are never read as columns, and a
  loss must skip them: `row_mask`).
- Values: `[P * nnz_pad]` (or `[H, P * nnz_pad]`), sharded along the last axis; shard p's values
  are its local matrix's format order, its real ones first (`nnz[p]`), then zeros.
- Local matrices: shard p's `M x n_ext` matrix. Its columns ("ext" space) depend on the exchange:
  * "allgather": ext = the padded global node space (`n_ext = P * M`); a shard all-gathers X.
  * "halo": ext = `[own M rows | P chunks of c halo rows]` (`n_ext = M + P * c`): chunk q holds, in
    ascending order, the rows of shard q that shard p reads, padded to c (the largest such
    count); one `all_to_all` of the rows each shard needs (`send[q]` lists, per destination, the
    local rows shard q sends) fills it.
  * "none": no shard reads another's rows (one shard, or a block-diagonal graph): ext = own rows.

The exchange is chosen at build: "auto" takes "halo" when c <= halo_threshold * M (a shard then
receives at most that fraction of what an all-gather would bring), else "allgather".

Parts. By default each shard holds one local matrix (part "all"). With `overlap=True` it holds
two: "own" (the entries whose column is one of the shard's own rows: M x M, local columns) and
"remote" (the others), so that SpMM multiplies the own part while the exchange of the other rows
is in flight (XLA schedules the collective asynchronously around the independent kernel) and adds
the remote part's product after. The remote part's columns index what the collective returns as
it is: the all-gathered rows (P * M columns) or the halo exchange's received chunks (P * c
columns, chunk p, the shard's own, empty); so no copy joins the shard's rows to the received
ones. Each part is padded on its own; a shard's values
are its parts' values one after the other. Row-wise operators (edge softmax, attention) need a
row's entries in one pattern, so they take single-part matrices only.
"""

from jaxsparse_tc._src.distributed.build import (
  shard_coo,
  shard_coo_local,
  shard_matrix,
  shard_scipy,
)
from jaxsparse_tc._src.distributed.halo import DEFAULT_HALO_THRESHOLD as DEFAULT_HALO_THRESHOLD
from jaxsparse_tc._src.distributed.halo import EXCHANGES
from jaxsparse_tc._src.distributed.layout import PartArrays, PartLayout, ShardArrays, ShardLayout
from jaxsparse_tc._src.distributed.mesh import DEFAULT_AXIS, check_host_mesh, make_mesh
from jaxsparse_tc._src.distributed.multihost import (
  local_row_range,
  local_shards,
  stack_batches,
)
from jaxsparse_tc._src.distributed.partition import ROW_ALIGN as ROW_ALIGN
from jaxsparse_tc._src.distributed.partition import ROW_ALIGN_FROM as ROW_ALIGN_FROM
from jaxsparse_tc._src.distributed.partition import partition_rows
from jaxsparse_tc._src.distributed.sharded_matrix import ShardedMatrix

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
  "DEFAULT_AXIS",
  "EXCHANGES",
]
