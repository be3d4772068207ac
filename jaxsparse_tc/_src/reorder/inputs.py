"""The graph inputs `reorder` and `block_stats` take, as COO arrays; argument and permutation
checks."""

from __future__ import annotations

import os

import numpy as np

from jaxsparse_tc._src.checks import int_arg
from jaxsparse_tc._src.integrity import check_dims, index_array
from jaxsparse_tc._src.sparse_matrix import SparseMatrix

# The C++ reordering splits its work over at most two threads (csrc/cpu/reorder.cc).
MAX_THREADS = 2
MAX_INT32 = 2**31 - 1


def default_threads() -> int:
  return max(1, min(MAX_THREADS, os.cpu_count() or 1))


def coo(A, num_nodes):
  """(rows, cols, shape) of a square pattern: int64 numpy arrays."""
  num_nodes = int_arg("num_nodes", num_nodes, low=0)
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
    m = A.tocoo()
    rows, cols, shape = m.row, m.col, m.shape
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
  rows, cols = index_array("rows", rows), index_array("cols", cols)
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
  # The orderings hold node ids as int32 (csrc/cpu/reorder.cc), as the format does.
  check_dims(*shape, "reorder: the graph's shape")
  if rows.size:
    lo = min(int(rows.min()), int(cols.min()))
    hi = max(int(rows.max()), int(cols.max()))
    if lo < 0 or hi >= shape[0]:
      raise ValueError(f"node index out of range [0, {shape[0]}): min {lo}, max {hi}")
  return rows, cols, shape


def check_perm(perm, n: int) -> np.ndarray:
  """A user's permutation of n nodes (perm[new] = old): its length, range and duplicates."""
  p = index_array("perm", perm)
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


def inverse(perm: np.ndarray) -> np.ndarray:
  inv = np.empty_like(perm)
  inv[perm] = np.arange(perm.size, dtype=perm.dtype)
  return inv
