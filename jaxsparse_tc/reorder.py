"""Locality reordering of a graph's nodes for the window format (docs/REORDER.md).

The tensor-core path pays where the 8 rows of a window share columns: a window's condensed
columns are the union of its rows' columns, cut into 8x8 blocks. `reorder` computes a node
permutation (in C++, csrc/cpu/reorder.cc) that puts rows sharing columns into the same window,
and the block statistics before and after. Two ways to use it:

* Explicit: permute the matrix and the node features once, run the whole model in the reordered
  space, map the outputs back at the end::

      r = jst.reorder(A, "affinity")             # A: SparseMatrix, scipy matrix or edge_index
      B = r.permute_matrix(A)                    # P A P^T, a plain SparseMatrix
      y = r.restore(model(B, r.permute(x)))      # outputs back in the caller's node order

* Transparent: `r.wrap(A)` (or `ReorderedMatrix.from_coo(...)`) is a matrix stored reordered
  whose operators (`@`, jst.spmm, sddmm, edge_softmax, sparse_attention) take and return the
  caller's node order; it permutes dense operands in and out (two gathers of [n, d] per SpMM).

Conventions: `perm[new] = old` (`x_new = x[perm]`, `B = A[perm][:, perm]`) and
`inverse[old] = new` (`y = y_new[inverse]`, new edge ids `inverse[edge_index]`).
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxsparse_tc import _cpu
from jaxsparse_tc.sparse_matrix import SparseMatrix

__all__ = ["reorder", "Reordering", "ReorderedMatrix", "BlockStats", "block_stats", "METHODS"]

# affinity: community dendrogram, breadth-first inside communities, rows packed into windows by
# shared columns (Acc-SpMM's data-affinity reordering); rabbit: the dendrogram's depth-first
# order alone (Rabbit order); rcm: reverse Cuthill-McKee; degree: degree buckets, input order
# kept inside; identity: no change (for comparisons).
METHODS = ("affinity", "rabbit", "rcm", "degree", "identity")


# -- block statistics ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BlockStats:
  """Window/block statistics of a pattern in the format (docs/FORMAT.md): `windows` row windows
  of 8 rows (`nonempty_windows` with a nonzero), `condensed_cols` distinct columns summed over
  windows, `blocks` 8x8 blocks, `nnz` distinct entries, and `block_nnz_hist[k]` the number of
  blocks holding k nonzeros (k = 1..64)."""

  windows: int
  nonempty_windows: int
  condensed_cols: int
  blocks: int
  nnz: int
  block_nnz_hist: np.ndarray

  @property
  def nnz_per_block(self) -> float:
    """Mean nonzeros per 8x8 block (Acc-SpMM's MeanNNZTC): at most 64."""
    return self.nnz / self.blocks if self.blocks else 0.0

  @property
  def cols_per_window(self) -> float:
    """Mean distinct columns per row window (over all windows)."""
    return self.condensed_cols / self.windows if self.windows else 0.0

  @property
  def fill(self) -> float:
    """nnz / (64 blocks): the fraction of the blocks' cells that hold a nonzero."""
    return self.nnz / (64 * self.blocks) if self.blocks else 0.0

  def block_nnz_quantiles(self, q=(0.1, 0.5, 0.9)) -> tuple:
    """Quantiles of the nonzeros per block (over blocks)."""
    cum = np.cumsum(self.block_nnz_hist)
    if cum[-1] == 0:
      return tuple(0 for _ in q)
    return tuple(int(np.searchsorted(cum, x * cum[-1], side="left")) for x in q)

  def __str__(self) -> str:
    q10, q50, q90 = self.block_nnz_quantiles()
    return (
      f"{self.nnz_per_block:.2f} nnz/block (p10/p50/p90 {q10}/{q50}/{q90}), "
      f"{self.cols_per_window:.1f} cols/window, fill {self.fill:.3f}, {self.blocks} blocks"
    )


def _stats(rows, cols, m: int, n: int, row_new=None, col_new=None) -> BlockStats:
  d = _cpu.block_stats(rows, cols, m, n, row_new, col_new, _threads())
  return BlockStats(
    int(d["windows"]),
    int(d["nonempty_windows"]),
    int(d["condensed_cols"]),
    int(d["blocks"]),
    int(d["nnz"]),
    np.asarray(d["block_nnz_hist"]),
  )


def block_stats(A, perm=None, *, num_nodes: int | None = None) -> BlockStats:
  """The block statistics of A's pattern (a SparseMatrix, scipy matrix, edge_index or
  (rows, cols) pair, as `reorder` takes), or of P A P^T for a permutation `perm[new] = old`."""
  rows, cols, (m, n) = _coo(A, num_nodes)
  if perm is None:
    return _stats(rows, cols, m, n)
  inv = _inverse(_check_perm(perm, n))
  return _stats(rows, cols, m, n, inv, inv)


# -- input handling --------------------------------------------------------------------------
def _threads() -> int:
  return max(1, min(_MAX_THREADS, os.cpu_count() or 1))


# The C++ reordering splits its work over at most two threads (csrc/cpu/reorder.cc).
_MAX_THREADS = 2
_MAX_INT32 = 2**31 - 1


def _int_arg(name: str, v, *, low: int, high: int | None = None, none_ok: bool = True):
  """A Python/numpy integer argument in [low, high], or None where allowed; ValueError else."""
  if v is None and none_ok:
    return None
  if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
    raise ValueError(f"{name} must be an integer; got {v!r} ({type(v).__name__})")
  if v < low or (high is not None and v > high):
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ValueError(f"{name} must be an integer {bound}; got {v}")
  return int(v)


def _int_array(name: str, a) -> np.ndarray:
  a = np.asarray(a)
  if a.ndim != 1:
    raise ValueError(f"{name} must be one-dimensional; got shape {a.shape}")
  if a.size and not np.issubdtype(a.dtype, np.integer):
    raise ValueError(f"{name} must hold integers; got dtype {a.dtype}")
  return np.ascontiguousarray(a, dtype=np.int64)


def _coo(A, num_nodes):
  """(rows, cols, shape) of a square pattern: int64 numpy arrays."""
  num_nodes = _int_arg("num_nodes", num_nodes, low=0)
  if num_nodes is not None and (isinstance(A, SparseMatrix) or hasattr(A, "tocoo")):
    shape = A.shape
    if tuple(shape) != (num_nodes, num_nodes):
      raise ValueError(
        f"num_nodes={num_nodes} does not match the matrix's shape {tuple(shape)} (num_nodes "
        "is for an edge_index or a (rows, cols) pair; leave it out for a matrix)"
      )
  if isinstance(A, SparseMatrix):
    rows, cols, shape = np.asarray(A.rows), np.asarray(A.cols), A.shape
  elif hasattr(A, "tocoo"):  # scipy.sparse
    coo = A.tocoo()
    rows, cols, shape = coo.row, coo.col, coo.shape
  elif isinstance(A, tuple) and len(A) == 2:
    rows, cols, shape = A[0], A[1], None
  else:
    ei = np.asarray(A)
    if ei.ndim != 2 or ei.shape[0] != 2:
      raise TypeError(
        "reorder takes a SparseMatrix, a scipy.sparse matrix, an edge_index "
        f"[2, E] or a (rows, cols) pair; got {type(A).__name__} with shape "
        f"{getattr(ei, 'shape', None)}"
      )
    if ei.size and ei.dtype.kind not in "iu":
      raise ValueError(f"edge_index must have an integer dtype (node ids); got {ei.dtype}")
    rows, cols, shape = ei[1], ei[0], None  # message passing: rows = targets (PyG's flow)
  rows, cols = _int_array("rows", rows), _int_array("cols", cols)
  if rows.size != cols.size:
    raise ValueError(f"rows and cols differ in length: {rows.size} and {cols.size}")
  if shape is None:
    hi = int(max(rows.max(), cols.max())) + 1 if rows.size else 0
    shape = (hi, hi) if num_nodes is None else (num_nodes, num_nodes)
  shape = tuple(int(s) for s in shape)
  if shape[0] != shape[1]:
    raise ValueError(
      f"reordering permutes the nodes of a graph: the matrix must be square; got shape {shape}"
    )
  if rows.size:
    lo = min(int(rows.min()), int(cols.min()))
    hi = max(int(rows.max()), int(cols.max()))
    if lo < 0 or hi >= shape[0]:
      raise ValueError(f"node index out of range [0, {shape[0]}): min {lo}, max {hi}")
  return rows, cols, shape


def _check_perm(perm, n: int) -> np.ndarray:
  """A user's permutation of n nodes (perm[new] = old): its length, range and duplicates."""
  p = _int_array("perm", perm)
  if p.size != n:
    raise ValueError(f"perm must have one entry per node, {n}; got {p.size}")
  if n == 0:
    return p
  lo, hi = int(p.min()), int(p.max())
  if lo < 0 or hi >= n:
    raise ValueError(f"perm must hold node ids in [0, {n}); got ids in [{lo}, {hi}]")
  counts = np.bincount(p, minlength=n)
  if np.any(counts != 1):
    twice = np.nonzero(counts > 1)[0]
    raise ValueError(
      f"perm must be a permutation of 0..{n - 1}: {twice.size} ids occur more than once "
      f"(first: {int(twice[0])}) and {int(np.sum(counts == 0))} never"
    )
  return p


def _inverse(perm: np.ndarray) -> np.ndarray:
  inv = np.empty_like(perm)
  inv[perm] = np.arange(perm.size, dtype=perm.dtype)
  return inv


# -- the permutation -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Reordering:
  """A node permutation and what it does to the format. `perm[new] = old`, `inverse[old] =
  new` (int64 numpy). `before`/`after`: BlockStats of A (rows = targets for an edge_index),
  `before_t`/`after_t` of A^T (the backward's orientation). `seconds`: the C++ call's wall
  time; `phases`: its parts (graph, order, pack seconds); `groups`: top-level communities
  (affinity, rabbit) or connected components (rcm)."""

  perm: np.ndarray
  inverse: np.ndarray
  method: str
  seed: int
  before: BlockStats
  after: BlockStats
  before_t: BlockStats
  after_t: BlockStats
  seconds: float
  phases: dict
  groups: int

  @property
  def num_nodes(self) -> int:
    return self.perm.size

  def __repr__(self) -> str:
    return (
      f"Reordering({self.method!r}, seed={self.seed}, nodes={self.num_nodes}, "
      f"{self.seconds:.3f} s: nnz/block {self.before.nnz_per_block:.2f} -> "
      f"{self.after.nnz_per_block:.2f}, cols/window {self.before.cols_per_window:.1f} -> "
      f"{self.after.cols_per_window:.1f}, fill {self.before.fill:.3f} -> "
      f"{self.after.fill:.3f})"
    )

  # -- explicit mode: node-indexed arrays ---------------------------------------------------
  def _take(self, x, index, inverse, axis):
    if isinstance(x, np.ndarray):
      if x.ndim == 0 or not -x.ndim <= axis < x.ndim or x.shape[axis] != self.num_nodes:
        raise ValueError(f"axis {axis} of x (shape {x.shape}) must have the {self.num_nodes} nodes")
      return np.take(x, index, axis=axis)
    # jax (traced too): the permutation primitive, whose gradient is a gather, not a scatter.
    x = jnp.asarray(x)
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim or x.shape[axis] != self.num_nodes:
      raise ValueError(f"axis {axis} of x (shape {x.shape}) must have the {self.num_nodes} nodes")
    flat = x.ndim == 1
    x = jnp.moveaxis(x[:, None] if flat else x, axis, -2)
    out = _take_nodes(x, jnp.asarray(index, jnp.int32), jnp.asarray(inverse, jnp.int32))
    out = jnp.moveaxis(out, -2, axis)
    return out[:, 0] if flat else out

  def permute(self, x, axis: int = 0):
    """Node-indexed x (features, labels; numpy or jax, traced too) into the reordered order:
    `x[perm]` along `axis`."""
    return self._take(x, self.perm, self.inverse, axis)

  def restore(self, y, axis: int = 0):
    """Node-indexed y of the reordered space back to the caller's order: `y[inverse]`."""
    return self._take(y, self.inverse, self.perm, axis)

  def permute_index(self, idx):
    """Node ids (e.g. train/val/test indices, numpy) to their new ids: `inverse[idx]`."""
    idx = np.asarray(idx)
    if idx.size and idx.dtype.kind not in "iu":
      raise ValueError(f"node ids must have an integer dtype; got {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= self.num_nodes):
      raise ValueError(
        f"node ids must be in [0, {self.num_nodes}) (this reordering's nodes); got ids in "
        f"[{idx.min()}, {idx.max()}]"
      )
    return self.inverse[idx.astype(np.int64)].astype(idx.dtype, copy=False)

  def permute_edge_index(self, edge_index):
    """An edge_index [2, E] with node ids renamed: `inverse[edge_index]` (edge order kept)."""
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2:
      raise ValueError(f"edge_index must have shape [2, E]; got {ei.shape}")
    return self.permute_index(ei)

  def permute_matrix(self, A: SparseMatrix, *, format_options=None) -> SparseMatrix:
    """P A P^T as a plain SparseMatrix in the reordered space: entry (i, j) of A is entry
    (inverse[i], inverse[j]). Values are carried (and may be traced); `input_to_format` still
    maps A's constructor input, so `values_from_input` takes the same arrays as A's. (A
    ReorderedMatrix is read in its caller's order.)"""
    if not isinstance(A, SparseMatrix):
      raise TypeError(f"permute_matrix takes a SparseMatrix; got {type(A).__name__}")
    if A.shape != (self.num_nodes, self.num_nodes):
      raise ValueError(f"this reordering is of {self.num_nodes} nodes; A has shape {A.shape}")
    inv = self.inverse
    rows, cols = np.asarray(A.rows, np.int64), np.asarray(A.cols, np.int64)
    # One entry per format position of A: B's input_to_format is a bijection onto B's order.
    B = SparseMatrix.from_coo(
      inv[rows], inv[cols], None, shape=A.shape, format_options=format_options
    )
    to_b = np.asarray(B.input_to_format)
    src = np.empty_like(to_b)
    src[to_b] = np.arange(to_b.size, dtype=to_b.dtype)  # B position -> A position
    values = jnp.asarray(A.values)[..., jnp.asarray(src)]
    in_to_b = jnp.asarray(to_b)[A.input_to_format]
    return SparseMatrix._unchecked(
      values, B.pattern, B.pattern_t, B.perm_t, B.perm_t_inv, in_to_b, B.shape, B.grouped
    )

  def permute_dataset(self, ds):
    """A GraphDataset (jaxsparse_tc.datasets) in the reordered space: features and labels
    permuted, split indices and edge_index renamed, adjacency permuted."""
    import scipy.sparse as sp

    fields = {f.name for f in dataclasses.fields(ds)}
    out = {}
    for name in fields:
      v = getattr(ds, name)
      if name in ("features", "labels"):
        v = self.permute(np.asarray(v))
      elif name.endswith("_idx"):
        v = self.permute_index(v)
      elif name == "edge_index":
        v = self.permute_edge_index(v)
      elif name == "adjacency" and v is not None:
        v = sp.csr_matrix(v)[self.perm][:, self.perm]
      out[name] = v
    return dataclasses.replace(ds, **out)

  # -- transparent mode ---------------------------------------------------------------------
  def wrap(self, A: SparseMatrix, *, format_options=None) -> "ReorderedMatrix":
    """A, stored reordered (permute_matrix), behind the caller's node order: operators on the
    result take and return node-indexed arrays in A's order."""
    B = self.permute_matrix(A, format_options=format_options)
    return ReorderedMatrix._of(
      B, jnp.asarray(self.perm, jnp.int32), jnp.asarray(self.inverse, jnp.int32)
    )


def reorder(
  A,
  method: str = "affinity",
  *,
  seed: int = 0,
  num_nodes: int | None = None,
  lookahead: int | None = None,
  threads: int | None = None,
) -> Reordering:
  """A node permutation of the square pattern A that packs rows sharing columns into the same
  8-row windows, with the block statistics before and after.

  A: a SparseMatrix, a scipy.sparse matrix, an edge_index [2, E] (rows = targets, as
  message_passing_matrix builds; `num_nodes` defaults to max id + 1) or a (rows, cols) pair.
  The graph is symmetrized first (A and A^T get the same order). method: one of METHODS
  ("affinity" is the community + data-affinity ordering; "rcm" and "degree" are cheap).
  Deterministic for a seed (ties are broken by a seeded hash), whatever `threads` (a positive
  integer; the reordering uses at most 2, the default, and takes larger counts as 2).
  `lookahead` (affinity): how many unplaced rows a window's rows are chosen from (default 256;
  more is slower and packs somewhat tighter; at most 2^31 - 1).
  """
  if not isinstance(method, str) or method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}; got {method!r}")
  seed = _int_arg("seed", seed, low=0, none_ok=False)
  lookahead = _int_arg("lookahead", lookahead, low=1, high=_MAX_INT32)
  threads = _int_arg("threads", threads, low=1)
  rows, cols, (n, _) = _coo(A, num_nodes)
  t0 = time.perf_counter()
  out = _cpu.reorder(
    rows,
    cols,
    n,
    method,
    seed % (1 << 64),
    _threads() if threads is None else min(threads, _MAX_THREADS),
    0 if lookahead is None else lookahead,
  )
  seconds = time.perf_counter() - t0
  perm = np.asarray(out["perm"])
  inv = _inverse(perm)
  return Reordering(
    perm=perm,
    inverse=inv,
    method=method,
    seed=seed,
    before=_stats(rows, cols, n, n),
    after=_stats(rows, cols, n, n, inv, inv),
    before_t=_stats(cols, rows, n, n),
    after_t=_stats(cols, rows, n, n, inv, inv),
    seconds=seconds,
    phases={k: float(out[k]) for k in ("graph_s", "order_s", "pack_s")},
    groups=int(out["groups"]),
  )


# -- transparent mode ------------------------------------------------------------------------
# Moving a dense operand between node orders is a gather by a permutation. Its tangent is the
# same gather and its transpose the gather by the inverse permutation, not the scatter-add that
# jnp.take's transpose would be (serial on CPU, atomics on GPU): a small primitive says so, for
# jvp, grad and vmap alike. Operands: x [..., n, d], index [n], inverse [n] (int32).
permute_rows_p = Primitive("jaxsparse_tc_permute_rows")


def _permute_rows_impl(x, index, inverse):
  del inverse
  return jnp.take(x, index, axis=-2, mode="clip")  # a permutation: always in bounds


def _permute_rows_jvp(primals, tangents):
  x, index, inverse = primals
  out = permute_rows_p.bind(x, index, inverse)
  if type(tangents[0]) is ad.Zero:
    return out, ad.Zero(jax.typeof(out).to_tangent_aval())
  return out, permute_rows_p.bind(tangents[0], index, inverse)


def _permute_rows_transpose(ct, x, index, inverse):
  if type(ct) is ad.Zero:
    return [None, None, None]
  return [permute_rows_p.bind(ct, inverse, index), None, None]


def _permute_rows_batch(args, dims):
  x, index, inverse = args
  if dims[1] is not None or dims[2] is not None:
    raise NotImplementedError("jaxsparse_tc: vmap over a node permutation is not supported")
  return permute_rows_p.bind(jnp.moveaxis(x, dims[0], 0), index, inverse), 0


permute_rows_p.def_impl(_permute_rows_impl)
permute_rows_p.def_abstract_eval(lambda x, index, inverse: x.update(shape=x.shape, dtype=x.dtype))
mlir.register_lowering(permute_rows_p, mlir.lower_fun(_permute_rows_impl, multiple_results=False))
ad.primitive_jvps[permute_rows_p] = _permute_rows_jvp
ad.primitive_transposes[permute_rows_p] = _permute_rows_transpose
batching.primitive_batchers[permute_rows_p] = _permute_rows_batch


def _take_nodes(x, index, inverse):
  """x[..., index, :] for a dense [n, d] or [H, n, d] operand and a node permutation `index`
  (`inverse` its inverse)."""
  x = jnp.asarray(x)
  if x.ndim < 2:
    raise ValueError(f"expected a dense operand [n, d] or [H, n, d]; got shape {x.shape}")
  return permute_rows_p.bind(x, index, inverse)


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
    rows, cols = _int_array("rows", rows), _int_array("cols", cols)
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
      return _take_nodes(spmm(inner, _take_nodes(x, perm, inv), **kwargs), inv, perm)
    if name == "sddmm":
      x, y = args
      out = sddmm(inner, _take_nodes(x, perm, inv), _take_nodes(y, perm, inv), **kwargs)
      return ReorderedMatrix._of(out, perm, inv)
    if name == "edge_softmax":
      return ReorderedMatrix._of(edge_softmax(inner, *args, **kwargs), perm, inv)
    if name == "sparse_attention":
      q, k, v = (_take_nodes(a, perm, inv) for a in args)
      return _take_nodes(sparse_attention(inner, q, k, v, **kwargs), inv, perm)
    raise NotImplementedError(f"ReorderedMatrix: no operator {name!r}")
