"""The implementation of jaxsparse_tc.nn.graph, whose docstring documents it."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxsparse_tc._src import integrity
from jaxsparse_tc._src.sparse_matrix import SparseMatrix

Flow = Literal["source_to_target", "target_to_source"]


def _concrete(name: str, a, fix: str) -> np.ndarray:
  if isinstance(a, jax.core.Tracer):
    raise TypeError(
      f"{name} is traced (inside jax.jit, grad or vmap), but a sparsity pattern "
      f"is built on the host from concrete indices. {fix}"
    )
  return np.asarray(a)


_EI_FIX = (
  "Close over the numpy edge_index (or pass it as a static argument), or build the "
  "matrix once outside the traced function; traced edge weights are fine."
)


def _edge_index(edge_index) -> np.ndarray:
  if isinstance(edge_index, SparseMatrix):
    raise TypeError(
      "expected an edge_index array [2, E]; got a SparseMatrix (it already is a "
      "message-passing matrix)"
    )
  ei = _concrete("edge_index", edge_index, _EI_FIX)
  if ei.ndim != 2 or ei.shape[0] != 2:
    raise ValueError(f"edge_index must have shape [2, E]; got {ei.shape}")
  if ei.size and not np.issubdtype(ei.dtype, np.integer):
    raise ValueError(f"edge_index must hold integers; got dtype {ei.dtype}")
  if ei.size and ei.min() < 0:
    raise ValueError(f"edge_index holds a negative node id ({int(ei.min())})")
  return ei.astype(np.int64, copy=False)


def _count(name: str, v) -> int:
  """A non-negative integer argument (num_nodes); ValueError naming it otherwise."""
  if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
    raise ValueError(f"{name} must be a non-negative integer; got {v!r}")
  return int(v)


def _num_nodes(ei: np.ndarray, num_nodes: int | None) -> int:
  """num_nodes (default: the largest id + 1), checked against edge_index's ids (which ops such
  as to_undirected's key packing would otherwise mix up silently)."""
  hi = int(ei.max()) + 1 if ei.size else 0
  if num_nodes is None:
    return hi
  n = _count("num_nodes", num_nodes)
  if hi > n:
    raise ValueError(f"edge_index holds node id {hi - 1}, outside [0, num_nodes={n})")
  return n


def _edge_rows(name: str, a, count: int) -> np.ndarray:
  """A per-edge host array [count, ...] (edge_attr, edge_weight of a host operation)."""
  a = np.asarray(a)
  if a.ndim < 1 or a.shape[0] != count:
    raise ValueError(f"{name} must have {count} rows (one per edge); got shape {a.shape}")
  return a


def _flow(flow: str) -> bool:
  """True for source_to_target (rows = targets)."""
  if flow not in ("source_to_target", "target_to_source"):
    raise ValueError(
      f"flow must be 'source_to_target' (PyG's default: rows = targets) or "
      f"'target_to_source'; got {flow!r}"
    )
  return flow == "source_to_target"


def _weights(edge_weight, count: int):
  """Edge weights as float32 [count]: numpy when concrete, a jax array when traced."""
  if edge_weight is None:
    return np.ones(count, np.float32)
  if isinstance(edge_weight, jax.core.Tracer) or isinstance(edge_weight, jax.Array):
    w = jnp.asarray(edge_weight)
  else:
    w = np.asarray(edge_weight, np.float32)
  if w.shape != (count,):
    raise ValueError(f"edge_weight must have shape [{count}] (one weight per edge); got {w.shape}")
  return w


def _self_loops_arg(add_self_loops, self_loops):
  if self_loops is not None:  # the earlier keyword, kept as an alias
    if add_self_loops is not None and bool(add_self_loops) != bool(self_loops):
      raise TypeError("pass add_self_loops= (self_loops= is its older alias), not both")
    return bool(self_loops)
  return bool(add_self_loops)


def remove_self_loops(edge_index, edge_weight=None):
  """Drops edges i -> i. Returns (edge_index, edge_weight) (edge_weight None if given None)."""
  ei = _edge_index(edge_index)
  keep = ei[0] != ei[1]
  w = None if edge_weight is None else _edge_rows("edge_weight", edge_weight, ei.shape[1])[keep]
  return ei[:, keep], w


