"""The schedules cut in C++ (csrc/cpu/schedule.h) against the numpy implementation they replace,
kept here as the reference: every output array must be equal bit for bit, on random patterns
(empty rows and windows, hub rows, no nonzeros, one row), grouped or not, both row orders and
every split size; and the constants the extension exports against the values the numpy code
had."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsparse_tc as jst
from jaxsparse_tc import _cpu
from jaxsparse_tc._src import padding
from jaxsparse_tc._src import pattern as pattern_lib

# -- the numpy reference (the builder's schedules before they moved to C++) --------------------
REF_SPLIT_BLOCKS = 32
REF_GROUP_ITEMS = 4
REF_GROUPED_MAX_BLOCKS = 32
REF_SMALL_GRAPH_NNZ = 1 << 16
REF_SMALL_GRAPH_PIECE = 8
REF_SMALL_GRAPH_SPLIT = 4
REF_FEW_HEAVY_WINDOWS = 32
REF_BLOCKS_PER_PIECE = 4096
REF_FINE_SPLIT_MIN = 8
REF_ROW_CTA_PIECES = 16
REF_WHOLE_ROW = -1
REF_CTA_ROW = -2
REF_ROW_ORDERS = ("length", "locality")
REF_LOCALITY_REUSE = 1.55
REF_LONG_ROW_FACTOR = 4
REF_SCHEDULE_FIELDS = 8


def ref_length_class(counts):
  counts = np.asarray(counts, dtype=np.int64)
  return np.where(counts > 0, np.floor(np.log2(np.maximum(counts, 1))), -1).astype(np.int64)


def ref_grouped_pieces(counts):
  counts = np.asarray(counts)
  return np.where(counts <= REF_SMALL_GRAPH_SPLIT, 1, np.where(counts <= 9, 2, REF_GROUP_ITEMS))


def ref_window_schedule(
  window_block_ptr, size=REF_SPLIT_BLOCKS, grouped=False, window_col_ptr=None
):
  ptr = np.asarray(window_block_ptr, dtype=np.int64)
  cptr = 8 * ptr if window_col_ptr is None else np.asarray(window_col_ptr, dtype=np.int64)
  counts = np.diff(ptr)
  if grouped:
    pieces = ref_grouped_pieces(counts)
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
  else:
    whole = pieces[window] == 1
    rank = np.where(whole, -ref_length_class(counts[window]), -counts[window])
    order = np.lexsort((window, rank, whole))
  position = np.empty_like(order)
  position[order] = np.arange(order.size)
  first = position[np.repeat(first_item, pieces)]
  items = np.stack(
    [window, begin, end, split, col_begin, cptr[window + 1], first, pieces[window]], axis=1
  )
  return np.ascontiguousarray(items[order], dtype=np.int32)


def ref_grouped_schedule_fits(window_block_ptr, nnz):
  counts = np.diff(np.asarray(window_block_ptr, dtype=np.int64))
  return nnz < REF_SMALL_GRAPH_NNZ and (
    counts.size == 0 or int(counts.max()) <= REF_GROUPED_MAX_BLOCKS
  )


def ref_split_blocks(window_block_ptr, nnz):
  if nnz < REF_SMALL_GRAPH_NNZ:
    return REF_SMALL_GRAPH_SPLIT
  counts = np.diff(np.asarray(window_block_ptr, dtype=np.int64))
  heavy = int((counts > REF_SPLIT_BLOCKS).sum())
  if not 1 <= heavy <= REF_FEW_HEAVY_WINDOWS:
    return REF_SPLIT_BLOCKS
  share = int(counts.sum()) // REF_BLOCKS_PER_PIECE
  piece = 1 << (share.bit_length() - 1) if share > 0 else 1
  return min(max(piece, REF_FINE_SPLIT_MIN), REF_SPLIT_BLOCKS)


def ref_row_piece(nnz):
  if nnz < REF_SMALL_GRAPH_NNZ:
    return REF_SMALL_GRAPH_PIECE
  return int(min(256, max(32, 1 << (int(nnz // 16384).bit_length() - 1))))


def ref_row_cta_entries(piece):
  return REF_ROW_CTA_PIECES * max(piece, 16)


def ref_row_order(nnz, condensed_cols, options=None):
  forced = None if options is None else options.row_order
  if forced is not None:
    return forced
  return "locality" if nnz >= REF_LOCALITY_REUSE * max(condensed_cols, 1) else "length"


def ref_row_schedule(row_ptr, piece, order="length"):
  assert order in REF_ROW_ORDERS
  ptr = np.asarray(row_ptr, dtype=np.int64)
  counts = np.diff(ptr)
  cap = ref_row_cta_entries(piece)
  pieces = np.maximum(1, -(-counts // cap))
  rows = np.arange(counts.size, dtype=np.int64)
  group = np.where(counts > piece, 0, np.where(counts > 0, 1, 2))
  if order == "length":
    rank = -ref_length_class(counts)
  else:
    long_row = counts > REF_LONG_ROW_FACTOR * max(ptr[-1] / max(counts.size, 1), 1.0)
    rank = np.where(long_row, -counts, 0)
  rank = np.where(group == 0, -counts, rank)
  walk = np.lexsort((rows, rank, group))
  row = np.repeat(walk, pieces[walk])
  first = np.cumsum(pieces[walk]) - pieces[walk]
  p = np.arange(row.size, dtype=np.int64) - np.repeat(first, pieces[walk])
  begin = ptr[row] + p * cap
  end = np.minimum(begin + cap, ptr[row + 1])
  split = pieces[row] > 1
  slot = np.where(
    split,
    np.cumsum(split & (p == 0)) - 1,
    np.where(counts[row] > piece, REF_CTA_ROW, REF_WHOLE_ROW),
  )
  return np.ascontiguousarray(np.stack([row, begin, end, slot], axis=1), dtype=np.int32)


def ref_schedules(wbp, wcp, row_ptr, nnz, m, n, options=None):
  """build()'s schedule decisions: (schedule, row_schedule, grouped)."""
  forced_size = None if options is None else options.split_blocks
  want_grouped = None if options is None else options.grouped
  fits = ref_grouped_schedule_fits(wbp, nnz)
  if want_grouped and not fits:
    raise ValueError("grouped")
  grouped = fits and want_grouped is not False and forced_size is None
  size = ref_split_blocks(wbp, nnz) if forced_size is None else forced_size
  schedule = ref_window_schedule(wbp, size, grouped, wcp)
  row_schedule = ref_row_schedule(
    row_ptr, ref_row_piece(nnz), ref_row_order(nnz, int(wcp[-1]), options)
  )
  return schedule, row_schedule, grouped


