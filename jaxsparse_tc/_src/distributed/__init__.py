"""Sharded matrices' internals; the public API is jaxsparse_tc.distributed (docs/DISTRIBUTED.md).

mesh: meshes and the host-mesh check; partition: row blocks and the rows per shard; halo: the
exchange plan (halo lists, ext columns, send lists); layout: ShardLayout and the per-shard
arrays; sharded_matrix: the ShardedMatrix container; build: shard_coo and its kin (shard_coo_local:
one process's shards of a multi-process matrix); multihost: what several processes agree on at
build, global arrays from each process's shards, data-parallel batches.
"""
