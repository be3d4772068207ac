"""Node orderings computed in C++ (csrc/cpu/reorder.cc) and the Reordering they give: the
permutation, its block statistics, and its explicit mode (node-indexed arrays, edge indices and
matrices moved into the reordered space and back)."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np

from jaxsparse_tc import _cpu
from jaxsparse_tc._src.reorder import inputs
from jaxsparse_tc._src.reorder.permute import take_nodes
from jaxsparse_tc._src.reorder.stats import BlockStats, stats
from jaxsparse_tc._src.sparse_matrix import SparseMatrix

if TYPE_CHECKING:
  from jaxsparse_tc._src.reorder.matrix import ReorderedMatrix

# affinity: community dendrogram, breadth-first inside communities, rows packed into windows by
# shared columns (Acc-SpMM's data-affinity reordering); rabbit: the dendrogram's depth-first
# order alone (Rabbit order); rcm: reverse Cuthill-McKee; degree: degree buckets, input order
# kept inside; identity: no change (for comparisons).
METHODS = ("affinity", "rabbit", "rcm", "degree", "identity")


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
    out = take_nodes(x, jnp.asarray(index, jnp.int32), jnp.asarray(inverse, jnp.int32))
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
  def wrap(self, A: SparseMatrix, *, format_options=None) -> ReorderedMatrix:
    """A, stored reordered (permute_matrix), behind the caller's node order: operators on the
    result take and return node-indexed arrays in A's order."""
    # matrix.py imports this module (ReorderedMatrix.from_coo reorders): imported here.
    from jaxsparse_tc._src.reorder.matrix import ReorderedMatrix

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
  seed = inputs.int_arg("seed", seed, low=0, none_ok=False)
  lookahead = inputs.int_arg("lookahead", lookahead, low=1, high=inputs.MAX_INT32)
  threads = inputs.int_arg("threads", threads, low=1)
  rows, cols, (n, _) = inputs.coo(A, num_nodes)
  t0 = time.perf_counter()
  out = _cpu.reorder(
    rows,
    cols,
    n,
    method,
    seed % (1 << 64),
    inputs.default_threads() if threads is None else min(threads, inputs.MAX_THREADS),
    0 if lookahead is None else lookahead,
  )
  seconds = time.perf_counter() - t0
  perm = np.asarray(out["perm"])
  inv = inputs.inverse(perm)
  return Reordering(
    perm=perm,
    inverse=inv,
    method=method,
    seed=seed,
    before=stats(rows, cols, n, n),
    after=stats(rows, cols, n, n, inv, inv),
    before_t=stats(cols, rows, n, n),
    after_t=stats(cols, rows, n, n, inv, inv),
    seconds=seconds,
    phases={k: float(out[k]) for k in ("graph_s", "order_s", "pack_s")},
    groups=int(out["groups"]),
  )
