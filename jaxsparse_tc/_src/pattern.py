"""One orientation of the sparse format (docs/FORMAT.md), built on the host."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxsparse_tc import _cpu

# The format's constants and the schedules' rules are defined once, in C++ (csrc/common/format.h,
# csrc/cpu/schedule.h), and exported by the extension; the builder cuts both schedules there.
WINDOW_ROWS = _cpu.WINDOW_ROWS
BLOCK_COLS = _cpu.BLOCK_COLS
SCHEDULE_FIELDS = _cpu.SCHEDULE_FIELDS  # fields of a window-schedule item
OPERAND_ALIGN = _cpu.OPERAND_ALIGN  # bytes: where packed arrays start (the CUDA kernels' need)
# Windows with more blocks than this are split into several work items (load balance).
SPLIT_BLOCKS = _cpu.SPLIT_BLOCKS
# Grouped schedules: a split window's pieces lie in one aligned group of GROUP_ITEMS items; only
# patterns whose windows have at most GROUPED_MAX_BLOCKS blocks take them.
GROUP_ITEMS = _cpu.GROUP_ITEMS
GROUPED_MAX_BLOCKS = _cpu.GROUPED_MAX_BLOCKS
SMALL_GRAPH_NNZ = _cpu.SMALL_GRAPH_NNZ  # graphs this small get row pieces of SMALL_GRAPH_PIECE
SMALL_GRAPH_PIECE = _cpu.SMALL_GRAPH_PIECE
SMALL_GRAPH_SPLIT = _cpu.SMALL_GRAPH_SPLIT  # and windows split into pieces of this many blocks
# Larger graphs with 1 to FEW_HEAVY_WINDOWS windows of more than SPLIT_BLOCKS blocks: pieces of
# about blocks / BLOCKS_PER_PIECE, at least FINE_SPLIT_MIN (split_blocks).
FEW_HEAVY_WINDOWS = _cpu.FEW_HEAVY_WINDOWS
BLOCKS_PER_PIECE = _cpu.BLOCKS_PER_PIECE
FINE_SPLIT_MIN = _cpu.FINE_SPLIT_MIN
# A CTA's lane groups share one long row: up to ROW_CTA_PIECES row pieces' worth of entries.
ROW_CTA_PIECES = _cpu.ROW_CTA_PIECES
WHOLE_ROW = _cpu.WHOLE_ROW  # row_schedule slot: one lane group walks the row
CTA_ROW = _cpu.CTA_ROW  # row_schedule slot: one CTA walks the row, its groups' sums meet in smem
ROW_ORDERS = _cpu.ROW_ORDERS
# row_order's rule: "locality" from this many nonzeros per condensed column.
LOCALITY_REUSE = _cpu.LOCALITY_REUSE
# "locality": rows longer than this many times the mean row go first.
LONG_ROW_FACTOR = _cpu.LONG_ROW_FACTOR


class Pattern(NamedTuple):
  window_col_ptr: np.ndarray  # int32 [W+1]
  window_cols: np.ndarray  # int32 [C]
  window_block_ptr: np.ndarray  # int32 [W+1]
  block_bitmap: np.ndarray  # uint32 [B, 2]
  block_value_ptr: np.ndarray  # int32 [B+1]
  schedule: np.ndarray  # int32 [S, SCHEDULE_FIELDS]
  rows: np.ndarray  # int32 [nnz]
  cols: np.ndarray  # int32 [nnz]
  row_entries: np.ndarray  # int32 [nnz, 2]: the row view, (column, format position) in CSR order
  row_schedule: np.ndarray  # int32 [R, 4]: row-view items (row, begin, end, slot)

  def kernel_arrays(self) -> tuple:
    """The arrays every kernel reads, in the order of its FFI operands."""
    return tuple(self[:6])

  def row_arrays(self) -> tuple:
    """The row view's arrays (read by the CUDA-core SpMM/SDDMM kernels)."""
    return (self.row_entries, self.row_schedule)

  @property
  def num_blocks(self) -> int:
    return self.block_bitmap.shape[0]