# -- random inputs --------------------------------------------------------------------------------
def random_counts(rng, size, kind):
  """Lengths (blocks per window, entries per row) with empty ones, ties, every length class and
  a few hubs."""
  if size == 0:
    return np.zeros(0, np.int64)
  if kind == "small":
    c = rng.integers(0, 12, size)
  elif kind == "power":
    c = np.floor(rng.pareto(1.2, size) * 3).astype(np.int64)
  else:  # mixed: empties, short, some long, hubs
    c = rng.integers(0, 40, size)
    c[rng.random(size) < 0.3] = 0
    hubs = rng.random(size) < 0.05
    c[hubs] = rng.integers(100, 5000, hubs.sum())
  return np.minimum(c, 1 << 20).astype(np.int64)


def pointers(counts):
  return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def random_pattern(rng, kind):
  """Validated int64 COO (rows, cols, m, n) of one of several shapes."""
  if kind == "empty":
    m, n = int(rng.integers(1, 50)), int(rng.integers(1, 50))
    return np.zeros(0, np.int64), np.zeros(0, np.int64), m, n
  if kind == "one_row":
    n = int(rng.integers(1, 3000))
    cols = rng.integers(0, n, int(rng.integers(1, 2000)))
    return np.zeros(cols.size, np.int64), cols.astype(np.int64), 1, n
  if kind == "one_entry":
    m, n = int(rng.integers(1, 100)), int(rng.integers(1, 100))
    return (
      np.array([rng.integers(0, m)], np.int64),
      np.array([rng.integers(0, n)], np.int64),
      m,
      n,
    )
  m = int(rng.integers(1, 600))
  n = int(rng.integers(1, 4000))
  if kind == "large":  # past SMALL_GRAPH_NNZ: the large-graph rules
    m, n = 4096, 4096
    per_row = rng.integers(0, 40, m)
    per_row[rng.integers(0, m, 4)] = rng.integers(2000, 4000, 4)  # hubs: CTA items, slots
  else:
    per_row = random_counts(rng, m, "mixed" if kind == "hubs" else "small")
    per_row = np.minimum(per_row, 3 * n)
  rows = np.repeat(np.arange(m), per_row)
  if kind == "banded":  # neighbouring rows share columns: the locality rule
    cols = (rows + rng.integers(0, 5, rows.size)) % n
  else:
    cols = rng.integers(0, n, rows.size)
  return rows.astype(np.int64), cols.astype(np.int64), m, n


