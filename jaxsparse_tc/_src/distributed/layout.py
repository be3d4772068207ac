"""The static description of a ShardedMatrix (ShardLayout, PartLayout) and its per-shard arrays
(ShardArrays, PartArrays); the partition specs of its operands. The layout itself is described
in jaxsparse_tc.distributed.matrix's docstring."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np
from jax.sharding import Mesh, PartitionSpec

from jaxsparse_tc._src.pattern import Pattern


@dataclasses.dataclass(frozen=True, eq=True)
class ShardLayout:
  """Static description of a ShardedMatrix (hashable: part of jit's cache key)."""

  mesh: Mesh
  axis_name: str
  num_nodes: int
  bounds: tuple  # P + 1 ints
  rows_per_shard: int  # M (padded)
  nnz_per_shard: int  # nnz_pad: values per shard (all parts)
  exchange: str  # "allgather", "halo" or "none"
  halo_rows: int  # c (halo): rows received from each other shard (padded)
  ext_cols: int  # n_ext: columns of the exchanged (ext) space
  parts: tuple  # PartLayout per part: ("all",) or ("own", "remote")
  max_real_halo: int = 0  # largest real halo count (pairs), for byte estimates
  send_part: Any = None  # PartLayout of the halo's selection matrix (ShardArrays.send_select)
  # Host-side map from the builder's input entries to flat sharded value positions (excluded
  # from hashing and equality).
  input_positions: Any = dataclasses.field(default=None, compare=False, hash=False, repr=False)

  @property
  def num_shards(self) -> int:
    return len(self.bounds) - 1

  @property
  def grouped(self) -> tuple:
    """(A's schedules grouped, A^T's) of a single-part layout."""
    return self.parts[0].grouped

  @property
  def overlap(self) -> bool:
    return len(self.parts) > 1

  @property
  def padded_rows(self) -> int:
    return self.num_shards * self.rows_per_shard

  @property
  def row_counts(self) -> np.ndarray:
    return np.diff(np.asarray(self.bounds))

  def exchange_rows(self, exchange: str | None = None) -> int:
    """Dense rows each shard receives per exchange of X (the largest over shards)."""
    ex = self.exchange if exchange is None else exchange
    if ex not in ("allgather", "halo", "none"):
      raise ValueError(f"exchange must be 'allgather', 'halo' or 'none' (or None); got {ex!r}")
    P = self.num_shards
    if ex == "allgather":
      return (P - 1) * self.rows_per_shard
    if ex == "halo":
      return (P - 1) * self.halo_rows
    return 0


@dataclasses.dataclass(frozen=True)
class PartLayout:
  """One part of every shard's local matrix (static)."""

  kind: str  # "all" (columns: ext space), "own" (the shard's rows), "remote" (received rows)
  nnz: int  # padded values per shard
  cols: int  # columns of the part's local matrix
  grouped: tuple  # (A's schedule grouped, A^T's)


class PartArrays(NamedTuple):
  """One part's per-shard arrays, stacked on a leading shard axis (sharded along it)."""

  a: Pattern  # local A's pattern, each array [P, ...]
  t: Pattern  # local A^T's
  perm_t: Any  # int32 [P, nnz_pad]
  perm_t_inv: Any  # int32 [P, nnz_pad]
  nnz: Any  # int32 [P]: real values per shard


class ShardArrays(NamedTuple):
  """Per-shard arrays, stacked on a leading shard axis (sharded along it)."""

  parts: tuple  # PartArrays per part (ShardLayout.parts)
  send: Any  # int32 [P, P * c]: rows shard q sends to each destination (halo), else None
  ext_to_global: Any  # int32 [P, n_ext]: padded global position of each ext column (halo)
  # The halo's send lists as a 0/1 matrix S [M, P * c] per shard (S[send[j], j] = 1): the send's
  # transpose, which adds up the returned cotangents G of rows sent to several shards, is the
  # SpMM S G rather than XLA's slower scatter-add (docs/DISTRIBUTED.md); halo only, else None.
  send_select: Any = None


def edge_spec(ndim: int, axis: str) -> PartitionSpec:
  return PartitionSpec(*([None] * (ndim - 1)), axis)


def node_spec(ndim: int, axis: str) -> PartitionSpec:
  """Dense operands: [P*M], [P*M, d] (node axis 0) or [H, P*M, d] (node axis 1)."""
  if ndim <= 2:
    return PartitionSpec(axis, *([None] * (ndim - 1)))
  return PartitionSpec(*([None] * (ndim - 2)), axis, None)


def node_axis(ndim: int) -> int:
  return 0 if ndim <= 2 else ndim - 2
