"""Padding a pattern's format arrays to common lengths, so that several matrices (the shards of a
row-partitioned graph, or a batch of graphs) stack into arrays with a leading axis and run in
one `shard_map` / `vmap` program.

Every array of one orientation (docs/FORMAT.md) grows at its end with entries the kernels treat
as empty; nothing real moves, so format positions, windows and blocks keep their indices:

- `window_cols`: column `fill_col` (past `window_col_ptr[W]`: no window reaches it);
- `block_bitmap`: zero bitmaps; `block_value_ptr`: the real nnz (past `window_block_ptr[W]`:
  no window owns those blocks, and they hold no values);
- `schedule`: items `(e, b, b, 0, c, c, s, 1)`, whole-window items of an *empty* window `e`
  (b its first block, c its first condensed column, s the item itself): a kernel writes that
  window's zero rows once more, nothing else;
- `rows`, `cols`: `empty_row`, `fill_col` (valid indices for gathers such as `lse[rows]`; no
  kernel reads them);
- `row_entries`: `(fill_col, own position)` (past the last row's end: no row reaches them);
- `row_schedule`: `(empty_row, nnz, nnz, WHOLE_ROW)`, whole-row items of an empty row (zeros
  written once more);
- `perm_t`, `perm_t_inv`: the identity on the tail (padded values map to padded values).

Window `e` and row `empty_row` must be empty (checked): give each matrix 8 spare rows (one empty
window) past its real rows. Values are padded with zeros; a kernel never writes the padded
positions of an nnz-sized *output* (SDDMM, edge softmax, attention's dbias), so callers mask
those (`valid_mask`).

Kernels also derive small-graph constants from the nnz they are given (row pieces, split
sizes: pattern.row_piece, pattern.split_blocks, and the CUDA kernels' mirrors of them), so
`reschedule` rebuilds a pattern's two schedules with the rules of the padded nnz before padding
(with the builder's own C++ schedule functions, csrc/cpu/schedule.h):
every matrix of a stack then looks, to a kernel, like one pattern of the stacked nnz.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from jaxsparse_tc import _cpu
from jaxsparse_tc._src import pattern as pattern_lib
from jaxsparse_tc._src.pattern import Pattern

__all__ = [
  "PadSizes",
  "pattern_sizes",
  "max_sizes",
  "reschedule",
  "pad_pattern",
  "pad_permutation",
  "valid_mask",
]


class PadSizes(NamedTuple):
  """Lengths of one orientation's variable-length arrays."""

  nnz: int
  cols: int  # window_cols (C)
  blocks: int  # block_bitmap rows (B)
  items: int  # schedule rows (S)
  row_items: int  # row_schedule rows (R)


def pattern_sizes(p: Pattern) -> PadSizes:
  return PadSizes(
    int(p.rows.shape[0]),
    int(p.window_cols.shape[0]),
    int(p.block_bitmap.shape[0]),
    int(p.schedule.shape[0]),
    int(p.row_schedule.shape[0]),
  )


def max_sizes(sizes: Sequence[PadSizes]) -> PadSizes:
  return PadSizes(*(max(int(s[i]) for s in sizes) for i in range(len(PadSizes._fields))))


def _row_ptr(p: Pattern, m: int) -> np.ndarray:
  counts = np.bincount(np.asarray(p.rows, np.int64), minlength=m)
  ptr = np.zeros(m + 1, np.int64)
  np.cumsum(counts, out=ptr[1:])
  return ptr


def reschedule(
  p: Pattern, num_rows: int, nnz: int, grouped: bool, split_blocks: int | None = None
) -> Pattern:
  """`p` with its window schedule and row schedule rebuilt by the rules of a pattern of `nnz`
  nonzeros (the padded count kernels will see; the row order by p's own nonzeros). `grouped`:
  cut windows into grouped pieces (pattern.grouped_schedule_fits(window_block_ptr, nnz) must
  hold)."""
  wbp = np.ascontiguousarray(p.window_block_ptr, np.int32)
  wcp = np.ascontiguousarray(p.window_col_ptr, np.int32)
  nnz = int(nnz)
  size = pattern_lib.split_blocks(wbp, nnz) if split_blocks is None else int(split_blocks)
  schedule = _cpu.window_schedule(wbp, size, bool(grouped), wcp)
  order = _cpu.row_order(int(p.rows.shape[0]), int(wcp[-1]))
  row_schedule = _cpu.row_schedule(_row_ptr(p, num_rows), _cpu.row_piece(nnz), order)
  return p._replace(schedule=schedule, row_schedule=row_schedule)


