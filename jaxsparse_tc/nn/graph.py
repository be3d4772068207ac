"""Graph helpers: self-loops, GCN normalization, message-passing matrices from edge lists.

Conventions (those of PyTorch Geometric): an `edge_index` is an integer array [2, E]; a message
flows from the source `edge_index[0, e]` to the target `edge_index[1, e]`. Layers aggregate at
targets with one SpMM, so the *message-passing matrix* has rows = targets, columns = sources:
`M[edge_index[1, e], edge_index[0, e]]`. That is the transpose of
`SparseMatrix.from_edge_index(edge_index)`; this module builds it directly.

Patterns are built once on the host (numpy); nothing here is traced. `normalize_symmetric`
recomputes GCN values from traced values (a learned edge weight) on a fixed pattern.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc.sparse_matrix import SparseMatrix


def _edge_index(edge_index) -> np.ndarray:
  ei = np.asarray(edge_index)
  if ei.ndim != 2 or ei.shape[0] != 2:
    raise ValueError(f"edge_index must have shape [2, E]; got {ei.shape}")
  if ei.size and not np.issubdtype(ei.dtype, np.integer):
    raise ValueError(f"edge_index must hold integers; got dtype {ei.dtype}")
  return ei.astype(np.int64, copy=False)


def _num_nodes(ei: np.ndarray, num_nodes: int | None) -> int:
  if num_nodes is not None:
    return int(num_nodes)
  return int(ei.max()) + 1 if ei.size else 0


def _edge_values(edge_weight, count: int) -> np.ndarray:
  if edge_weight is None:
    return np.ones(count, np.float32)
  w = np.asarray(edge_weight, np.float32)
  if w.shape != (count,):
    raise ValueError(f"edge_weight must have shape [{count}]; got {w.shape}")
  return w


def remove_self_loops(edge_index, edge_weight=None):
  """Drops edges i -> i. Returns (edge_index, edge_weight) (edge_weight None if given None)."""
  ei = _edge_index(edge_index)
  keep = ei[0] != ei[1]
  return ei[:, keep], None if edge_weight is None else np.asarray(edge_weight)[keep]


def add_self_loops(edge_index, edge_weight=None, *, num_nodes: int | None = None,
                   fill_value: float = 1.0):
  """Removes existing self-loops, then appends one loop i -> i per node (weight `fill_value`).

  PyG's `remove_self_loops` + `add_self_loops` (what GATConv and AGNNConv do). Returns
  (edge_index [2, E'], edge_weight [E'] or None when no weights were given).
  """
  ei = _edge_index(edge_index)
  n = _num_nodes(ei, num_nodes)
  ei, w = remove_self_loops(ei, edge_weight)
  loops = np.arange(n, dtype=np.int64)
  ei = np.concatenate([ei, np.stack([loops, loops])], axis=1)
  if w is not None:
    w = np.concatenate([np.asarray(w, np.float32), np.full(n, fill_value, np.float32)])
  return ei, w


def add_remaining_self_loops(edge_index, edge_weight=None, *, num_nodes: int | None = None,
                             fill_value: float = 1.0):
  """Adds a loop i -> i to every node that has none; existing loops keep their weight.

  PyG's `add_remaining_self_loops` (what GCNConv does). Returns (edge_index, edge_weight), the
  weights all ones when none were given.
  """
  ei = _edge_index(edge_index)
  n = _num_nodes(ei, num_nodes)
  w = _edge_values(edge_weight, ei.shape[1])
  is_loop = ei[0] == ei[1]
  has_loop = np.zeros(n, bool)
  has_loop[ei[0, is_loop]] = True
  missing = np.nonzero(~has_loop)[0]
  ei = np.concatenate([ei, np.stack([missing, missing])], axis=1)
  w = np.concatenate([w, np.full(missing.size, fill_value, np.float32)])
  return ei, w


def message_passing_matrix(edge_index, num_nodes: int | None = None, edge_weight=None, *,
                           self_loops: bool = False) -> SparseMatrix:
  """The aggregation matrix M [n, n]: M[target, source] = edge weight (default 1).

  `M @ X` sums, at each target, the features of its sources (PyG's `aggr="add"` over
  `edge_index`). With `self_loops=True`, existing loops are replaced by one loop per node
  (PyG's remove_self_loops + add_self_loops: the graph GATConv, AGNNConv attend over).
  Duplicate edges are merged (their weights add up).
  """
  ei = _edge_index(edge_index)
  n = _num_nodes(ei, num_nodes)
  w = None if edge_weight is None else _edge_values(edge_weight, ei.shape[1])
  if self_loops:
    ei, w = add_self_loops(ei, w, num_nodes=n)
  w = _edge_values(w, ei.shape[1])
  return SparseMatrix.from_coo(ei[1], ei[0], w, shape=(n, n))


def gcn_norm(edge_index, num_nodes: int | None = None, edge_weight=None, *,
             add_self_loops: bool = True) -> SparseMatrix:
  """GCN's propagation matrix D^-1/2 (A + I) D^-1/2, rows = targets (PyG's `gcn_norm`).

  A[target, source] = edge weight; self-loops are added where missing (weight 1); D is the
  diagonal of (A + I)'s row sums (in-degrees at targets, weighted). Entries of nodes with
  degree 0 are 0. The result is what `GCNConv` layers multiply by.
  """
  ei = _edge_index(edge_index)
  n = _num_nodes(ei, num_nodes)
  if add_self_loops:
    ei, w = add_remaining_self_loops(ei, edge_weight, num_nodes=n)
  else:
    w = _edge_values(edge_weight, ei.shape[1])
  src, dst = ei
  deg = np.bincount(dst, weights=w.astype(np.float64), minlength=n)
  with np.errstate(divide="ignore"):
    dinv = np.where(deg > 0, deg ** -0.5, 0.0)
  values = (dinv[dst] * w * dinv[src]).astype(np.float32)
  return SparseMatrix.from_coo(dst, src, values, shape=(n, n))


def normalize_symmetric(A: SparseMatrix, values=None) -> SparseMatrix:
  """D^-1/2 A D^-1/2 on A's pattern, traceable (D = row sums of A; 0 where a row sums to 0).

  For learned or changing edge weights on a fixed pattern: `values` (format order, default
  A.values) may be traced. The pattern must already hold the self-loops GCN needs (build it
  with `message_passing_matrix(..., self_loops=True)`).
  """
  if A.shape[0] != A.shape[1]:
    raise ValueError(f"normalize_symmetric needs a square matrix; got shape {A.shape}")
  v = A.values if values is None else jnp.asarray(values)
  if v.shape != (A.nnz,):
    raise ValueError(f"normalize_symmetric needs values of shape [{A.nnz}]; got {v.shape}")
  deg = jax.ops.segment_sum(v, A.rows, num_segments=A.shape[0])
  dinv = jnp.where(deg > 0, jax.lax.rsqrt(jnp.where(deg > 0, deg, 1.0)), 0.0)
  return A.with_values(dinv[A.rows] * v * dinv[A.cols])
