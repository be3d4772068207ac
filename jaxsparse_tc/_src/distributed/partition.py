"""Row partitioning: contiguous row blocks balanced by nonzeros, the padded rows per shard, and
which shard each entry goes to."""

from __future__ import annotations

import numpy as np

# Large shards take a multiple of ROW_ALIGN rows: XLA pads a matmul's contracted dimension to its
# tile, so a layer's weight gradient (h^T g, contracted over the rows) would otherwise copy its
# [M, d] operands into padded ones (docs/DISTRIBUTED.md, "Measured": the profile).
ROW_ALIGN, ROW_ALIGN_FROM = 1024, 1 << 16


def partition_rows(row_nnz, num_shards: int, *, row_weight: float = 1.0) -> np.ndarray:
  """Contiguous row blocks balanced by nonzeros: bounds [num_shards + 1], shard p owning rows
  bounds[p] .. bounds[p+1].

  `row_nnz`: nonzeros per row ([n]; `np.diff(csr.indptr)`). Each row weighs its nonzeros plus
  `row_weight` (a row's dense work: its output row, its share of the row-wise layers).
  Contiguous ranges keep neighbours together after a locality reordering (reorder first, then
  partition).
  """
  counts = np.asarray(row_nnz, np.float64)
  if counts.ndim != 1:
    raise ValueError(f"row_nnz must be one-dimensional; got shape {counts.shape}")
  if counts.size and not (np.all(np.isfinite(counts)) and counts.min() >= 0):
    raise ValueError(
      f"row_nnz must be finite counts >= 0; got values from {counts.min()} to {counts.max()}"
    )
  if num_shards < 1:
    raise ValueError(f"num_shards must be at least 1; got {num_shards}")
  n = counts.shape[0]
  cum = np.zeros(n + 1)
  np.cumsum(counts + row_weight, out=cum[1:])
  targets = cum[-1] * np.arange(1, num_shards) / num_shards
  inner = np.searchsorted(cum, targets, side="left")
  # Round each cut to the nearer of the two candidate rows.
  lower = np.maximum(inner - 1, 0)
  pick_lower = np.abs(cum[lower] - targets) <= np.abs(cum[np.minimum(inner, n)] - targets)
  inner = np.where(pick_lower, lower, inner)
  bounds = np.concatenate([[0], np.maximum.accumulate(inner), [n]]).astype(np.int64)
  return np.minimum(bounds, n)


def check_bounds(bounds, n: int, P: int) -> np.ndarray:
  b = np.asarray(bounds, np.int64)
  if b.shape != (P + 1,) or b[0] != 0 or b[-1] != n or np.any(np.diff(b) < 0):
    raise ValueError(
      f"bounds must be {P + 1} non-decreasing row indices from 0 to {n}; got "
      f"{np.asarray(bounds).tolist()}"
    )
  return b


def rows_per_shard(counts: np.ndarray) -> int:
  """M: the largest block rounded up to 8, plus 8 spare rows (every shard ends in an empty
  window); from ROW_ALIGN_FROM rows on, a multiple of ROW_ALIGN."""
  M = 8 * (-(-int(counts.max(initial=0)) // 8)) + 8
  if M >= ROW_ALIGN_FROM:
    M = ROW_ALIGN * -(-M // ROW_ALIGN)
  return M


def shard_entries(rows: np.ndarray, cols: np.ndarray, counts: np.ndarray):
  """(owner shard of each entry's column, int16; per shard, its entries' indices in input order)
  for the row blocks of `counts` rows each."""
  P = counts.size
  # Owners by table lookup (a gather per entry, not a binary search), as 16-bit integers so
  # that the stable argsort below is numpy's radix sort.
  owner_table = np.repeat(np.arange(P, dtype=np.int16), counts)
  row_owner = owner_table[rows]
  col_owner = owner_table[cols]
  order = np.argsort(row_owner, kind="stable")
  starts = np.concatenate([[0], np.cumsum(np.bincount(row_owner, minlength=P))])
  return col_owner, [order[starts[p] : starts[p + 1]] for p in range(P)]