def add_self_loops(
  edge_index, edge_weight=None, *, num_nodes: int | None = None, fill_value: float = 1.0
):
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


def add_remaining_self_loops(
  edge_index, edge_weight=None, *, num_nodes: int | None = None, fill_value: float = 1.0
):
  """Adds a loop i -> i to every node that has none; existing loops keep their weight.

  PyG's `add_remaining_self_loops` (what GCNConv does). Returns (edge_index, edge_weight), the
  weights all ones when none were given. The original edges come first, in order.
  """
  ei = _edge_index(edge_index)
  n = _num_nodes(ei, num_nodes)
  w = _weights(edge_weight, ei.shape[1])
  missing = _missing_loops(ei, n)
  ei = np.concatenate([ei, np.stack([missing, missing])], axis=1)
  xp = jnp if isinstance(w, jax.Array) else np
  w = xp.concatenate([w, xp.full(missing.size, fill_value, w.dtype)])
  return ei, w


def _missing_loops(ei: np.ndarray, n: int) -> np.ndarray:
  has_loop = np.zeros(n, bool)
  has_loop[ei[0, ei[0] == ei[1]]] = True
  return np.nonzero(~has_loop)[0]


def message_passing_matrix(
  edge_index,
  num_nodes: int | None = None,
  edge_weight=None,
  *,
  add_self_loops: bool | None = None,
  flow: Flow = "source_to_target",
  self_loops: bool | None = None,
) -> SparseMatrix:
  """The aggregation matrix M [n, n]: M[target, source] = edge weight (default 1).

  `M @ X` sums, at each target, the features of its sources (PyG's `aggr="add"` over
  `edge_index`, flow source_to_target; `flow="target_to_source"` gives M^T). With
  `add_self_loops=True` (`self_loops=` is the same keyword's older name) every node gets one
  loop of weight 1 and an existing loop's weight is dropped (PyG's remove_self_loops +
  add_self_loops: the graph GATConv, AGNNConv attend over). Duplicate edges are merged
  (their weights add up).

  Input order (`M.values_from_input`, `edge_features`): the E edges as given (a dropped loop
  included, contributing 0), then the n added loops. `edge_weight` may be traced.
  """
  ei = _edge_index(edge_index)
  n = _num_nodes(ei, num_nodes)
  w = _weights(edge_weight, ei.shape[1])
  src, dst = ei
  if _self_loops_arg(add_self_loops, self_loops):
    loops = np.arange(n, dtype=np.int64)
    src, dst = np.concatenate([src, loops]), np.concatenate([dst, loops])
    xp = jnp if isinstance(w, jax.Array) else np
    w = xp.concatenate([xp.where(ei[0] == ei[1], 0, w), xp.ones(n, w.dtype)])
  rows, cols = (dst, src) if _flow(flow) else (src, dst)
  return _matrix(rows, cols, w, n)


def _matrix(rows, cols, w, n) -> SparseMatrix:
  if isinstance(w, jax.Array):  # traced (or device) weights: the pattern, then the values
    A = SparseMatrix.from_coo(rows, cols, None, shape=(n, n))
    return A.with_values(A.values_from_input(w.astype(jnp.float32)))
  return SparseMatrix.from_coo(rows, cols, w, shape=(n, n))