OTHER_FIELDS = [f for f in pattern_lib.Pattern._fields if f not in ("schedule", "row_schedule")]
PATTERN_KINDS = ["empty", "one_row", "one_entry", "random", "hubs", "banded", "large"]


def row_ptr_of(p, m):
  return pointers(np.bincount(np.asarray(p.rows, np.int64), minlength=m))


# -- the tests ------------------------------------------------------------------------------------
def test_constants_are_the_reference_values():
  want = dict(
    SPLIT_BLOCKS=REF_SPLIT_BLOCKS,
    GROUP_ITEMS=REF_GROUP_ITEMS,
    GROUPED_MAX_BLOCKS=REF_GROUPED_MAX_BLOCKS,
    SMALL_GRAPH_NNZ=REF_SMALL_GRAPH_NNZ,
    SMALL_GRAPH_PIECE=REF_SMALL_GRAPH_PIECE,
    SMALL_GRAPH_SPLIT=REF_SMALL_GRAPH_SPLIT,
    FEW_HEAVY_WINDOWS=REF_FEW_HEAVY_WINDOWS,
    BLOCKS_PER_PIECE=REF_BLOCKS_PER_PIECE,
    FINE_SPLIT_MIN=REF_FINE_SPLIT_MIN,
    ROW_CTA_PIECES=REF_ROW_CTA_PIECES,
    WHOLE_ROW=REF_WHOLE_ROW,
    CTA_ROW=REF_CTA_ROW,
    ROW_ORDERS=REF_ROW_ORDERS,
    LOCALITY_REUSE=REF_LOCALITY_REUSE,
    LONG_ROW_FACTOR=REF_LONG_ROW_FACTOR,
    SCHEDULE_FIELDS=REF_SCHEDULE_FIELDS,
    WINDOW_ROWS=8,
    BLOCK_COLS=8,
  )
  for name, value in want.items():
    assert getattr(_cpu, name) == value, name
    assert type(getattr(_cpu, name)) is type(value), name
    # pattern.py re-exports the extension's values (nn/batch.py, distributed/ read them there)
    assert getattr(pattern_lib, name) is getattr(_cpu, name), name


def test_scalar_rules_match_the_reference(rng):
  nnzs = np.concatenate(
    [
      np.arange(0, 300),
      [REF_SMALL_GRAPH_NNZ + d for d in range(-3, 4)],
      [(1 << k) + d for k in range(10, 31) for d in (-1, 0, 1)],
      rng.integers(0, 2**31 - 2**16, 200),
    ]
  ).astype(np.int64)
  for nnz in nnzs.tolist():
    assert pattern_lib.row_piece(nnz) == ref_row_piece(nnz), nnz
  # the split rule: 0, 1, a few and many windows past SPLIT_BLOCKS, patterns of any block count
  for heavy in (0, 1, 2, REF_FEW_HEAVY_WINDOWS, REF_FEW_HEAVY_WINDOWS + 1, 100):
    for light in (0, 10, 1000, 7000, 20000, 60000):
      counts = np.concatenate(
        [
          rng.integers(REF_SPLIT_BLOCKS + 1, 300, heavy),
          rng.integers(0, REF_SPLIT_BLOCKS + 1, light),
        ]
      )
      wbp = np.concatenate([[0], np.cumsum(rng.permutation(counts))]).astype(np.int32)
      for nnz in (REF_SMALL_GRAPH_NNZ - 1, REF_SMALL_GRAPH_NNZ, 10**7):
        want = ref_split_blocks(wbp, nnz)
        assert pattern_lib.split_blocks(wbp, nnz) == want, (heavy, light, nnz)
        items = ref_window_schedule(wbp, want, False, None).shape[0]
        assert items <= pattern_lib.window_items_bound(wbp.size - 1, int(wbp[-1]), nnz)
  for piece in list(range(0, 40)) + [256, 1000]:
    assert pattern_lib.row_cta_entries(piece) == ref_row_cta_entries(piece)
  counts = np.arange(-2, 80)
  np.testing.assert_array_equal(pattern_lib.grouped_pieces(counts), ref_grouped_pieces(counts))
  # the row order rule at its threshold: nnz / condensed columns around 1.55
  for cc in list(range(0, 400)) + rng.integers(0, 1 << 30, 300).tolist():
    for nnz in {int(1.55 * max(cc, 1)) + d for d in (-1, 0, 1, 2)}:
      assert pattern_lib.row_order(nnz, cc) == ref_row_order(nnz, cc), (nnz, cc)


