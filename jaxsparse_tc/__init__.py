"""jaxsparse_tc: tensor-core sparse operators as JAX primitives."""

# First: importing it refuses a jax outside the supported range, before other modules use jax.
from jaxsparse_tc._src import jax_version  # noqa: F401

# isort: split

from jaxsparse_tc import (
  distributed,  # sharded matrices; sharding rules of the primitives
  interop,  # BCOO conversions
)
from jaxsparse_tc._src import serialization  # noqa: F401 (pickle and flax.serialization of matrices)
from jaxsparse_tc._src.attention import sparse_attention
from jaxsparse_tc._src.edge_softmax import edge_softmax
from jaxsparse_tc._src.export import export_disabled_checks  # jax.export; registers the pytrees
from jaxsparse_tc._src.extensions import has_cuda
from jaxsparse_tc._src.sddmm import sddmm
from jaxsparse_tc._src.select import KernelPlan, PatternFeatures, kernel_plan
from jaxsparse_tc._src.spmm import spmm
from jaxsparse_tc.options import FormatOptions, KernelOptions
from jaxsparse_tc.reorder import ReorderedMatrix, Reordering, reorder  # docs/REORDER.md
from jaxsparse_tc.sparse_matrix import SparseMatrix

__all__ = [
  "SparseMatrix",
  "spmm",
  "sddmm",
  "edge_softmax",
  "sparse_attention",
  "KernelOptions",
  "FormatOptions",
  "kernel_plan",
  "KernelPlan",
  "PatternFeatures",
  "has_cuda",
  "export_disabled_checks",
  "interop",
  "distributed",
  "reorder",
  "Reordering",
  "ReorderedMatrix",
]
__version__ = "0.1.0"
