"""Sizes past int32 without billions of entries: the offset, count and partition arithmetic of the
builders and the sharding path driven past 2^31 (and 2^32) with tiny arrays of huge counts,
checked exactly against Python integers; a sharded graph's total may pass the format's entry
limit while each shard stays under it; what passes a per-format int32 limit is refused up front
with a message naming the limit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from jaxsparse_tc import _cpu, reorder
from jaxsparse_tc._src import integrity
from jaxsparse_tc._src import pattern as pattern_lib
from jaxsparse_tc._src import sparse_matrix as sm
from jaxsparse_tc._src.distributed import partition

LIMIT = integrity.MAX_ENTRIES


def _prefix(counts) -> list[int]:
  return [0, *itertools.accumulate(int(c) for c in counts)]


def test_extension_and_python_limits_agree():
  assert _cpu.MAX_ENTRIES == integrity.MAX_ENTRIES == LIMIT < 2**31
  assert _cpu.MAX_DIM == integrity.MAX_DIM < 2**31


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
def test_exclusive_offsets_exact_past_int32(rng, dtype):
  top = min(np.iinfo(dtype).max, 2**33)
  counts = rng.integers(top // 2, top, size=7, endpoint=True).astype(dtype)
  got = partition.exclusive_offsets(counts)
  want = _prefix(counts)
  assert got.dtype == np.int64
  assert want[-1] > 2**32
  assert got.tolist() == want


def test_exclusive_offsets_refuses_bad_counts():
  with pytest.raises(ValueError, match="counts >= 0"):
    partition.exclusive_offsets(np.array([3, -1]))
  with pytest.raises(ValueError, match="integer counts"):
    partition.exclusive_offsets(np.array([1.5]))


def test_shard_nnz_of_degree_counts_past_int32(rng):
  """Entries per shard from per-row degree counts whose total passes 2^32."""
  row_nnz = rng.integers(2**28, 2**30, size=40)
  cuts = np.sort(rng.choice(np.arange(1, 40), size=4, replace=False))
  bounds = np.concatenate([[0], cuts, [40]])
  got = partition.shard_nnz(row_nnz, bounds)
  want = [sum(int(c) for c in row_nnz[a:b]) for a, b in itertools.pairwise(bounds)]
  assert got.tolist() == want
  assert sum(want) > 2**32


def test_plan_rows_total_past_limit_each_shard_under(rng):
  """A partition whose total passes 2^31 (here 2^32) while each shard stays under the format's
  limit is accepted; its per-shard counts and their offsets are exact."""
  P = 4
  row_nnz = rng.integers(2**26, 2**27, size=64)  # about 2^32.6 in all, about 2^30.6 a shard
  bounds, per_shard, M = partition.plan_rows(row_nnz, P)
  total = sum(int(c) for c in row_nnz)
  assert total > 2**32
  want = [sum(int(c) for c in row_nnz[a:b]) for a, b in itertools.pairwise(bounds)]
  assert per_shard.tolist() == want and sum(want) == total
  assert max(want) <= LIMIT
  assert partition.exclusive_offsets(per_shard).tolist() == _prefix(want)
  assert M >= max(np.diff(bounds)) + 8 and M % 8 == 0
  # Explicit bounds, one shard taking every row but one: refused, naming the shard and limit.
  with pytest.raises(ValueError, match=rf"shard 1 of 2 holds {sum(want) - int(row_nnz[0])} "):
    partition.plan_rows(row_nnz, 2, bounds=[0, 1, 64])


def test_one_shard_over_limit_is_refused():
  row_nnz = np.array([5, LIMIT + 1, 7], np.int64)
  with pytest.raises(ValueError, match=rf"shard 1 of 3 .*per-shard limit of {LIMIT}"):
    partition.plan_rows(row_nnz, 3, bounds=[0, 1, 2, 3])
  # At the limit it is accepted.
  row_nnz[1] = LIMIT
  _, per_shard, _ = partition.plan_rows(row_nnz, 3, bounds=[0, 1, 2, 3])
  assert per_shard.tolist() == [5, LIMIT, 7]
  with pytest.raises(ValueError, match=rf"shard 0 of 1 .*limit of {LIMIT}"):
    partition.check_shard_entries([LIMIT + 1])


def test_partition_rows_balances_counts_past_int32(rng):
  """The balanced cut of counts whose prefix sums pass 2^32 (float64, exact there)."""
  row_nnz = rng.integers(2**29, 2**30, size=33)
  bounds = partition.partition_rows(row_nnz, 3)
  per = [sum(int(c) for c in row_nnz[a:b]) for a, b in itertools.pairwise(bounds)]
  assert sum(per) > 2**33
  # Each cut lies within one row of the ideal share.
  prefix = _prefix(row_nnz)
  for k, cut in enumerate(bounds[1:-1], 1):
    ideal = (prefix[-1] + len(row_nnz)) * k / 3
    assert abs(prefix[cut] + cut - ideal) <= int(row_nnz.max()) + 1


def test_value_offsets_past_int32(rng):
  """Where each shard's parts start in the flat sharded value layout: P * nnz passes 2^32."""
  P = 8
  part_nnz = rng.integers(2**28, 2**30, size=2)
  got = partition.value_offsets(P, part_nnz)
  per_shard = int(part_nnz[0]) + int(part_nnz[1])
  want = [[p * per_shard, p * per_shard + int(part_nnz[0])] for p in range(P)]
  assert got.dtype == np.int64 and got.tolist() == want
  assert want[-1][-1] > 2**32


