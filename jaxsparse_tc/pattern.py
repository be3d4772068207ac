"""One orientation of the sparse format (docs/FORMAT.md), built on the host."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxsparse_tc import _cpu

WINDOW_ROWS = 8
BLOCK_COLS = 8
# Windows with more blocks than this are split into several work items (load balance).
SPLIT_BLOCKS = 32


class Pattern(NamedTuple):
  window_col_ptr: np.ndarray  # int32 [W+1]
  window_cols: np.ndarray  # int32 [C]
  window_block_ptr: np.ndarray  # int32 [W+1]
  block_bitmap: np.ndarray  # uint32 [B, 2]
  block_value_ptr: np.ndarray  # int32 [B+1]
  schedule: np.ndarray  # int32 [S, 4]
  rows: np.ndarray  # int32 [nnz]
  cols: np.ndarray  # int32 [nnz]

  def kernel_arrays(self) -> tuple:
    """The arrays every kernel reads, in the order of its FFI operands."""
    return tuple(self[:6])

  @property
  def num_blocks(self) -> int:
    return self.block_bitmap.shape[0]


def window_schedule(window_block_ptr: np.ndarray, split_blocks: int = SPLIT_BLOCKS) -> np.ndarray:
  """Work items (window, block_begin, block_end, split): windows by decreasing block count, a
  split window's pieces contiguous and in order (so split items are the schedule's prefix and
  piece p of a window whose first piece is item s is item s + p; kernels rely on both)."""
  ptr = np.asarray(window_block_ptr, dtype=np.int64)
  counts = np.diff(ptr)
  pieces = np.maximum(1, -(-counts // split_blocks))
  window = np.repeat(np.arange(counts.size, dtype=np.int64), pieces)
  first_item = np.cumsum(pieces) - pieces
  piece = np.arange(window.size, dtype=np.int64) - np.repeat(first_item, pieces)
  begin = ptr[window] + piece * split_blocks
  end = np.minimum(begin + split_blocks, ptr[window + 1])
  split = (pieces[window] > 1).astype(np.int64)
  items = np.stack([window, begin, end, split], axis=1)
  order = np.argsort(-counts[window], kind="stable")
  return np.ascontiguousarray(items[order], dtype=np.int32)


def build(rows: np.ndarray, cols: np.ndarray, m: int, n: int) -> tuple[Pattern, np.ndarray]:
  """Builds the pattern of validated int64 COO indices; returns it and input_to_format."""
  raw = _cpu.build_pattern(rows, cols, m, n)
  pattern = Pattern(
      window_col_ptr=raw["window_col_ptr"],
      window_cols=raw["window_cols"],
      window_block_ptr=raw["window_block_ptr"],
      block_bitmap=raw["block_bitmap"],
      block_value_ptr=raw["block_value_ptr"],
      schedule=window_schedule(raw["window_block_ptr"]),
      rows=raw["rows"],
      cols=raw["cols"],
  )
  return pattern, raw["input_to_format"]


# A primitive's pattern operands, in order: A's kernel arrays (6), A^T's (6), perm_t, perm_t_inv,
# then A's and A^T's per-value rows (for rules that gather per-row quantities onto nonzeros).
NUM_PATTERN_OPERANDS = 16
PERM_T = 12
ROWS = 14


def transpose_operands(operands: tuple) -> tuple:
  """The pattern operands of A^T, given those of A."""
  assert len(operands) == NUM_PATTERN_OPERANDS
  return (*operands[6:12], *operands[:6], operands[13], operands[12], operands[15], operands[14])