@pytest.mark.parametrize("kind", ["small", "power", "mixed"])
def test_window_schedule_matches_the_reference(rng, kind):
  for windows in (0, 1, 2, 7, int(rng.integers(50, 400))):
    counts = random_counts(rng, windows, kind)
    ptr = pointers(counts)
    cptr = pointers(np.maximum(0, 8 * counts - rng.integers(0, 8, windows)))
    for size in list(range(1, 9)) + [16, 31, 32, 33, 40]:
      for dtype in (np.int32, np.int64):
        for col_ptr in (None, cptr):
          got = pattern_lib.window_schedule(
            ptr.astype(dtype), size, False, None if col_ptr is None else col_ptr.astype(dtype)
          )
          want = ref_window_schedule(ptr, size, False, col_ptr)
          assert got.dtype == np.int32 and got.flags.c_contiguous
          np.testing.assert_array_equal(got, want, err_msg=f"size {size}, counts {counts}")
    # grouped: any counts (the builder asks only where they are <= GROUPED_MAX_BLOCKS)
    for col_ptr in (None, cptr):
      np.testing.assert_array_equal(
        pattern_lib.window_schedule(ptr, grouped=True, window_col_ptr=col_ptr),
        ref_window_schedule(ptr, grouped=True, window_col_ptr=col_ptr),
        err_msg=f"grouped, counts {counts}",
      )
    small = np.minimum(counts, REF_GROUPED_MAX_BLOCKS)
    np.testing.assert_array_equal(
      _cpu.window_schedule(pointers(small).astype(np.int32), 32, True, None),
      ref_window_schedule(pointers(small), grouped=True),
    )
    for nnz in (0, REF_SMALL_GRAPH_NNZ - 1, REF_SMALL_GRAPH_NNZ):
      for p in (ptr, pointers(small)):
        assert pattern_lib.grouped_schedule_fits(p, nnz) == ref_grouped_schedule_fits(p, nnz)


@pytest.mark.parametrize("kind", ["small", "power", "mixed"])
def test_row_schedule_matches_the_reference(rng, kind):
  for rows in (0, 1, 2, 9, int(rng.integers(100, 3000))):
    counts = random_counts(rng, rows, kind)
    ptr = pointers(counts)
    for piece in (1, 2, 7, 8, 16, 32, 64, 128, 256, 1000):
      for order in REF_ROW_ORDERS:
        for dtype in (np.int32, np.int64):
          got = pattern_lib.row_schedule(ptr.astype(dtype), piece, order)
          assert got.dtype == np.int32 and got.flags.c_contiguous
          np.testing.assert_array_equal(
            got, ref_row_schedule(ptr, piece, order), err_msg=f"{order}, piece {piece}"
          )


@pytest.mark.parametrize("kind", PATTERN_KINDS)
def test_build_matches_the_reference(rng, kind):
  """build() returns, in one call, the schedules the numpy builder cut from its arrays, under
  every FormatOptions."""
  for _ in range(3 if kind != "large" else 1):
    rows, cols, m, n = random_pattern(rng, kind)
    options = [
      None,
      jst.FormatOptions(grouped=False),
      jst.FormatOptions(row_order="length"),
      jst.FormatOptions(row_order="locality"),
      jst.FormatOptions(grouped=True),
      jst.FormatOptions(split_blocks=int(rng.integers(1, REF_SPLIT_BLOCKS + 1))),
      jst.FormatOptions(split_blocks=1, row_order="locality"),
      jst.FormatOptions(split_blocks=REF_SPLIT_BLOCKS, grouped=False, row_order="length"),
    ]
    for r, c, mm, nn in ((rows, cols, m, n), (cols, rows, n, m)):  # both orientations
      base, _, _ = pattern_lib.build(r, c, mm, nn)
      wbp, wcp = base.window_block_ptr, base.window_col_ptr
      row_ptr = row_ptr_of(base, mm)
      nnz = base.rows.shape[0]
      for opts in options:
        try:
          want = ref_schedules(wbp, wcp, row_ptr, nnz, mm, nn, opts)
        except ValueError:
          with pytest.raises(ValueError, match="grouped"):
            pattern_lib.build(r, c, mm, nn, opts)
          continue
        p, to_format, grouped = pattern_lib.build(r, c, mm, nn, opts)
        assert grouped == want[2] and type(grouped) is bool
        np.testing.assert_array_equal(p.schedule, want[0], err_msg=f"{kind} {opts}")
        np.testing.assert_array_equal(p.row_schedule, want[1], err_msg=f"{kind} {opts}")
        for name in OTHER_FIELDS:
          np.testing.assert_array_equal(getattr(p, name), getattr(base, name))
        assert p.schedule.dtype == p.row_schedule.dtype == np.int32
        assert p.schedule.shape[1] == REF_SCHEDULE_FIELDS and p.row_schedule.shape[1] == 4


