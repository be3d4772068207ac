"""Row partitioning: contiguous row blocks balanced by nonzeros, the padded rows per shard, and
which shard each entry goes to.

A sharded graph's global counts (its nonzeros, the offsets of each shard's entries and values)
are int64 and may pass 2^31, while each shard's own format has int32 indices: the per-shard
entry limit (integrity.MAX_ENTRIES) and the int32 padded node positions are checked here, before
anything is built."""

from __future__ import annotations

import numpy as np

from jaxsparse_tc._src import integrity

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


def count_array(name: str, counts) -> np.ndarray:
  """Non-negative integer counts as int64 (sums of them are then exact past 2^31)."""
  c = np.asarray(counts)
  if c.ndim != 1:
    raise ValueError(f"{name} must be one-dimensional; got shape {c.shape}")
  if c.size and c.dtype.kind not in "iu":
    raise ValueError(f"{name} must hold integer counts; got dtype {c.dtype}")
  c = c.astype(np.int64)
  if c.size and c.min() < 0:
    raise ValueError(f"{name} must be counts >= 0; got {int(c.min())}")
  return c


def exclusive_offsets(counts) -> np.ndarray:
  """int64 [k + 1]: where each of k consecutive runs of `counts[i]` items starts, then the total
  (a row pointer of row counts, the shards' starts in a global entry order)."""
  c = count_array("counts", counts)
  out = np.zeros(c.size + 1, np.int64)
  np.cumsum(c, out=out[1:])
  return out


def shard_nnz(row_nnz, bounds) -> np.ndarray:
  """Entries per shard (int64 [P]) of the entries per row and the row blocks `bounds`."""
  ptr = exclusive_offsets(row_nnz)
  b = np.asarray(bounds, np.int64)
  return ptr[b[1:]] - ptr[b[:-1]]


def check_shard_entries(per_shard, limit: int | None = None) -> np.ndarray:
  """ValueError naming the first shard with more entries than `limit` (default: the format's
  integrity.MAX_ENTRIES, as for one SparseMatrix); returns the counts as int64."""
  limit = integrity.MAX_ENTRIES if limit is None else limit
  c = count_array("per_shard", per_shard)
  over = np.flatnonzero(c > limit)
  if over.size:
    p = int(over[0])
    raise ValueError(
      f"shard {p} of {c.size} holds {int(c[p])} entries, more than the per-shard limit of "
      f"{limit} (each shard's format has int32 indices; the whole graph may hold more): use "
      f"more shards, or bounds that give shard {p} fewer rows"
    )
  return c


def check_padded_nodes(num_shards: int, rows_per_shard: int, ext_cols: int | None = None) -> None:
  """ValueError where the padded node positions (num_shards * rows_per_shard, int32 on the
  devices) or a shard's exchanged column space (`ext_cols`, its format's columns) pass the
  format's integrity.MAX_DIM."""
  limit = integrity.MAX_DIM
  padded = int(num_shards) * int(rows_per_shard)
  if padded > limit:
    raise ValueError(
      f"{num_shards} shards of {rows_per_shard} padded rows make {padded} padded node "
      f"positions, more than {limit} (int32 node positions): balance the row blocks "
      "(bounds) so that the largest shard has fewer rows"
    )
  if ext_cols is not None and ext_cols > limit:
    raise ValueError(
      f"each shard's exchanged column space has {ext_cols} columns, more than the format's "
      f"{limit} (int32 column indices): balance the row blocks (bounds) or use fewer shards"
    )


def value_offsets(num_shards: int, part_nnz) -> np.ndarray:
  """int64 [P, parts]: where each shard's part starts in the flat sharded value layout (per
  shard its parts' padded values one after the other), exact past 2^31."""
  sizes = count_array("part_nnz", part_nnz)
  within = exclusive_offsets(sizes)
  return np.arange(num_shards, dtype=np.int64)[:, None] * within[-1] + within[None, :-1]


def plan_rows(row_nnz, num_shards: int, bounds=None, *, row_weight: float = 1.0):
  """The row partition of a square graph with `row_nnz` entries per row: (bounds int64 [P + 1],
  entries per shard int64 [P], padded rows per shard M). Each shard's entries and the padded
  node positions are checked against the format's int32 limits; the total may pass them."""
  counts = count_array("row_nnz", row_nnz)
  if bounds is None:
    bounds = partition_rows(counts, num_shards, row_weight=row_weight)
  b = check_bounds(bounds, counts.size, num_shards)
  per_shard = check_shard_entries(shard_nnz(counts, b))
  M = rows_per_shard(np.diff(b))
  check_padded_nodes(num_shards, M)
  return b, per_shard, M


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
  starts = exclusive_offsets(np.bincount(row_owner, minlength=P))
  return col_owner, [order[starts[p] : starts[p + 1]] for p in range(P)]
