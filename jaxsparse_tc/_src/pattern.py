"""One orientation of the sparse format (docs/FORMAT.md), built on the host."""

from __future__ import annotations

from typing import Any, NamedTuple

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


SCHEDULE_FIELDS = 8


def _length_class(counts: np.ndarray) -> np.ndarray:
  """floor(log2(count)) for count >= 1, -1 for empty: lengths within 2x of each other share a
  class."""
  counts = np.asarray(counts, dtype=np.int64)
  return np.where(counts > 0, np.floor(np.log2(np.maximum(counts, 1))), -1).astype(np.int64)


def window_schedule(
  window_block_ptr: np.ndarray,
  size: int = SPLIT_BLOCKS,
  grouped: bool = False,
  window_col_ptr: np.ndarray | None = None,
) -> np.ndarray:
  """Work items (window, block_begin, block_end, split, col_begin, col_end, first, pieces): split
  windows first by decreasing block count, then the whole windows by length class (block
  counts within 2x, _length_class), heaviest class first and in window order inside a class. A
  window of more than `size` blocks is cut into pieces of that many (split = the piece size; 0
  for a whole window), a split window's pieces contiguous and in order (so split items are the
  schedule's prefix and piece p of a window whose first piece is item s is item s + p; kernels
  rely on both). The last four fields spare a kernel a round trip to the window pointers: the
  item's first condensed column, the window's end column, the item index of the window's first
  piece and the window's piece count (the item itself and 1 for a whole window).
  `window_col_ptr` defaults to 8 condensed columns per block.

  Why classes rather than strictly heaviest first: windows running at the same time on the GPU
  are then neighbours, which in a reordered graph read the same X rows (L2 hits; on H100 at d =
  128 fp16, DD's tensor-core SpMM 92.7 us against 100.8, a dense-community graph's 159 against
  175), while blocks within 2x keep the balance.

  `grouped` (grouped_schedule_fits must hold): each window is cut into grouped_pieces() pieces
  of equal size instead (1, 2 or 4), so that every split window's pieces lie in one aligned
  group of GROUP_ITEMS items, which the attention forward merges inside one CTA; such a
  schedule stays strictly by decreasing block count."""
  ptr = np.asarray(window_block_ptr, dtype=np.int64)
  cptr = 8 * ptr if window_col_ptr is None else np.asarray(window_col_ptr, dtype=np.int64)
  counts = np.diff(ptr)
  if grouped:
    pieces = grouped_pieces(counts)
    sizes = np.maximum(1, -(-counts // pieces))
    assert np.array_equal(pieces, np.maximum(1, -(-counts // sizes)))
  else:
    pieces = np.maximum(1, -(-counts // size))
    sizes = np.full(counts.shape, size)
  window = np.repeat(np.arange(counts.size, dtype=np.int64), pieces)
  first_item = np.cumsum(pieces) - pieces
  piece = np.arange(window.size, dtype=np.int64) - np.repeat(first_item, pieces)
  begin = ptr[window] + piece * sizes[window]
  end = np.minimum(begin + sizes[window], ptr[window + 1])
  split = np.where(pieces[window] > 1, sizes[window], 0)
  col_begin = cptr[window] + 8 * (begin - ptr[window])
  if grouped:
    order = np.argsort(-counts[window], kind="stable")
  else:  # lexsort: the last key is the primary one; pieces keep their order (stable)
    whole = pieces[window] == 1
    rank = np.where(whole, -_length_class(counts[window]), -counts[window])
    order = np.lexsort((window, rank, whole))
  position = np.empty_like(order)
  position[order] = np.arange(order.size)
  first = position[np.repeat(first_item, pieces)]  # pieces stay contiguous in the sorted order
  items = np.stack(
    [window, begin, end, split, col_begin, cptr[window + 1], first, pieces[window]], axis=1
  )
  return np.ascontiguousarray(items[order], dtype=np.int32)


# Grouped schedules (small graphs whose windows have at most GROUPED_MAX_BLOCKS blocks): a window
# of up to SMALL_GRAPH_SPLIT blocks is one item, up to 9 blocks two pieces, more four (from 10
# blocks on, four pieces of ceil(count / 4) blocks are exactly four). Sorted by block count, the
# four-piece windows come first, then the two-piece ones, so each lands in one aligned group.
GROUP_ITEMS = 4
GROUPED_MAX_BLOCKS = 32


def grouped_pieces(counts: np.ndarray) -> np.ndarray:
  counts = np.asarray(counts)
  return np.where(counts <= SMALL_GRAPH_SPLIT, 1, np.where(counts <= 9, 2, GROUP_ITEMS))


def grouped_schedule_fits(window_block_ptr: np.ndarray, nnz: int) -> bool:
  """Whether a pattern can take a grouped schedule: a small graph (SMALL_GRAPH_NNZ) whose windows
  have at most GROUPED_MAX_BLOCKS blocks (larger ones keep pieces of SMALL_GRAPH_SPLIT blocks,
  merged across CTAs)."""
  counts = np.diff(np.asarray(window_block_ptr, dtype=np.int64))
  return nnz < SMALL_GRAPH_NNZ and (counts.size == 0 or int(counts.max()) <= GROUPED_MAX_BLOCKS)


SMALL_GRAPH_NNZ = 1 << 16  # graphs this small get row pieces of SMALL_GRAPH_PIECE entries
SMALL_GRAPH_PIECE = 8
SMALL_GRAPH_SPLIT = 4  # and windows split into pieces of this many blocks


def split_blocks(nnz: int) -> int:
  """Blocks per piece of a split window. On a graph too small to fill the GPU a kernel's time is
  its longest piece's chain of dependent block loads (the attention forward walks a piece two
  blocks per round trip), so small graphs get short pieces."""
  return SMALL_GRAPH_SPLIT if nnz < SMALL_GRAPH_NNZ else SPLIT_BLOCKS


def row_piece(nnz: int) -> int:
  """Longest row one lane group walks alone: small graphs get short rows per group (a shorter
  longest chain of dependent loads: 8 entries under SMALL_GRAPH_NNZ nonzeros; on Cora, from 32
  to 16 to 8, fp16 SpMM device time went ~9-10 -> ~6 -> ~4-4.5 us, scripts/piece_probe.py),
  large ones longer (fewer rows need a whole CTA). The CUDA kernels mirror the small-graph
  constants (row_view.cuh; a test checks)."""
  if nnz < SMALL_GRAPH_NNZ:
    return SMALL_GRAPH_PIECE
  return int(min(256, max(32, 1 << (int(nnz // 16384).bit_length() - 1))))


# A CTA's lane groups share one long row: up to ROW_CTA_PIECES row pieces' worth of entries.
ROW_CTA_PIECES = 16


def row_cta_entries(piece: int) -> int:
  """Most entries of one CTA item: ROW_CTA_PIECES pieces of at least 16 entries (a small
  graph's short pieces shorten each group's walk, not a CTA's share: Cora's longest row, 169
  entries, stays one CTA item and needs no workspace)."""
  return ROW_CTA_PIECES * max(piece, 16)


WHOLE_ROW = -1  # row_schedule slot: one lane group walks the row
CTA_ROW = -2  # row_schedule slot: one CTA walks the row, its groups' sums meet in shared memory


ROW_ORDERS = ("length", "locality")
# row_order's rule: "locality" from this many nonzeros per condensed column (a window's 8 rows
# read each of their distinct columns this often), where neighbouring rows share X rows: DD in
# its own order (1.58) gains by it, pubmed in affinity order (1.50) loses (docs/DESIGN.md).
LOCALITY_REUSE = 1.55
# "locality": rows longer than this many times the mean row go first (they would hold the last
# CTAs of a row-ordered walk).
LONG_ROW_FACTOR = 4


def row_order(nnz: int, condensed_cols: int, options=None) -> str:
  """The row schedule's order (row_schedule) for a pattern: FormatOptions.row_order if given,
  else "locality" where its windows reuse their columns (nnz / condensed columns >=
  LOCALITY_REUSE), else "length"."""
  forced = None if options is None else options.row_order
  if forced is not None:
    return forced
  return "locality" if nnz >= LOCALITY_REUSE * max(condensed_cols, 1) else "length"


def row_schedule(row_ptr: np.ndarray, piece: int, order: str = "length") -> np.ndarray:
  """Work items of the row view (row, begin, end, slot). A row of at most `piece` entries is
  one item with slot WHOLE_ROW (empty rows included). A longer row is one item per
  row_cta_entries(piece) entries, each walked by a whole CTA: a single such item has slot
  CTA_ROW; the items of a row with several (slot >= 0, numbering those rows in order) add their
  CTAs' sums in a workspace slot. CTA items come first, longest rows first (so slotted items are
  the prefix of that) and a row's items are contiguous; empty rows come last (the SDDMM stream
  stops at its first empty item). The whole rows between, by `order`:

  - "length": by length class (lengths within 2x, _length_class), longest class first, in row
    order inside a class: groups of a CTA get rows of like length, and rows running at once are
    near each other (on H100, fp16 d = 128 SpMM, R-MAT 17/16 83.8 us against 87.1 strictly
    longest first, R-MAT 20/8 455 against 468);
  - "locality": rows longer than LONG_ROW_FACTOR x the mean row first (longest first), then the
    rest in row order: where neighbouring rows share columns (row_order's rule) a CTA's groups
    then read the same X rows from L1 and the rows running at once fit the L2 (DD 83.6 us
    against 100.3 by length class and 139.5 strictly longest first; R-MAT 17/16, whose
    neighbours share little, 89.7)."""
  if order not in ROW_ORDERS:
    raise ValueError(f"row order must be one of {ROW_ORDERS}; got {order!r}")
  ptr = np.asarray(row_ptr, dtype=np.int64)
  counts = np.diff(ptr)
  cap = row_cta_entries(piece)
  pieces = np.maximum(1, -(-counts // cap))
  rows = np.arange(counts.size, dtype=np.int64)
  group = np.where(counts > piece, 0, np.where(counts > 0, 1, 2))  # CTA, whole, empty rows
  if order == "length":
    rank = -_length_class(counts)
  else:
    long_row = counts > LONG_ROW_FACTOR * max(ptr[-1] / max(counts.size, 1), 1.0)
    rank = np.where(long_row, -counts, 0)
  rank = np.where(group == 0, -counts, rank)
  walk = np.lexsort((rows, rank, group))  # the rows in schedule order (last key is primary)
  row = np.repeat(walk, pieces[walk])
  first = np.cumsum(pieces[walk]) - pieces[walk]
  p = np.arange(row.size, dtype=np.int64) - np.repeat(first, pieces[walk])
  begin = ptr[row] + p * cap
  end = np.minimum(begin + cap, ptr[row + 1])
  split = pieces[row] > 1
  slot = np.where(
    split, np.cumsum(split & (p == 0)) - 1, np.where(counts[row] > piece, CTA_ROW, WHOLE_ROW)
  )
  return np.ascontiguousarray(np.stack([row, begin, end, slot], axis=1), dtype=np.int32)


def build(
  rows: np.ndarray, cols: np.ndarray, m: int, n: int, options=None
) -> tuple[Pattern, np.ndarray, bool]:
  """Builds the pattern of validated int64 COO indices; returns it, input_to_format and whether
  its schedule is grouped (window_schedule). `options`: a FormatOptions (None: the defaults)."""
  raw = _cpu.build_pattern(rows, cols, m, n)
  nnz = raw["rows"].shape[0]
  forced_size = None if options is None else options.split_blocks
  want_grouped = None if options is None else options.grouped
  fits = grouped_schedule_fits(raw["window_block_ptr"], nnz)
  if want_grouped and not fits:
    counts = np.diff(np.asarray(raw["window_block_ptr"], np.int64))
    most = int(counts.max()) if counts.size else 0
    raise ValueError(
      f"FormatOptions(grouped=True): a grouped schedule needs fewer than {SMALL_GRAPH_NNZ} "
      f"nonzeros and at most {GROUPED_MAX_BLOCKS} blocks per window in both orientations; "
      f"the {m} x {n} orientation has {nnz} nonzeros and a window of {most} blocks"
    )
  grouped = fits and want_grouped is not False and forced_size is None
  size = split_blocks(nnz) if forced_size is None else forced_size
  pattern = Pattern(
    window_col_ptr=raw["window_col_ptr"],
    window_cols=raw["window_cols"],
    window_block_ptr=raw["window_block_ptr"],
    block_bitmap=raw["block_bitmap"],
    block_value_ptr=raw["block_value_ptr"],
    schedule=window_schedule(raw["window_block_ptr"], size, grouped, raw["window_col_ptr"]),
    rows=raw["rows"],
    cols=raw["cols"],
    row_entries=raw["row_entries"],
    row_schedule=row_schedule(
      raw["row_ptr"],
      row_piece(nnz),
      row_order(nnz, int(raw["window_col_ptr"][-1]), options),
    ),
  )
  return pattern, raw["input_to_format"], grouped


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