def test_build_covers_every_rule(rng):
  """The random patterns above reach every branch of the rules: grouped and not, both automatic
  row orders, split windows, CTA items with and without slots, large and small graphs."""
  seen = set()
  for kind in PATTERN_KINDS:
    for _ in range(3):
      rows, cols, m, n = random_pattern(rng, kind)
      p, _, grouped = pattern_lib.build(rows, cols, m, n)
      nnz = p.rows.shape[0]
      seen.add(("grouped", grouped))
      seen.add(("order", ref_row_order(nnz, int(p.window_col_ptr[-1]))))
      seen.add(("large", nnz >= REF_SMALL_GRAPH_NNZ))
      seen.update(("slot", int(s)) for s in np.unique(np.minimum(p.row_schedule[:, 3], 0)))
      seen.add(("split", bool((p.schedule[:, 3] > 0).any())))
  want = {("grouped", True), ("grouped", False), ("order", "length"), ("order", "locality")}
  want |= {("large", True), ("large", False), ("split", True), ("split", False)}
  want |= {("slot", REF_WHOLE_ROW), ("slot", REF_CTA_ROW), ("slot", 0)}
  assert want <= seen, want - seen


def test_grouped_error_names_the_orientation():
  rows = np.repeat(np.arange(8), 300).astype(np.int64)
  cols = np.arange(rows.size, dtype=np.int64) % 5000
  with pytest.raises(ValueError, match=r"the 8 x 5000 orientation has 2400 nonzeros and a window"):
    pattern_lib.build(rows, cols, 8, 5000, jst.FormatOptions(grouped=True))


def test_reschedule_matches_the_reference(rng):
  """padding.reschedule: both schedules by the rules of the padded nnz (the row order by the
  pattern's own nonzeros)."""
  for kind in ("random", "hubs", "banded", "one_row", "empty"):
    rows, cols, m, n = random_pattern(rng, kind)
    p, _, _ = pattern_lib.build(rows, cols, m, n)
    nnz = p.rows.shape[0]
    row_ptr = row_ptr_of(p, m)
    for nnz_pad in (nnz, nnz + 5, REF_SMALL_GRAPH_NNZ, 3 * REF_SMALL_GRAPH_NNZ + 7):
      for grouped in (False, True):
        if grouped and not ref_grouped_schedule_fits(p.window_block_ptr, nnz_pad):
          continue
        for size in (None, 1, 7, 32):
          r = padding.reschedule(p, m, nnz_pad, grouped, size)
          want_size = ref_split_blocks(p.window_block_ptr, nnz_pad) if size is None else size
          np.testing.assert_array_equal(
            r.schedule,
            ref_window_schedule(p.window_block_ptr, want_size, grouped, p.window_col_ptr),
          )
          order = ref_row_order(nnz, int(p.window_col_ptr[-1]))
          np.testing.assert_array_equal(
            r.row_schedule, ref_row_schedule(row_ptr, ref_row_piece(nnz_pad), order)
          )


def test_schedule_argument_errors():
  with pytest.raises(ValueError, match="size must be >= 1"):
    pattern_lib.window_schedule(np.array([0, 3]), 0)
  with pytest.raises(ValueError, match="row order"):
    _cpu.row_schedule(np.array([0, 3]), 8, "random")
  one = np.zeros(1, np.int64)
  with pytest.raises(ValueError, match="row order"):
    _cpu.build_pattern(one, one, 1, 1, row_order="random")
  with pytest.raises(ValueError, match="window_col_ptr"):
    _cpu.window_schedule(np.array([0, 3], np.int32), 8, False, np.array([0], np.int32))
