"""Plain `jax.jit` with sharded dense operands and a replicated SparseMatrix: each primitive's
sharding rule (declared with its lowering, jaxsparse_tc/_src/partitioning.py) splits the head
axis, and SpMM's feature columns, across devices with no communication; operands sharded along
an axis a replicated pattern cannot split are gathered with a warning, or refused:

    from jaxsparse_tc.distributed import spmd
    spmd.set_fallback("error")  # a PartitionError instead of the gather
"""

from jaxsparse_tc._src.partitioning import PartitionError, get_fallback, set_fallback

__all__ = ["set_fallback", "get_fallback", "PartitionError"]
