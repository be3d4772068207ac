"""The format: construction from every input kind, structure invariants, accessors, errors."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import random_coo, window_blocks_coo

import jaxsparse_tc as jst
from jaxsparse_tc import SparseMatrix
from jaxsparse_tc._src.pattern import SPLIT_BLOCKS, split_blocks, window_schedule

# The CPU kernels: GPU kernels are checked against them in tests/test_gpu_*.py.
pytestmark = pytest.mark.usefixtures("on_cpu")

SHAPES = [(1, 1), (7, 5), (8, 8), (17, 33), (64, 40), (131, 97)]


def scipy_of(rows, cols, vals, shape):
  return sp.coo_matrix((vals.astype(np.float64), (rows, cols)), shape=shape).toarray()


def decode(pattern, nnz):
  """Independent Python decoding of the bitmap format into (row, col) per value."""
  p = jax.tree.map(np.asarray, pattern)
  rows = np.full(nnz, -1, np.int64)
  cols = np.full(nnz, -1, np.int64)
  for w in range(len(p.window_col_ptr) - 1):
    wcols = p.window_cols[p.window_col_ptr[w] : p.window_col_ptr[w + 1]]
    assert np.all(np.diff(wcols) > 0), "condensed columns sorted and unique"
    blocks = range(p.window_block_ptr[w], p.window_block_ptr[w + 1])
    assert len(blocks) == -(-len(wcols) // 8)
    for i, b in enumerate(blocks):
      bits = int(p.block_bitmap[b, 0]) | (int(p.block_bitmap[b, 1]) << 32)
      idx = p.block_value_ptr[b]
      for k in range(64):
        if bits >> k & 1:
          c, r = divmod(k, 8)
          assert 8 * i + c < len(wcols), "bit beyond the block's columns"
          rows[idx], cols[idx] = 8 * w + r, wcols[8 * i + c]
          idx += 1
      assert idx == p.block_value_ptr[b + 1]
  return rows, cols


@pytest.mark.parametrize("shape", SHAPES)
def test_from_coo_matches_scipy(rng, shape):
  m, n = shape
  rows, cols, vals = random_coo(rng, m, n, 0.3)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=shape)
  ref = scipy_of(rows, cols, vals, shape)
  np.testing.assert_allclose(np.asarray(A.todense()), ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(A.to_scipy().toarray(), ref, rtol=1e-5, atol=1e-5)
  assert A.nnz == np.count_nonzero(np.abs(scipy_of(rows, cols, np.ones_like(vals), shape)))
  # every value sits where the bitmap says, and A.rows/A.cols agree with it
  r, c = decode(A.pattern, A.nnz)
  np.testing.assert_array_equal(r, np.asarray(A.rows))
  np.testing.assert_array_equal(c, np.asarray(A.cols))
  np.testing.assert_allclose(ref[r, c], np.asarray(A.values), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_transpose_structure(rng, shape):
  rows, cols, vals = random_coo(rng, *shape, 0.25)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=shape)
  At = A.T
  assert At.shape == shape[::-1]
  np.testing.assert_allclose(np.asarray(At.todense()), np.asarray(A.todense()).T)
  r, c = decode(At.pattern, At.nnz)
  np.testing.assert_array_equal(r, np.asarray(At.rows))
  np.testing.assert_array_equal(np.asarray(A.perm_t)[np.asarray(A.perm_t_inv)], np.arange(A.nnz))
  np.testing.assert_allclose(np.asarray(At.T.todense()), np.asarray(A.todense()))


def test_schedule_covers_every_block_once(rng):
  # a dense band gives windows with many blocks, so some get split
  m, n = 40, 2000
  per_window = np.array([900, 10, 600, 2, 300])  # entries per row: some windows split, some not
  rows = np.repeat(np.arange(m), np.repeat(per_window, 8))
  cols = rng.integers(0, n, rows.size)
  A = SparseMatrix.from_coo(rows, cols, shape=(m, n))
  sched = np.asarray(A.pattern.schedule)
  ptr = np.asarray(A.pattern.window_block_ptr)
  seen = np.zeros(A.pattern.num_blocks, np.int64)
  windows = set()
  piece = split_blocks(ptr, A.nnz)
  assert piece < SPLIT_BLOCKS, "a small graph: pieces shorter than SPLIT_BLOCKS"
  cptr = np.asarray(A.pattern.window_col_ptr)
  for i, (w, b0, b1, split, c0, c1, first, pieces) in enumerate(sched):
    assert ptr[w] <= b0 <= b1 <= ptr[w + 1]
    assert c0 == cptr[w] + 8 * (b0 - ptr[w]) and c1 == cptr[w + 1]
    assert pieces == max(1, -(-(ptr[w + 1] - ptr[w]) // piece)) and first <= i < first + pieces
    assert sched[first, 0] == w and sched[first, 1] == ptr[w]
    assert b1 - b0 <= piece
    assert split == (piece if ptr[w + 1] - ptr[w] > piece else 0)
    seen[b0:b1] += 1
    windows.add(int(w))
  assert np.all(seen == 1)
  assert windows == set(range(len(ptr) - 1))
  assert sched[:, 3].any() and not sched[:, 3].all(), "this pattern should split some windows"
  window_blocks = np.diff(ptr)[sched[:, 0]]
  assert np.all(np.diff(window_blocks) <= 0), "heaviest windows first"
  split = sched[:, 3].astype(bool)
  assert split[: split.sum()].all(), "split items are the schedule's prefix"
  for i in np.flatnonzero(split):  # piece p of a window sits p items after its first piece
    p = (sched[i, 1] - ptr[sched[i, 0]]) // piece
    assert sched[i - p, 0] == sched[i, 0] and sched[i - p, 1] == ptr[sched[i, 0]]
    assert sched[i, 1] == ptr[sched[i, 0]] + p * piece


def _check_grouped_schedule(sched: np.ndarray, ptr: np.ndarray) -> None:
  """Every block once; a split window's 2 or 4 pieces equal-sized, in order, and inside one
  aligned group of GROUP_ITEMS items (what the attention forward's in-CTA merge needs)."""
  from jaxsparse_tc._src.pattern import GROUP_ITEMS, grouped_pieces

  counts = np.diff(ptr)
  seen = np.zeros(ptr[-1], np.int64)
  for i, (w, b0, b1, split, _, _, first_field, pieces_field) in enumerate(sched):
    seen[b0:b1] += 1
    want = grouped_pieces(counts[w])
    if want == 1:
      assert split == 0 and (b0, b1) == (ptr[w], ptr[w + 1])
      continue
    pieces = -(-counts[w] // split)
    piece = (b0 - ptr[w]) // split
    assert pieces == want == pieces_field and b0 == ptr[w] + piece * split and b1 - b0 <= split
    first = i - piece
    assert first == first_field
    assert sched[first, 0] == w and first % GROUP_ITEMS + pieces <= GROUP_ITEMS
  assert np.all(seen == 1)
  assert np.all(np.diff(counts[sched[:, 0]]) <= 0), "heaviest windows first"


def test_grouped_schedule_on_small_graphs(rng):
  from jaxsparse_tc._src.pattern import GROUPED_MAX_BLOCKS

  rows, cols, shape = window_blocks_coo(rng, GROUPED_MAX_BLOCKS)
  A = SparseMatrix.from_coo(rows, cols, shape=shape)
  ptr = np.asarray(A.pattern.window_block_ptr)
  assert np.diff(ptr).max() <= GROUPED_MAX_BLOCKS and A.grouped[0]
  sched = np.asarray(A.pattern.schedule)
  split = sched[:, 3]
  pieces = np.where(split > 0, -(-np.diff(ptr)[sched[:, 0]] // np.maximum(split, 1)), 1)
  assert set(pieces.tolist()) == {1, 2, 4}, "whole windows, two and four pieces"
  _check_grouped_schedule(sched, ptr)
  assert A.T.grouped == A.grouped[::-1] and A.with_values(A.values).grouped == A.grouped
  leaves, tree = jax.tree_util.tree_flatten(A)
  assert jax.tree_util.tree_unflatten(tree, leaves).grouped == A.grouped
  assert jax.jit(lambda B: B)(A).grouped == A.grouped


def test_grouped_schedule_only_where_it_fits(rng):
  from jaxsparse_tc._src.pattern import GROUPED_MAX_BLOCKS, grouped_schedule_fits

  # one window past GROUPED_MAX_BLOCKS blocks: pieces of 4 merged across CTAs instead
  ptr = np.array([0, 3, GROUPED_MAX_BLOCKS + 4])
  assert grouped_schedule_fits(np.array([0, 3, GROUPED_MAX_BLOCKS]), 1000)
  assert not grouped_schedule_fits(ptr, 1000)
  assert not grouped_schedule_fits(np.array([0, 3]), 1 << 20), "large graphs are never grouped"
  rows = np.repeat(np.arange(8), 300)
  A = SparseMatrix.from_coo(rows, rng.integers(0, 5000, rows.size), shape=(8, 5000))
  assert not A.grouped[0] and np.asarray(A.pattern.schedule)[:, 3].max() == 4
  # Small enough to be grouped by default; FormatOptions turns that off or asks for it.
  rows = np.repeat(np.arange(8), 40)
  cols = rng.integers(0, 500, rows.size)
  assert SparseMatrix.from_coo(rows, cols, shape=(8, 500)).grouped == (True, True)
  for fo in (jst.FormatOptions(grouped=False), jst.FormatOptions(split_blocks=4)):
    B = SparseMatrix.from_coo(rows, cols, shape=(8, 500), format_options=fo)
    assert B.grouped == (False, False)
  with pytest.raises(ValueError, match="grouped"):
    SparseMatrix.from_coo(
      np.repeat(np.arange(8), 300),
      rng.integers(0, 5000, 2400),
      shape=(8, 5000),
      format_options=jst.FormatOptions(grouped=True),
    )
  for count in range(1, GROUPED_MAX_BLOCKS + 1):
    _check_grouped_schedule(
      window_schedule(np.array([0, count, count + 1]), grouped=True),
      np.array([0, count, count + 1]),
    )


def test_group_items_match_the_kernels():
  """The attention forward maps a CTA onto one group of a grouped schedule, and every window
  kernel reads items of kScheduleFields fields (format.h): pattern.py takes both from the
  extension, which exports format.h's constants."""
  from jaxsparse_tc import _cpu
  from jaxsparse_tc._src.pattern import GROUP_ITEMS, SCHEDULE_FIELDS

  A_SCHEDULE_WIDTH = SparseMatrix.from_coo([0, 3], [1, 2]).pattern.schedule.shape[1]
  assert GROUP_ITEMS is _cpu.GROUP_ITEMS
  assert SCHEDULE_FIELDS is _cpu.SCHEDULE_FIELDS and SCHEDULE_FIELDS == A_SCHEDULE_WIDTH


def test_row_view_is_csr_of_the_format(rng):
  """The row view lists every value once, rows in order, columns ascending inside a row, with
  the format position of each (A and A^T), and its schedule covers each row's entries once."""
  from jaxsparse_tc._src.pattern import row_schedule

  m, n = 45, 1000
  per_row = rng.integers(0, 80, m)
  per_row[[3, 17]] = 0  # empty rows
  per_row[5] = 1500  # ~780 distinct columns: several CTA items for short pieces
  rows = np.repeat(np.arange(m), per_row)
  cols = rng.integers(0, n, rows.size)
  A = SparseMatrix.from_coo(rows, cols, shape=(m, n))
  for P in (A.pattern, A.pattern_t):
    ent = np.asarray(P.row_entries)
    fr, fc = np.asarray(P.rows), np.asarray(P.cols)
    assert ent.shape == (fr.size, 2)
    np.testing.assert_array_equal(np.sort(ent[:, 1]), np.arange(fr.size))
    np.testing.assert_array_equal(fc[ent[:, 1]], ent[:, 0])
    r = fr[ent[:, 1]]
    assert np.all(np.diff(r) >= 0), "rows in order"
    same = np.diff(r) == 0
    assert np.all(np.diff(ent[:, 0])[same] > 0), "columns ascending inside a row"
  ptr = np.concatenate([[0], np.cumsum(np.bincount(np.asarray(A.rows), minlength=m))])
  from jaxsparse_tc._src.pattern import (
    CTA_ROW,
    ROW_CTA_PIECES,
    ROW_ORDERS,
    WHOLE_ROW,
    row_cta_entries,
  )

  for piece, order in itertools.product((1, 2, 7, 32, 1000), ROW_ORDERS):
    sched = row_schedule(ptr, piece, order)
    cap = row_cta_entries(piece)
    assert cap == ROW_CTA_PIECES * max(piece, 16)
    seen = np.zeros(ptr[-1], np.int64)
    assert set(sched[:, 0]) == set(range(m)), "every row (empty ones too) has an item"
    for row, b, e, slot in sched:
      length = ptr[row + 1] - ptr[row]
      assert ptr[row] <= b <= e <= ptr[row + 1] and e - b <= cap
      assert (slot == WHOLE_ROW) == (length <= piece)
      assert (slot == CTA_ROW) == (piece < length <= cap)
      assert (slot >= 0) == (length > cap)
      if slot == WHOLE_ROW or slot == CTA_ROW:
        assert (b, e) == (ptr[row], ptr[row + 1])
      seen[b:e] += 1
    assert np.all(seen == 1)
    cta = sched[:, 3] != WHOLE_ROW
    split = sched[:, 3] >= 0
    assert cta[: cta.sum()].all(), "CTA items are the schedule's prefix"
    assert split[: split.sum()].all(), "slotted items are the prefix of those"
    slots = sched[split, 3]
    assert np.all(np.diff(slots) >= 0) and (slots.size == 0 or slots.max() + 1 == len(set(slots)))
    _check_row_order(sched, np.diff(ptr), piece, order)
    if piece == 2:
      assert split.any() and (cta & ~split).any(), "the test covers every kind of item"


def _check_row_order(sched, counts, piece, order):
  """The row schedule's order (pattern.row_schedule): CTA items first, longest first; empty rows
  last; whole rows between by length class ("length") or long rows first, then row order
  ("locality")."""
  from jaxsparse_tc._src.pattern import LONG_ROW_FACTOR, WHOLE_ROW

  first = np.concatenate([[True], sched[1:, 0] != sched[:-1, 0]])
  rows = sched[first, 0]  # each row once, in schedule order
  n = counts[rows]
  cta = n > piece
  assert cta[: cta.sum()].all() and np.all(np.diff(n[cta]) <= 0), "CTA rows first, longest first"
  whole = n[~cta]
  assert np.all(np.diff((whole == 0).astype(np.int64)) >= 0), "empty rows last"
  w_rows, w_n = rows[~cta][whole > 0], whole[whole > 0]
  if order == "length":
    cls = np.floor(np.log2(w_n))
    assert np.all(np.diff(cls) <= 0), "longest class first"
    same = np.diff(cls) == 0
    assert np.all(np.diff(w_rows)[same] > 0), "row order inside a class"
  else:
    long_row = w_n > LONG_ROW_FACTOR * max(counts.sum() / counts.size, 1.0)
    assert long_row[: long_row.sum()].all() and np.all(np.diff(w_n[long_row]) <= 0)
    assert np.all(np.diff(w_rows[~long_row]) > 0), "then the rest in row order"
  assert np.all(sched[~np.isin(sched[:, 0], rows[cta]), 3] == WHOLE_ROW)


def test_row_order_rule(rng):
  """row_order: "locality" where the windows reuse their columns (a banded matrix), "length"
  where they do not (random columns); FormatOptions.row_order overrides the rule and is
  checked."""
  from jaxsparse_tc._src import padding
  from jaxsparse_tc._src.pattern import row_order, row_piece, row_schedule

  m, n = 512, 4096
  rows = np.repeat(np.arange(m), rng.integers(1, 13, m))  # lengths in several classes
  band = (rows + rng.integers(0, 4, rows.size)) % n  # 8 rows share ~11 columns
  scattered = rng.integers(0, n, rows.size)
  # the threshold, between pubmed in affinity order (1.50: by length) and DD's own order (1.58)
  assert row_order(150, 100) == "length" and row_order(155, 100) == "locality"
  for cols, want in ((band, "locality"), (scattered, "length")):
    A = SparseMatrix.from_coo(rows, cols, shape=(m, n))
    P = A.pattern
    assert row_order(A.nnz, int(np.asarray(P.window_col_ptr)[-1])) == want
    counts = np.bincount(np.asarray(P.rows), minlength=m)
    ptr = np.concatenate([[0], np.cumsum(counts)])
    np.testing.assert_array_equal(
      np.asarray(P.row_schedule), row_schedule(ptr, row_piece(A.nnz), want)
    )
    other = "length" if want == "locality" else "locality"
    B = SparseMatrix.from_coo(
      rows, cols, shape=(m, n), format_options=jst.FormatOptions(row_order=other)
    )
    np.testing.assert_array_equal(
      np.asarray(B.pattern.row_schedule), row_schedule(ptr, row_piece(A.nnz), other)
    )
    assert not np.array_equal(
      np.asarray(A.pattern.row_schedule), np.asarray(B.pattern.row_schedule)
    )
    # padded patterns (batches, shards) keep the order of their own nonzeros
    nnz_pad = 2 * A.nnz
    R = padding.reschedule(P, m, nnz_pad, grouped=False)
    np.testing.assert_array_equal(R.row_schedule, row_schedule(ptr, row_piece(nnz_pad), want))
  for bad in ("rows", 1, True):
    with pytest.raises(ValueError, match="row_order"):
      jst.FormatOptions(row_order=bad)
  with pytest.raises(ValueError, match="row order"):
    row_schedule(ptr, 8, "random")


def test_window_schedule_order():
  """Split windows first by decreasing block count, then whole windows by length class (block
  counts within 2x), heaviest class first, window order inside; empty windows last; each item's
  `first` field points at itself."""
  counts = np.array([3, 0, 40, 2, 7, 3, 1, 70, 0, 6, 2, 5])
  ptr = np.concatenate([[0], np.cumsum(counts)])
  s = window_schedule(ptr, 32)
  split = s[:, 7] > 1
  assert split[: split.sum()].all()
  assert s[split, 0].tolist() == [7, 7, 7, 2, 2]
  assert s[~split, 0].tolist() == [4, 9, 11, 0, 3, 5, 10, 6, 1, 8]
  np.testing.assert_array_equal(s[~split, 6], np.flatnonzero(~split))
  np.testing.assert_array_equal(s[:3, 6], [0, 0, 0])
  np.testing.assert_array_equal(s[3:5, 6], [3, 3])


def test_split_blocks_matches_the_kernels():
  """The CUDA kernels find a piece's first sibling with format.h's kSplitBlocks, which the
  extension exports."""
  from jaxsparse_tc import _cpu

  assert SPLIT_BLOCKS is _cpu.SPLIT_BLOCKS


def test_row_slots_match_the_kernels():
  """The row kernels tell whole rows from CTA items by format.h's slot marks, which the
  extension exports and pattern.py re-exports; the row schedule uses them."""
  from jaxsparse_tc import _cpu
  from jaxsparse_tc._src.pattern import CTA_ROW, WHOLE_ROW

  assert (WHOLE_ROW, CTA_ROW) == (_cpu.WHOLE_ROW, _cpu.CTA_ROW) and WHOLE_ROW != CTA_ROW
  slots = np.asarray(SparseMatrix.from_coo([0, 0, 3], [1, 2, 0]).pattern.row_schedule)[:, 3]
  assert set(slots.tolist()) <= {WHOLE_ROW, CTA_ROW} and WHOLE_ROW in slots


def test_small_graph_piece_matches_the_kernels():
  """The SDDMM row kernel shares a small graph's long rows down to its row piece, format.h's
  kSmallGraphRowPiece under kSmallGraphNnz, which the extension exports."""
  from jaxsparse_tc import _cpu
  from jaxsparse_tc._src.pattern import SMALL_GRAPH_NNZ, SMALL_GRAPH_PIECE, row_piece

  assert SMALL_GRAPH_NNZ is _cpu.SMALL_GRAPH_NNZ and SMALL_GRAPH_PIECE is _cpu.SMALL_GRAPH_PIECE
  assert row_piece(SMALL_GRAPH_NNZ - 1) == SMALL_GRAPH_PIECE != row_piece(SMALL_GRAPH_NNZ)


def test_split_blocks_by_graph_size():
  """Small graphs get short pieces; the schedule's fourth field carries the piece size."""
  from jaxsparse_tc._src.pattern import SMALL_GRAPH_NNZ, SMALL_GRAPH_SPLIT

  light = np.arange(0, 8 * 200_001, 8)  # 200,000 windows of 8 blocks
  assert split_blocks(light, SMALL_GRAPH_NNZ - 1) == SMALL_GRAPH_SPLIT < SPLIT_BLOCKS
  assert split_blocks(light, SMALL_GRAPH_NNZ) == SPLIT_BLOCKS
  s = window_schedule(np.array([0, 70, 71]), 32)
  assert s[:, 3].tolist() == [32, 32, 32, 0]
  assert s[:3, 1].tolist() == [0, 32, 64] and s[:3, 2].tolist() == [32, 64, 70]
  rows = np.repeat(np.arange(8), 300)  # one window of 300 columns: 38 blocks
  cols = np.random.default_rng(0).integers(0, 5000, rows.size)
  A = SparseMatrix.from_coo(
    rows, cols, shape=(8, 5000), format_options=jst.FormatOptions(split_blocks=16)
  )
  assert np.asarray(A.pattern.schedule)[:, 3].max() == 16
  for bad in (0, 33, "4", True):
    with pytest.raises(ValueError, match="split_blocks"):
      jst.FormatOptions(split_blocks=bad)
  with pytest.raises(TypeError, match="FormatOptions"):
    SparseMatrix.from_coo(rows, cols, shape=(8, 5000), format_options={"split_blocks": 4})


def test_a_few_heavy_windows_get_finer_pieces():
  """Past SMALL_GRAPH_NNZ, a pattern whose only long windows are a few (1..FEW_HEAVY_WINDOWS
  past SPLIT_BLOCKS blocks) cuts them, and every window past the piece size, into pieces of about
  blocks / BLOCKS_PER_PIECE (FINE_SPLIT_MIN..SPLIT_BLOCKS); with none or many, SPLIT_BLOCKS."""
  from jaxsparse_tc._src.pattern import (
    BLOCKS_PER_PIECE,
    FEW_HEAVY_WINDOWS,
    FINE_SPLIT_MIN,
    SMALL_GRAPH_NNZ,
  )

  def coo(heavy, light, light_blocks):
    """`heavy` windows of 50 blocks, then `light` of `light_blocks`, each row of a window its
    own columns (8 nonzeros per block), as COO of a matrix of 4096 columns."""
    counts = np.array([50] * heavy + [light_blocks] * light)
    per_row = np.repeat(counts, 8)  # a window of c blocks: 8 rows of c columns, 8c distinct
    rows = np.repeat(np.arange(per_row.size), per_row)
    first = np.cumsum(per_row) - per_row  # each row's first entry
    cols = (np.arange(rows.size) - first[rows] + (rows % 8) * per_row[rows]) % 4096
    return rows, cols, (per_row.size, 4096)

  for heavy, light, light_blocks, want in (
    (1, 1100, 8, FINE_SPLIT_MIN),  # ~8.8k blocks: pieces of 8
    (FEW_HEAVY_WINDOWS, 1100, 8, FINE_SPLIT_MIN),
    (FEW_HEAVY_WINDOWS + 1, 1100, 8, SPLIT_BLOCKS),  # many long windows: no finer pieces
    (0, 1100, 8, SPLIT_BLOCKS),  # none past SPLIT_BLOCKS: nothing to shorten
    (2, 16 * BLOCKS_PER_PIECE // 16, 16, 16),  # ~16 x BLOCKS_PER_PIECE blocks: pieces of 16
  ):
    rows, cols, shape = coo(heavy, light, light_blocks)
    A = SparseMatrix.from_coo(rows, cols, shape=shape)
    assert A.nnz >= SMALL_GRAPH_NNZ
    ptr = np.asarray(A.pattern.window_block_ptr)
    counts = np.diff(ptr)
    assert (counts > SPLIT_BLOCKS).sum() == heavy
    assert split_blocks(ptr, A.nnz) == want, (heavy, light)
    sched = np.asarray(A.pattern.schedule)
    split = counts[sched[:, 0]] > want
    assert (sched[split, 3] == want).all() and (sched[~split, 3] == 0).all()
    assert sched.shape[0] == sum(max(1, -(-int(c) // want)) for c in counts)
  # a forced piece size wins over the rule
  rows, cols, shape = coo(1, 1100, 8)
  forced = jst.FormatOptions(split_blocks=32)
  A = SparseMatrix.from_coo(rows, cols, shape=shape, format_options=forced)
  assert np.asarray(A.pattern.schedule)[:, 3].max() == 32


def test_schedule_includes_empty_windows():
  s = window_schedule(np.array([0, 0, 3, 3, 100]))
  assert sorted(set(s[:, 0].tolist())) == [0, 1, 2, 3]


def test_duplicates_summed_and_values_none_means_ones():
  rows = [2, 0, 2, 2, 1]
  cols = [1, 3, 1, 1, 0]
  A = SparseMatrix.from_coo(rows, cols, shape=(3, 4))
  ref = np.zeros((3, 4))
  ref[2, 1], ref[0, 3], ref[1, 0] = 3, 1, 1
  np.testing.assert_array_equal(np.asarray(A.todense()), ref)
  assert A.nnz == 3
  assert A.values.dtype == jnp.float32


def test_input_order_round_trip(rng):
  rows, cols, vals = random_coo(rng, 30, 20, 0.2, duplicates=0.3)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=(30, 20))
  np.testing.assert_allclose(
    np.asarray(A.values_from_input(vals)), np.asarray(A.values), rtol=1e-5, atol=1e-6
  )
  back = np.asarray(A.values_to_input())
  dense = scipy_of(rows, cols, vals, (30, 20))
  np.testing.assert_allclose(back, dense[rows, cols], rtol=1e-5, atol=1e-6)
  # the transpose keeps the input correspondence
  np.testing.assert_allclose(np.asarray(A.T.values_to_input()), back, rtol=1e-6)


def test_empty_rows_columns_single_and_zero_nnz():
  A = SparseMatrix.from_coo([5], [3], [2.5], shape=(20, 9))
  assert A.nnz == 1 and A.pattern.num_blocks == 1
  d = np.asarray(A.todense())
  assert d[5, 3] == 2.5 and np.count_nonzero(d) == 1
  Z = SparseMatrix.from_coo([], [], shape=(10, 7))
  assert Z.nnz == 0 and Z.pattern.num_blocks == 0 and Z.shape == (10, 7)
  np.testing.assert_array_equal(np.asarray(Z.todense()), np.zeros((10, 7)))
  assert Z.T.shape == (7, 10)


def test_from_scipy_and_edge_index(rng, cora):
  A = SparseMatrix.from_scipy(cora)
  assert A.shape == cora.shape and A.nnz == cora.nnz
  np.testing.assert_array_equal(A.to_scipy().toarray(), cora.toarray())
  coo = cora.tocoo()
  B = SparseMatrix.from_edge_index(np.stack([coo.row, coo.col]), cora.shape[0])
  np.testing.assert_array_equal(B.to_scipy().toarray(), cora.toarray())
  # scipy arrays (not only matrices) and explicit zeros are entries
  m = sp.csr_array(([0.0, 1.0], ([0, 1], [1, 0])), shape=(2, 2))
  assert SparseMatrix.from_scipy(m).nnz == 2


def test_heads_values_and_with_values(rng):
  rows, cols, _ = random_coo(rng, 16, 16, 0.3, duplicates=0)
  vals = rng.standard_normal((3, rows.size)).astype(np.float32)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=(16, 16))
  assert A.values.shape == (3, A.nnz) and A.num_heads == 3
  for h in range(3):
    np.testing.assert_allclose(
      np.asarray(A.todense()[h]), scipy_of(rows, cols, vals[h], (16, 16)), rtol=1e-6, atol=1e-6
    )
  B = A.with_values(jnp.ones(A.nnz))
  assert B.values.shape == (A.nnz,)
  with pytest.raises(ValueError, match=str(A.nnz)):
    A.with_values(jnp.ones(A.nnz + 1))


def test_pytree_round_trip_and_jit(rng):
  rows, cols, vals = random_coo(rng, 12, 9, 0.3)
  A = SparseMatrix.from_coo(rows, cols, vals, shape=(12, 9))
  leaves, tree = jax.tree.flatten(A)
  B = jax.tree.unflatten(tree, leaves)
  assert B.shape == A.shape and B.nnz == A.nnz
  dense = jax.jit(lambda M: M.todense())(A)
  np.testing.assert_allclose(np.asarray(dense), np.asarray(A.todense()))


# -- errors at construction -------------------------------------------------------------------
@pytest.mark.parametrize(
  "rows,cols,shape,match",
  [
    ([0, -1], [0, 1], (3, 3), "negative row"),
    ([0, 1], [0, -2], (3, 3), "negative column"),
    ([0, 3], [0, 1], (3, 3), "row index 3 is out of range"),
    ([0, 1], [0, 5], (3, 3), "column index 5 is out of range"),
    ([0, 1], [0, 1], (3, -1), "non-negative"),
    ([0, 1], [0, 1], (3, 3, 3), "pair"),
    ([0, 1], [0], (3, 3), "differ in length"),
    ([[0, 1]], [[0, 1]], (3, 3), "one-dimensional"),
    ([0.5, 1.0], [0, 1], (3, 3), "integers"),
  ],
)
def test_bad_indices_raise(rows, cols, shape, match):
  with pytest.raises(ValueError, match=match):
    SparseMatrix.from_coo(rows, cols, shape=shape)


def test_entry_limit_leaves_int32_headroom(monkeypatch):
  """Entry positions are int32 and kernels step past a row's end: the cap keeps headroom, and
  a matrix over the cap is refused before anything is built."""
  from jaxsparse_tc._src import sparse_matrix

  assert sparse_matrix._MAX_ENTRIES <= 2**31 - 2**16
  monkeypatch.setattr(sparse_matrix, "_MAX_ENTRIES", 3)
  with pytest.raises(ValueError, match="at most 3 entries"):
    SparseMatrix.from_coo([0, 1, 1, 0], [0, 1, 0, 1], shape=(2, 2))
  SparseMatrix.from_coo([0, 1, 1], [0, 1, 0], shape=(2, 2))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_raise(bad):
  with pytest.raises(ValueError, match="finite"):
    SparseMatrix.from_coo([0, 1], [1, 0], [1.0, bad], shape=(2, 2))
  with pytest.raises(ValueError, match="finite"):
    SparseMatrix.from_scipy(sp.csr_matrix(np.array([[0.0, bad], [1.0, 0.0]])))


def test_bad_values_and_edge_index_shapes():
  with pytest.raises(ValueError, match="values must have shape"):
    SparseMatrix.from_coo([0, 1], [1, 0], [1.0, 2.0, 3.0], shape=(2, 2))
  with pytest.raises(ValueError, match=r"\[2, E\]"):
    SparseMatrix.from_edge_index(np.zeros((3, 4), np.int64), 5)
  with pytest.raises(ValueError, match="out of range"):
    SparseMatrix.from_edge_index(np.array([[0, 9], [1, 2]]), 5)