def test_padded_node_positions_past_int32_are_refused():
  counts = np.array([2**29, 2**29 + 1, 3, 0])
  M = partition.rows_per_shard(counts)
  assert M > 2**29
  with pytest.raises(ValueError, match=rf"{4 * M} padded node positions, more than {LIMIT}"):
    partition.check_padded_nodes(4, M)
  partition.check_padded_nodes(3, M)  # 3 * M fits
  with pytest.raises(ValueError, match=rf"{2**31} columns, more than the format's"):
    partition.check_padded_nodes(2, 1024, ext_cols=2**31)


def test_sharded_total_may_pass_the_entry_limit(monkeypatch, rng):
  """With the entry limit lowered to 300: one SparseMatrix of 1000 entries is refused, the
  sharded builder's checks take them in 4 shards of at most 300 and refuse a shard of more."""
  monkeypatch.setattr(sm, "_MAX_ENTRIES", 300)
  monkeypatch.setattr(integrity, "MAX_ENTRIES", 300)
  n = 40
  rows = np.repeat(np.arange(n), 25)
  cols = rng.integers(0, n, rows.size)
  with pytest.raises(ValueError, match="at most 300 entries"):
    sm.SparseMatrix.from_coo(rows, cols, shape=(n, n))
  sm._check_indices(rows, cols, (n, n), limit_entries=False)
  bounds, per_shard, _ = partition.plan_rows(np.bincount(rows, minlength=n), 4)
  assert per_shard.tolist() == [250] * 4
  _, sel = partition.shard_entries(rows, cols, np.diff(bounds))
  assert [s.size for s in sel] == per_shard.tolist()
  for s, a, b in zip(sel, bounds[:-1], bounds[1:]):
    assert np.all((rows[s] >= a) & (rows[s] < b)) and np.all(np.diff(s) > 0)
  with pytest.raises(ValueError, match="shard 0 of 4 holds 325 entries.*limit of 300"):
    partition.plan_rows(np.bincount(rows, minlength=n), 4, bounds=[0, 13, 20, 30, 40])


def test_schedule_fields_past_int32_are_refused():
  """Schedules are int32: int64 pointers past it are refused, not wrapped."""
  with pytest.raises(ValueError, match="window_schedule: a schedule field of 4294967296"):
    pattern_lib.window_schedule(np.array([0, 2**29], np.int64), size=2**30)
  with pytest.raises(ValueError, match="row_schedule: a schedule field of"):
    pattern_lib.row_schedule(np.array([0, 2**31 + 10], np.int64), piece=2**31)
  # Under int32 they are exact.
  items = pattern_lib.row_schedule(np.array([0, 2**31 - 2, 2**31 - 1], np.int64), piece=2**31)
  assert sorted(items[:, 1:3].tolist()) == [[0, 2**31 - 2], [2**31 - 2, 2**31 - 1]]


def test_builder_refuses_sizes_past_int32_before_allocating():
  empty = np.zeros(0, np.int64)
  with pytest.raises(ValueError, match=rf"at most {LIMIT} entries and {integrity.MAX_DIM} rows"):
    _cpu.build_pattern(empty, empty, 2**31, 8)
  with pytest.raises(ValueError, match=f"at most {integrity.MAX_DIM} rows"):
    sm.SparseMatrix.from_coo(empty, empty, shape=(2**31, 8))


def test_reorder_refuses_node_ids_past_int32():
  with pytest.raises(ValueError, match=f"at most {integrity.MAX_DIM} rows"):
    reorder((np.array([0, 1]), np.array([1, 0])), num_nodes=2**31)
