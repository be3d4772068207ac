"""ReorderedMatrix: a square SparseMatrix stored in a locality order of its nodes (transparent
mode), whose operators take and return node-indexed arrays in the caller's order."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsparse_tc._src.reorder import inputs
from jaxsparse_tc._src.reorder.orderings import reorder
from jaxsparse_tc._src.reorder.permute import take_nodes
from jaxsparse_tc._src.sparse_matrix import SparseMatrix


@jax.tree_util.register_pytree_node_class
class ReorderedMatrix(SparseMatrix):
  """A square SparseMatrix stored in a reordered node order, seen in the caller's order.

  Its values, `pattern`, `pattern_t` and format order are those of the stored matrix P A P^T
  (`inner`); `rows`, `cols`, `todense()`, `to_scipy()` and every operator (`@`, jst.spmm,
  jst.sddmm, jst.edge_softmax, jst.sparse_attention, and the layers of jaxsparse_tc.nn built on
  them) speak the caller's node order: dense operands are permuted in ([n, d] gathered by
  `node_perm`) and results out (by `node_inverse`). Per-edge arrays (values, bias, sddmm
  results) are in the format order, as for any SparseMatrix. `values_from_input` maps the
  constructor's input entries, as for A. Build with `Reordering.wrap`, `from_matrix` or
  `from_coo`.
  """

  def __init__(
    self,
    values,
    pattern,
    pattern_t,
    perm_t,
    perm_t_inv,
    input_to_format,
    shape,
    grouped=(False, False),
    *,
    node_perm,
    node_inverse,
  ):
    super().__init__(
      values, pattern, pattern_t, perm_t, perm_t_inv, input_to_format, shape, grouped
    )
    self.node_perm = node_perm
    self.node_inverse = node_inverse

  def _assign(self, *args, node_perm=None, node_inverse=None, **kwargs):
    super()._assign(*args, **kwargs)
    self.node_perm = node_perm  # int32 [n]: stored node i is the caller's node node_perm[i]
    self.node_inverse = node_inverse  # int32 [n]: the caller's node j is stored at node_inverse[j]

  @classmethod
  def _of(cls, B: SparseMatrix, node_perm, node_inverse) -> "ReorderedMatrix":
    return cls._unchecked(
      B.values,
      B.pattern,
      B.pattern_t,
      B.perm_t,
      B.perm_t_inv,
      B.input_to_format,
      B.shape,
      B.grouped,
      node_perm=node_perm,
      node_inverse=node_inverse,
    )

  # -- pytree -------------------------------------------------------------------------------
  def tree_flatten(self):
    children, aux = super().tree_flatten()
    return tuple(children) + (self.node_perm, self.node_inverse), aux

  @classmethod
  def tree_unflatten(cls, aux, children):
    shape, grouped, padded, origin = aux
    *base, node_perm, node_inverse = children
    R = cls._unchecked(
      *base,
      shape=shape,
      grouped=grouped,
      padded=padded,
      node_perm=node_perm,
      node_inverse=node_inverse,
    )
    R._check(contents=not origin.same_pattern(R))
    return R

  # -- construction -------------------------------------------------------------------------
  @classmethod
  def from_matrix(
    cls,
    A: SparseMatrix,
    method: str = "affinity",
    *,
    seed: int = 0,
    format_options=None,
    **reorder_kwargs,
  ) -> "ReorderedMatrix":
    """A reordered by `reorder(A, method, seed=seed, ...)`, behind A's node order."""
    return reorder(A, method, seed=seed, **reorder_kwargs).wrap(A, format_options=format_options)

  @classmethod
  def from_coo(
    cls,
    rows,
    cols,
    values=None,
    *,
    shape=None,
    method: str = "affinity",
    seed: int = 0,
    format_options=None,
    **reorder_kwargs,
  ) -> "ReorderedMatrix":
    """SparseMatrix.from_coo's arguments (square), built reordered (one format build)."""
    rows, cols = inputs.index_array("rows", rows), inputs.index_array("cols", cols)
    if shape is None:
      k = int(max(rows.max(), cols.max())) + 1 if rows.size else 0
      shape = (k, k)
    r = reorder((rows, cols), method, seed=seed, num_nodes=shape[0], **reorder_kwargs)
    if tuple(shape) != (r.num_nodes, r.num_nodes):
      raise ValueError(f"a reordered matrix must be square; got shape {tuple(shape)}")
    B = SparseMatrix.from_coo(
      r.inverse[rows], r.inverse[cols], values, shape=shape, format_options=format_options
    )
    return cls._of(B, jnp.asarray(r.perm, jnp.int32), jnp.asarray(r.inverse, jnp.int32))

  # -- views ---------------------------------------------------------------------------------
  @property
  def inner(self) -> SparseMatrix:
    """The stored matrix P A P^T, a plain SparseMatrix in the reordered node order."""
    return SparseMatrix.with_values(self, self.values)

  @property
  def rows(self):
    """Row of each value (the caller's node ids), format order."""
    return self.node_perm[self.pattern.rows]

  @property
  def cols(self):
    """Column of each value (the caller's node ids), format order."""
    return self.node_perm[self.pattern.cols]

  def with_values(self, values) -> "ReorderedMatrix":
    return ReorderedMatrix._of(self.inner.with_values(values), self.node_perm, self.node_inverse)

  @property
  def T(self) -> "ReorderedMatrix":
    return ReorderedMatrix._of(self.inner.T, self.node_perm, self.node_inverse)

  def __matmul__(self, x):
    return self.__jaxsparse_tc_op__("spmm", x)

  def __repr__(self) -> str:
    return (
      f"ReorderedMatrix(shape={self.shape}, nnz={self.nnz}, dtype={self.values.dtype}, "
      f"blocks={self.pattern.num_blocks})"
    )

  # -- operators (the library's entry points dispatch here) ---------------------------------
  def __jaxsparse_tc_op__(self, name: str, *args, **kwargs):
    from jaxsparse_tc._src.attention import sparse_attention
    from jaxsparse_tc._src.edge_softmax import edge_softmax
    from jaxsparse_tc._src.sddmm import sddmm
    from jaxsparse_tc._src.spmm import spmm

    perm, inv, inner = self.node_perm, self.node_inverse, self.inner
    if name == "spmm":
      (x,) = args
      return take_nodes(spmm(inner, take_nodes(x, perm, inv), **kwargs), inv, perm)
    if name == "sddmm":
      x, y = args
      out = sddmm(inner, take_nodes(x, perm, inv), take_nodes(y, perm, inv), **kwargs)
      return ReorderedMatrix._of(out, perm, inv)
    if name == "edge_softmax":
      return ReorderedMatrix._of(edge_softmax(inner, *args, **kwargs), perm, inv)
    if name == "sparse_attention":
      q, k, v = (take_nodes(a, perm, inv) for a in args)
      return take_nodes(sparse_attention(inner, q, k, v, **kwargs), inv, perm)
    raise NotImplementedError(f"ReorderedMatrix: no operator {name!r}")
