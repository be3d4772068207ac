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

  def send_lists(self, shards=None, transpose=None):
    """The halo's send side (mode "halo") of `shards` (default: all; with `recv` known for
    those only): `send` int32 [len(shards), P * c] (send[q, p*c + j]: the local row of q that
    goes to slot j of p's chunk), `ext_to_global` int32 [len(shards), n_ext] (the padded global
    position of each ext column; unused slots at the shard's spare row), the real slots per
    pair int64 [P, P] (counts[p, q]: rows shard p reads of q) and, per shard q, the entries
    (sent row, slot, None) of its 0/1 selection matrix S [M, P * c].
    transpose(recv_rows, counts) -> (send, counts of every shard): where other processes hold
    the other shards (recv_rows [len(shards), P * c]: row p holds at q*c + j what send[q] holds
    at p*c + j; counts [len(shards), P]); default: all shards here, a numpy transpose."""
    P, M, halo, b = self.num_shards, self.rows_per_shard, self.halo_rows, self.bounds
    shards = range(P) if shards is None else shards
    recv_rows = np.zeros((len(shards), P * halo), np.int32)
    counts = np.zeros((len(shards), P), np.int64)
    ext_to_global = np.zeros((len(shards), self.ext_cols), np.int32)
    for i, p in enumerate(shards):
      ext_to_global[i, :M] = p * M + np.arange(M)
      ext_to_global[i, M:] = p * M + M - 1  # unused halo slots: p's spare row
      for q in range(P):
        r = self.recv[p][q]
        counts[i, q] = r.size
        if r.size:
          recv_rows[i, q * halo : q * halo + r.size] = r - b[q]
          ext_to_global[i, M + q * halo : M + q * halo + r.size] = q * M + r - b[q]
    if transpose is None:
      send = recv_rows.reshape(P, P, halo).transpose(1, 0, 2).reshape(P, P * halo)
    else:
      send, counts = transpose(recv_rows, counts)
    # S per shard q: an entry (sent row, slot) per real slot; the slots of q's own chunk (never
    # filled) are S's empty columns, its spare rows S's empty rows, as for the remote part.
    select = []
    for i, q in enumerate(shards):
      slots = np.concatenate([p * halo + np.arange(counts[p, q], dtype=np.int64) for p in range(P)])
      select.append((send[i, slots].astype(np.int64), slots, None))
    return send, ext_to_global, counts, select


def plan_exchange(
  cols: np.ndarray,
  shard_sel: list,
  bounds: np.ndarray,
  rows_per_shard: int,
  exchange: str,
  halo_threshold: float,
  shards=None,
  agree_max=None,
) -> ExchangePlan:
  """The halo lists of the entries `shard_sel[i]` (columns `cols`) of each shard `shards[i]`
  (default: all), and the exchange: "none" where no shard reads another's rows; under "auto",
  "halo" where each shard's chunk c is at most `halo_threshold` times its rows, else
  "allgather". agree_max: the maximum over the processes that build the other shards
  (multihost.BuildScope.agree_max), whose recv lists stay None here."""
  b = bounds
  P = b.size - 1
  n = int(b[-1])
  shards = range(P) if shards is None else shards
  # recv[p][q] by a mark per node: linear in the entries and nodes, where a unique per pair
  # sorted or hashed.
  recv = [[None] * P for _ in range(P)]
  c = 0
  read = np.zeros(n, bool)
  for p, sel in zip(shards, shard_sel):
    read[:] = False
    read[cols[sel]] = True
    for q in range(P):
      if q == p:
        recv[p][q] = np.zeros(0, np.int64)
        continue
      recv[p][q] = np.flatnonzero(read[b[q] : b[q + 1]]) + b[q]
      c = max(c, recv[p][q].size)
  del read
  if agree_max is not None:
    c = int(agree_max([c])[0])
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