def _pointers(*arrays) -> list[np.ndarray]:
  """Pointer arrays as the extension takes them, of one dtype: int32 where all are (a pattern's
  own, used as they are), else int64."""
  arrays = [np.asarray(a) for a in arrays]
  dtype = np.int32 if all(a.dtype == np.int32 for a in arrays) else np.int64
  return [np.ascontiguousarray(a, dtype) for a in arrays]


def window_schedule(
  window_block_ptr: np.ndarray,
  size: int = SPLIT_BLOCKS,
  grouped: bool = False,
  window_col_ptr: np.ndarray | None = None,
) -> np.ndarray:
  """The window schedule, int32 [S, SCHEDULE_FIELDS]: work items (window, block_begin,
  block_end, split, col_begin, col_end, first, pieces), split windows first by decreasing block
  count, then whole windows by block-count class (csrc/cpu/schedule.h has the rules and why).
  `grouped` (grouped_schedule_fits must hold): windows cut into grouped_pieces() equal pieces
  instead of pieces of `size` blocks. `window_col_ptr` defaults to 8 condensed columns per
  block."""
  if window_col_ptr is None:
    (ptr,), cptr = _pointers(window_block_ptr), None
  else:
    ptr, cptr = _pointers(window_block_ptr, window_col_ptr)
  return _cpu.window_schedule(ptr, int(size), bool(grouped), cptr)


def grouped_pieces(counts) -> np.ndarray:
  """Pieces of windows of `counts` blocks in a grouped schedule (1, 2 or GROUP_ITEMS)."""
  return np.vectorize(_cpu.grouped_pieces, otypes=[np.int64])(np.asarray(counts, np.int64))


def grouped_schedule_fits(window_block_ptr: np.ndarray, nnz: int) -> bool:
  """Whether a pattern can take a grouped schedule: a small graph (SMALL_GRAPH_NNZ) whose windows
  have at most GROUPED_MAX_BLOCKS blocks."""
  return _cpu.grouped_schedule_fits(*_pointers(window_block_ptr), int(nnz))


def split_blocks(window_block_ptr: np.ndarray, nnz: int) -> int:
  """Blocks per piece of a split window of a pattern: SMALL_GRAPH_SPLIT under SMALL_GRAPH_NNZ
  nonzeros; else SPLIT_BLOCKS, or pieces of about blocks / BLOCKS_PER_PIECE (FINE_SPLIT_MIN to
  SPLIT_BLOCKS) where 1 to FEW_HEAVY_WINDOWS windows are longer than SPLIT_BLOCKS blocks."""
  return _cpu.split_blocks(*_pointers(window_block_ptr), int(nnz))


def window_items_bound(windows: int, blocks: int, nnz: int) -> int:
  """The most items a window schedule of a pattern with `windows` windows, at most `blocks`
  blocks and `nnz` nonzeros can have (split_blocks' finest pieces)."""
  return _cpu.window_items_bound(int(windows), int(blocks), int(nnz))


def row_piece(nnz: int) -> int:
  """Longest row one lane group walks alone: SMALL_GRAPH_PIECE under SMALL_GRAPH_NNZ nonzeros,
  else 32 to 256 growing with nnz. The CUDA kernels mirror the small-graph constants
  (row_layout.h; a test checks)."""
  return _cpu.row_piece(int(nnz))


def row_cta_entries(piece: int) -> int:
  """Most entries of one CTA item: ROW_CTA_PIECES pieces of at least 16 entries."""
  return _cpu.row_cta_entries(int(piece))


def row_order(nnz: int, condensed_cols: int, options=None) -> str:
  """The row schedule's order (row_schedule) for a pattern: FormatOptions.row_order if given,
  else "locality" where its windows reuse their columns (nnz / condensed columns >=
  LOCALITY_REUSE), else "length"."""
  forced = None if options is None else options.row_order
  if forced is not None:
    return forced
  return _cpu.row_order(int(nnz), int(condensed_cols))


