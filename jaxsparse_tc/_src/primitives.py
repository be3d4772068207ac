"""The library's primitives, declared apart from their rules so that modules whose rules bind
each other's primitives (SpMM and SDDMM are each other's transposes) import without a cycle.

Every primitive's operands are its dense arrays, then pattern.PatternOperands.flat()."""

from __future__ import annotations

from jax.extend.core import Primitive


def _primitive(name: str, multiple_results: bool = False) -> Primitive:
  p = Primitive(name)
  p.multiple_results = multiple_results
  return p


# (values [Hv, nnz], x [Hx, n, d]) -> [H, m, d]
spmm_p = _primitive("jaxsparse_tc_spmm")
# (x [Hx, m, d], y [Hy, n, d]) -> values [H, nnz]
sddmm_p = _primitive("jaxsparse_tc_sddmm")
# (values [H, nnz]) -> [H, nnz]; (y, t) -> y * (t - rowsum(y * t))
edge_softmax_p = _primitive("jaxsparse_tc_edge_softmax")
edge_softmax_bwd_p = _primitive("jaxsparse_tc_edge_softmax_bwd")
# attention.py's module docstring describes these four.
attention_fwd_p = _primitive("jaxsparse_tc_attention_fwd", multiple_results=True)
attention_jvp_p = _primitive("jaxsparse_tc_attention_jvp")
attention_bwd_p = _primitive("jaxsparse_tc_attention_bwd", multiple_results=True)
attention_grads_p = _primitive("jaxsparse_tc_attention_grads", multiple_results=True)
# (values [Hv, nnz], x [Hx, n, d]) -> (out [H, m, d], arg int32 [H, m, d]); spmm_extremum.py
spmm_extremum_p = _primitive("jaxsparse_tc_spmm_extremum", multiple_results=True)