def gcn_norm(
  edge_index,
  num_nodes: int | None = None,
  edge_weight=None,
  *,
  add_self_loops: bool = True,
  flow: Flow = "source_to_target",
) -> SparseMatrix:
  """GCN's propagation matrix D^-1/2 (A + I) D^-1/2, rows = targets (PyG's `gcn_norm`).

  A[target, source] = edge weight; self-loops are added where missing (weight 1); D is the
  diagonal of (A + I)'s row sums (weighted in-degrees at targets). Entries of nodes with
  degree 0 are 0. The result is what `GCNConv` layers multiply by. `edge_weight` may be traced
  (jit, grad through the weights); `edge_index` must be concrete (the pattern is built on the
  host). Under jit with a traced edge_index, build the pattern outside
  (`message_passing_matrix(ei, n, add_self_loops=True)`) and call `normalize_symmetric`.
  """
  ei = _concrete(
    "edge_index",
    edge_index,
    "gcn_norm builds the pattern on the host: build it once outside with "
    "graph.message_passing_matrix(edge_index, n, add_self_loops=True) and "
    "normalise traced values with graph.normalize_symmetric(A, values).",
  )
  ei = _edge_index(ei)
  n = _num_nodes(ei, num_nodes)
  if add_self_loops:
    ei, w = add_remaining_self_loops(ei, edge_weight, num_nodes=n)
  else:
    w = _weights(edge_weight, ei.shape[1])
  src, dst = ei
  target = dst if _flow(flow) else src
  xp = jnp if isinstance(w, jax.Array) else np
  if xp is np:
    deg = np.bincount(target, weights=w.astype(np.float64), minlength=n)
    with np.errstate(divide="ignore"):
      dinv = np.where(deg > 0, deg**-0.5, 0.0)
    values = (dinv[dst] * w * dinv[src]).astype(np.float32)
  else:
    deg = jax.ops.segment_sum(w, target, num_segments=n)
    dinv = jnp.where(deg > 0, jax.lax.rsqrt(jnp.where(deg > 0, deg, 1.0)), 0.0)
    values = dinv[dst] * w * dinv[src]
  rows, cols = (dst, src) if _flow(flow) else (src, dst)
  return _matrix(rows, cols, values, n)


def normalize_symmetric(A: SparseMatrix, values=None) -> SparseMatrix:
  """D^-1/2 A D^-1/2 on A's pattern, traceable (D = row sums of A; 0 where a row sums to 0).

  For learned or changing edge weights on a fixed pattern, and for padded batches
  (`values` in format order, default A.values, may be traced). The pattern must already hold
  the self-loops GCN needs (`message_passing_matrix(..., add_self_loops=True)`, or a batch
  with `Budget(add_self_loops=True)`).
  """
  _require_matrix("normalize_symmetric", A)
  if A.shape[0] != A.shape[1]:
    raise ValueError(f"normalize_symmetric needs a square matrix; got shape {A.shape}")
  v = A.values if values is None else jnp.asarray(values)
  if v.shape != (A.nnz,):
    raise ValueError(f"normalize_symmetric needs values of shape [{A.nnz}]; got {v.shape}")
  deg = jax.ops.segment_sum(v, A.rows, num_segments=A.shape[0])
  dinv = jnp.where(deg > 0, jax.lax.rsqrt(jnp.where(deg > 0, deg, 1.0)), 0.0)
  return A.with_values(dinv[A.rows] * v * dinv[A.cols])


def _require_matrix(op: str, A) -> None:
  if not isinstance(A, SparseMatrix):
    raise TypeError(
      f"{op}: expected a SparseMatrix; got {type(A).__name__}. Build one with "
      "jaxsparse_tc.nn.graph.message_passing_matrix(edge_index, num_nodes)"
    )


def has_self_loops(A: SparseMatrix) -> bool | None:
  """Whether every row of A that holds an entry holds its diagonal one (its self-loop), and
  some row does; None where A's pattern is traced (it cannot be read at trace time)."""
  _require_matrix("has_self_loops", A)
  if isinstance(A.rows, jax.core.Tracer):
    return None
  rows, cols = np.asarray(A.rows), np.asarray(A.cols)
  if rows.size == 0:
    return False
  return bool(np.array_equal(np.unique(rows), np.unique(rows[rows == cols])))


def edge_features(A: SparseMatrix, edge_attr, *, loop_fill: str | float | None = None):
  """Input-order edge features [E, ...] on A's pattern, in format order [nnz, ...].

  `edge_attr` row k belongs to input entry k of A (the edge_index A was built from: for
  `message_passing_matrix(ei, n, add_self_loops=True)` the E original edges come first; for a
  GraphBatch, its edge slots); E may be less than A's input count (loops added after the
  edges). Entries at the same position (duplicate edges) add up. `loop_fill` handles self-loop
  positions as PyG's GATConv does: None keeps what the input puts there; "mean" drops input
  loops and fills each loop with the mean of the target's incoming edges' features (0 without
  any); a number fills loops with it. Traceable in edge_attr.
  """
  attr, pos = _input_edges("edge_features", A, edge_attr)
  out_shape = (A.nnz,) + attr.shape[1:]
  if loop_fill is None:
    return jnp.zeros(out_shape, attr.dtype).at[pos].add(attr)
  is_loop = A.rows == A.cols  # format order
  kept, fill = _loop_fill(A, attr, pos, loop_fill)
  out = jnp.zeros(out_shape, attr.dtype).at[pos].add(kept)
  return jnp.where(is_loop.reshape((-1,) + (1,) * (attr.ndim - 1)), fill[A.rows], out)