def row_schedule(row_ptr: np.ndarray, piece: int, order: str = "length") -> np.ndarray:
  """The row view's work items (row, begin, end, slot), int32 [R, 4], of CSR row offsets: rows of
  at most `piece` entries one item (slot WHOLE_ROW), longer ones CTA items of at most
  row_cta_entries(piece) entries (CTA_ROW, or a workspace slot >= 0 for a row of several), CTA
  items first, empty rows last, the whole rows between by `order` (ROW_ORDERS;
  csrc/cpu/schedule.h has the rules and why)."""
  if order not in ROW_ORDERS:
    raise ValueError(f"row order must be one of {ROW_ORDERS}; got {order!r}")
  return _cpu.row_schedule(*_pointers(row_ptr), int(piece), order)


def build(
  rows: np.ndarray, cols: np.ndarray, m: int, n: int, options=None
) -> tuple[Pattern, np.ndarray, bool]:
  """Builds the pattern of validated int64 COO indices, both schedules included, in one call to
  the extension; returns it, input_to_format and whether its schedule is grouped
  (window_schedule). `options`: a FormatOptions (None: the defaults); a FormatOptions(grouped=
  True) that the pattern cannot take raises ValueError."""
  raw = _cpu.build_pattern(
    rows,
    cols,
    m,
    n,
    grouped=None if options is None else options.grouped,
    split_blocks=None if options is None else options.split_blocks,
    row_order=None if options is None else options.row_order,
  )
  pattern = Pattern(**{name: raw[name] for name in Pattern._fields})
  return pattern, raw["input_to_format"], raw["grouped"]


class KernelArrays(NamedTuple):
  """One orientation's window arrays: what every window kernel reads (Pattern.kernel_arrays)."""

  window_col_ptr: Any
  window_cols: Any
  window_block_ptr: Any
  block_bitmap: Any
  block_value_ptr: Any
  schedule: Any


class RowView(NamedTuple):
  """One orientation's row view: what the CUDA-core row kernels read (Pattern.row_arrays)."""

  entries: Any
  schedule: Any


class PatternOperands(NamedTuple):
  """What a primitive takes besides its dense operands: A's and A^T's structure, so that a
  transpose rule can run the transposed product. Primitives bind it flattened (`flat()`) after
  their dense operands; rules and lowerings rebuild it (`unflat`) and pick fields by name."""

  a: KernelArrays  # A's window arrays
  t: KernelArrays  # A^T's
  perm_t: Any  # int32 [nnz]: A's values in A^T's format order are values[..., perm_t]
  perm_t_inv: Any  # its inverse
  rows_a: Any  # int32 [nnz]: each of A's values' row (format order)
  rows_t: Any  # the same for A^T (the columns of A, in A^T's order)
  row_view_a: RowView
  row_view_t: RowView

  def flat(self) -> tuple:
    return (
      *self.a,
      *self.t,
      self.perm_t,
      self.perm_t_inv,
      self.rows_a,
      self.rows_t,
      *self.row_view_a,
      *self.row_view_t,
    )

  @classmethod
  def unflat(cls, ops) -> "PatternOperands":
    ops = tuple(ops)
    if len(ops) != NUM_PATTERN_OPERANDS:
      raise ValueError(f"expected {NUM_PATTERN_OPERANDS} pattern operands, got {len(ops)}")
    return cls(
      KernelArrays(*ops[0:6]),
      KernelArrays(*ops[6:12]),
      ops[12],
      ops[13],
      ops[14],
      ops[15],
      RowView(*ops[16:18]),
      RowView(*ops[18:20]),
    )

  def transpose(self) -> "PatternOperands":
    """The operands of A^T."""
    return PatternOperands(
      self.t,
      self.a,
      self.perm_t_inv,
      self.perm_t,
      self.rows_t,
      self.rows_a,
      self.row_view_t,
      self.row_view_a,
    )

  @property
  def nnz(self) -> int:
    return self.rows_a.shape[0]


NUM_PATTERN_OPERANDS = 20
