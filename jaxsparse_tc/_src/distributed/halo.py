"""How the shards of a ShardedMatrix read each other's rows: the exchange ("allgather", "halo" or
"none"), the halo lists, each shard's exchanged (ext) column space and the halo's send lists."""

from __future__ import annotations

import dataclasses

import numpy as np

EXCHANGES = ("auto", "allgather", "halo")
DEFAULT_HALO_THRESHOLD = 0.5


@dataclasses.dataclass(frozen=True, eq=False)
class ExchangePlan:
  """The exchange of a row partition (host numpy). `recv[p][q]`: the sorted global rows of shard
  q that shard p reads (empty for q == p); `max_halo`: the largest such count (c); `halo_rows`:
  c rounded up to 8 under "halo" (each shard's chunk of every other shard's rows), else 0."""

  mode: str  # "allgather", "halo" or "none"
  bounds: np.ndarray  # int64 [P + 1]
  rows_per_shard: int  # M
  recv: list
  max_halo: int
  halo_rows: int

  @property
  def num_shards(self) -> int:
    return self.bounds.size - 1

  @property
  def ext_cols(self) -> int:
    """n_ext: columns of a shard's exchanged space (own rows, then what it receives)."""
    P, M = self.num_shards, self.rows_per_shard
    return {"none": M, "allgather": P * M, "halo": M + P * self.halo_rows}[self.mode]

  def ext_columns(self, p: int, cc: np.ndarray, qo: np.ndarray) -> np.ndarray:
    """Global columns cc (owned by shards qo) of shard p's entries in its ext space."""
    b, M = self.bounds, self.rows_per_shard
    if self.mode == "allgather":
      return qo.astype(np.int64) * M + (cc - b[qo])
    if self.mode == "none":
      return cc - b[p]
    # halo: a position per node read (own rows, then each chunk's), looked up per entry
    where = np.zeros(int(b[-1]), np.int64)
    where[b[p] : b[p + 1]] = np.arange(b[p + 1] - b[p])
    for q in range(self.num_shards):
      if self.recv[p][q].size:
        where[self.recv[p][q]] = M + q * self.halo_rows + np.arange(self.recv[p][q].size)
    return where[cc]

  def send_lists(self):
    """The halo's send side (mode "halo"): `send` int32 [P, P * c] (send[q, p*c + j]: the local
    row of q that goes to slot j of p's chunk), `ext_to_global` int32 [P, n_ext] (the padded
    global position of each ext column; unused slots at the shard's spare row) and, per shard q,
    the entries (sent row, slot, None) of its 0/1 selection matrix S [M, P * c]."""
    P, M, halo, b = self.num_shards, self.rows_per_shard, self.halo_rows, self.bounds
    send = np.zeros((P, P * halo), np.int32)
    ext_to_global = np.zeros((P, self.ext_cols), np.int32)
    for p in range(P):
      ext_to_global[p, :M] = p * M + np.arange(M)
      ext_to_global[p, M:] = p * M + M - 1  # unused halo slots: p's spare row
      for q in range(P):
        r = self.recv[p][q]
        if r.size:
          send[q, p * halo : p * halo + r.size] = r - b[q]
          ext_to_global[p, M + q * halo : M + q * halo + r.size] = q * M + r - b[q]
    # S per shard q: an entry (sent row, slot) per real slot; the slots of q's own chunk (never
    # filled) are S's empty columns, its spare rows S's empty rows, as for the remote part.
    select = []
    for q in range(P):
      slots = np.concatenate(
        [p * halo + np.arange(self.recv[p][q].size, dtype=np.int64) for p in range(P)]
      )
      select.append((send[q, slots].astype(np.int64), slots, None))
    return send, ext_to_global, select


def plan_exchange(
  cols: np.ndarray,
  shard_sel: list,
  bounds: np.ndarray,
  rows_per_shard: int,
  exchange: str,
  halo_threshold: float,
) -> ExchangePlan:
  """The halo lists of the entries `shard_sel[p]` (columns `cols`) of each shard, and the
  exchange: "none" where no shard reads another's rows; under "auto", "halo" where each shard's
  chunk c is at most `halo_threshold` times its rows, else "allgather"."""
  b = bounds
  P = b.size - 1
  n = int(b[-1])
  # recv[p][q] by a mark per node: linear in the entries and nodes, where a unique per pair
  # sorted or hashed.
  recv = [[None] * P for _ in range(P)]
  c = 0
  read = np.zeros(n, bool)
  for p, sel in enumerate(shard_sel):
    read[:] = False
    read[cols[sel]] = True
    for q in range(P):
      if q == p:
        recv[p][q] = np.zeros(0, np.int64)
        continue
      recv[p][q] = np.flatnonzero(read[b[q] : b[q + 1]]) + b[q]
      c = max(c, recv[p][q].size)
  del read
  if c == 0:
    mode = "none"
  elif exchange == "auto":
    mode = "halo" if c <= halo_threshold * rows_per_shard else "allgather"
  else:
    mode = exchange
  # Chunks of a multiple of 8 rows: the remote part's own chunk is then whole empty windows of
  # its transpose (the padding's anchor).
  halo = 8 * -(-c // 8) if mode == "halo" else 0
  return ExchangePlan(mode, b, rows_per_shard, recv, c, halo)