def loop_features(A: SparseMatrix, edge_attr, loop_fill: str | float):
  """Each row's self-loop features [A.shape[0], ...] as `edge_features` fills loop positions
  (`loop_fill` "mean" or a number), for loops that lie outside A's pattern (the attention
  layers on a sampled Block: target i's loop is source i). edge_attr as edge_features takes it.
  """
  attr, pos = _input_edges("loop_features", A, edge_attr)
  return _loop_fill(A, attr, pos, loop_fill)[1]


def _input_edges(op: str, A: SparseMatrix, edge_attr):
  """(edge_attr as an array [E, ...], the format positions of A's first E input entries)."""
  _require_matrix(op, A)
  attr = jnp.asarray(edge_attr)
  total = A.input_to_format.shape[0]
  if attr.ndim < 1 or attr.shape[0] > total:
    raise ValueError(
      f"edge_attr must have shape [E, ...] with E <= {total} (A's input entries); got {attr.shape}"
    )
  return attr, A.input_to_format[: attr.shape[0]]


def _loop_fill(A: SparseMatrix, attr, pos, loop_fill):
  """(attr with input loops zeroed, each row's loop features [A.shape[0], ...]): PyG's
  remove_self_loops, then add_self_loops' fill ("mean" of the row's remaining incoming
  features, 0 without any; or the number loop_fill)."""
  bshape = (-1,) + (1,) * (attr.ndim - 1)
  keep = A.rows[pos] != A.cols[pos]
  kept = jnp.where(keep.reshape(bshape), attr, 0)
  n = A.shape[0]
  if isinstance(loop_fill, str) and loop_fill == "mean":
    targets = A.rows[pos]
    total_in = jax.ops.segment_sum(kept, targets, num_segments=n)
    count = jax.ops.segment_sum(keep.astype(attr.dtype), targets, num_segments=n)
    return kept, total_in / jnp.maximum(count, 1).reshape(bshape)
  if isinstance(loop_fill, (int, float)) and not isinstance(loop_fill, bool):
    return kept, jnp.full((n,) + attr.shape[1:], loop_fill, attr.dtype)
  raise ValueError(f"loop_fill must be None, 'mean' or a number; got {loop_fill!r}")


# -- PyG's small utilities -------------------------------------------------------------------------


def degree(index, num_nodes: int | None = None, dtype=jnp.float32):
  """How often each node occurs in `index` [E] (PyG's `degree`): in-degrees for
  `edge_index[1]`, out-degrees for `edge_index[0]`. Traceable (give num_nodes under jit)."""
  index = jnp.asarray(index)
  if index.ndim != 1:
    raise ValueError(f"degree takes one row of an edge_index, shape [E]; got {index.shape}")
  if index.size and not jnp.issubdtype(index.dtype, jnp.integer):
    raise ValueError(f"degree: index must hold integers (node ids); got dtype {index.dtype}")
  if num_nodes is not None:
    num_nodes = _count("num_nodes", num_nodes)
  concrete = integrity.is_concrete(index)  # also when closed over by a jitted function
  if concrete and index.size:
    lo, hi = int(np.min(np.asarray(index))), int(np.max(np.asarray(index)))
    if lo < 0 or (num_nodes is not None and hi >= num_nodes):
      raise ValueError(
        f"degree: index holds node ids in [{lo}, {hi}], outside [0, num_nodes={num_nodes})"
      )
  if num_nodes is None:
    if not concrete:
      raise TypeError("degree: pass num_nodes when index is traced")
    num_nodes = hi + 1 if index.size else 0
  return jax.ops.segment_sum(jnp.ones(index.shape, dtype), index, num_segments=num_nodes)