def _pad_rows(a: np.ndarray, length: int, fill, out: np.ndarray | None = None) -> np.ndarray:
  """a padded with `fill` rows to `length` rows, written into `out` where given."""
  a = np.asarray(a)
  extra = length - a.shape[0]
  if extra < 0:
    raise ValueError(f"cannot pad an array of {a.shape[0]} rows to {length}")
  if out is None:
    if extra == 0:
      return a
    out = np.empty((length,) + a.shape[1:], a.dtype)
  out[: a.shape[0]] = a
  out[a.shape[0] :] = fill
  return out


def pad_pattern(
  p: Pattern,
  sizes: PadSizes,
  *,
  empty_window: int,
  empty_row: int,
  fill_col: int,
  out: Pattern | None = None,
) -> Pattern:
  """`p` (numpy arrays) with every variable-length array padded to `sizes` (table above).

  `empty_window`: a window without nonzeros whose items the padded schedule repeats;
  `empty_row`: a row without nonzeros (the padded row items'); `fill_col`: any valid column.
  `out`: a Pattern of arrays of the padded shapes to write into (one shard's rows of stacked
  arrays: no copy per shard to stack them afterwards).
  """
  wbp, wcp = np.asarray(p.window_block_ptr), np.asarray(p.window_col_ptr)
  num_windows = wbp.shape[0] - 1
  if not 0 <= empty_window < num_windows or wbp[empty_window] != wbp[empty_window + 1]:
    raise ValueError(f"window {empty_window} is not an empty window of this pattern")
  rows = np.asarray(p.rows)
  nnz = rows.shape[0]
  if not 0 <= empty_row < 8 * num_windows or np.any(rows == empty_row):
    raise ValueError(f"row {empty_row} is not an empty row of this pattern")
  s = pattern_sizes(p)
  b = int(wbp[empty_window])
  c = int(wcp[empty_window])
  o = out if out is not None else Pattern(*([None] * len(Pattern._fields)))
  schedule = _pad_rows(np.asarray(p.schedule, np.int32), sizes.items, 0, o.schedule)
  schedule[s.items :] = (empty_window, b, b, 0, c, c, 0, 1)
  schedule[s.items :, 6] = np.arange(s.items, sizes.items)  # `first`: a whole window's item
  row_entries = _pad_rows(np.asarray(p.row_entries, np.int32), sizes.nnz, 0, o.row_entries)
  row_entries[nnz:, 0] = fill_col
  row_entries[nnz:, 1] = np.arange(nnz, sizes.nnz)
  return Pattern(
    window_col_ptr=_pad_rows(wcp, wcp.shape[0], 0, o.window_col_ptr),
    window_cols=_pad_rows(p.window_cols, sizes.cols, fill_col, o.window_cols),
    window_block_ptr=_pad_rows(wbp, wbp.shape[0], 0, o.window_block_ptr),
    block_bitmap=_pad_rows(p.block_bitmap, sizes.blocks, 0, o.block_bitmap),
    block_value_ptr=_pad_rows(p.block_value_ptr, sizes.blocks + 1, nnz, o.block_value_ptr),
    schedule=schedule,
    rows=_pad_rows(rows, sizes.nnz, empty_row, o.rows),
    cols=_pad_rows(p.cols, sizes.nnz, fill_col, o.cols),
    row_entries=row_entries,
    row_schedule=_pad_rows(
      p.row_schedule,
      sizes.row_items,
      (empty_row, nnz, nnz, pattern_lib.WHOLE_ROW),
      o.row_schedule,
    ),
  )


def pad_permutation(perm: np.ndarray, length: int, out: np.ndarray | None = None) -> np.ndarray:
  """A permutation of range(len(perm)) extended by the identity to range(length) (written into
  `out` where given)."""
  perm = np.asarray(perm, np.int32)
  out = np.empty(length, np.int32) if out is None else out
  out[: perm.shape[0]] = perm
  out[perm.shape[0] :] = np.arange(perm.shape[0], length, dtype=np.int32)
  return out


def valid_mask(count, length: int):
  """[length] booleans, True at the first `count` positions (the real values of a padded
  pattern). `count` may be traced (a shard's real nnz inside shard_map)."""
  import jax.numpy as jnp

  return jnp.arange(length, dtype=jnp.int32) < count