def to_undirected(edge_index, edge_attr=None, num_nodes: int | None = None, *, reduce: str = "add"):
  """Adds each edge's reverse and merges duplicates (PyG's `to_undirected`).

  Returns edge_index [2, E'] sorted by (source, target), and edge_attr [E', ...] merged by
  `reduce` ("add" or "mean") when given. Host (numpy) operation.
  """
  if reduce not in ("add", "mean"):
    raise ValueError(f"reduce must be 'add' or 'mean'; got {reduce!r}")
  ei = _edge_index(edge_index)
  n = _num_nodes(ei, num_nodes)
  both = np.concatenate([ei, ei[::-1]], axis=1)
  keys = both[0] * max(n, 1) + both[1]
  uniq, inverse = np.unique(keys, return_inverse=True)
  out = np.stack([uniq // max(n, 1), uniq % max(n, 1)])
  if edge_attr is None:
    return out
  attr = _edge_rows("edge_attr", edge_attr, ei.shape[1])
  attr = np.concatenate([attr, attr])
  merged = np.zeros((uniq.size,) + attr.shape[1:], np.float64)
  np.add.at(merged, inverse, attr)
  if reduce == "mean":
    counts = np.bincount(inverse, minlength=uniq.size).reshape((-1,) + (1,) * (attr.ndim - 1))
    merged = merged / counts
  return out, merged.astype(attr.dtype)


def subgraph(
  subset, edge_index, edge_attr=None, *, relabel_nodes: bool = False, num_nodes: int | None = None
):
  """The edges among `subset` (node indices or a boolean mask) (PyG's `subgraph`).

  Returns (edge_index, edge_attr or None, edge_mask): with `relabel_nodes` the kept nodes are
  renumbered 0..k-1 in increasing order of their index. Host (numpy) operation.
  """
  ei = _edge_index(edge_index)
  n = _num_nodes(ei, num_nodes)
  subset = np.asarray(subset)
  if subset.dtype == bool:
    if subset.shape != (n,):
      raise ValueError(f"a boolean subset must have shape [{n}]; got {subset.shape}")
    mask = subset
  else:
    if subset.size and subset.dtype.kind not in "iu":
      raise ValueError(
        f"subset must be node ids (an integer dtype) or a boolean mask [{n}]; got dtype "
        f"{subset.dtype}"
      )
    if subset.ndim > 1:
      raise ValueError(f"subset must be one-dimensional; got shape {subset.shape}")
    if subset.size and (subset.min() < 0 or subset.max() >= n):
      raise ValueError(
        f"subset holds node ids in [{subset.min()}, {subset.max()}], outside [0, {n}) (pass "
        "num_nodes for nodes past edge_index's largest id)"
      )
    mask = np.zeros(n, bool)
    mask[subset.astype(np.int64)] = True
  edge_mask = mask[ei[0]] & mask[ei[1]]
  out = ei[:, edge_mask]
  if relabel_nodes:
    new_id = np.full(n, -1, np.int64)
    new_id[mask] = np.arange(int(mask.sum()))
    out = new_id[out]
  attr = None if edge_attr is None else _edge_rows("edge_attr", edge_attr, ei.shape[1])[edge_mask]
  return out, attr, edge_mask


def dropout_edge(
  edge_index, p: float = 0.5, *, rng=None, force_undirected: bool = False, training: bool = True
):
  """Drops each edge with probability p (PyG's `dropout_edge`). Host (numpy) operation: the
  pattern changes, so build the matrix after it. `rng`: a numpy Generator or seed.

  Returns (edge_index, edge_mask). With `force_undirected`, an edge and its reverse are kept
  or dropped together (the result holds both directions of each kept pair). For a fixed
  pattern under jit, drop values instead: `A.with_values(A.values * keep_mask)`.
  """
  if not 0.0 <= p < 1.0:
    raise ValueError(f"dropout probability must be in [0, 1); got {p}")
  ei = _edge_index(edge_index)
  if not training or p == 0.0:
    return ei, np.ones(ei.shape[1], bool)
  gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
  if not force_undirected:
    mask = gen.random(ei.shape[1]) >= p
    return ei[:, mask], mask
  upper = ei[0] <= ei[1]
  keep_upper = gen.random(ei.shape[1]) >= p
  mask = upper & keep_upper
  kept = ei[:, mask]
  kept = kept[:, kept[0] != kept[1]]
  loops = ei[:, mask & (ei[0] == ei[1])]
  return np.concatenate([kept, kept[::-1], loops], axis=1), mask
