"""ShardedMatrix: a square sparse matrix partitioned into contiguous row blocks over one axis of a
`jax.sharding.Mesh`, each block a local SparseMatrix whose columns index a local + halo space.

Layout (all shards share it; everything is padded to the largest shard):

- Node (dense-row) space: shard p owns global rows `bounds[p] .. bounds[p+1]`, stored at padded
  positions `p * M .. p * M + rows_p` of every dense operand `[P * M, d]` (or `[H, P * M, d]`),
  sharded along that axis: `M = rows_per_shard` is the largest block rounded up to 8, plus 8 spare
  rows, so that every shard ends in an empty window (the padding's anchor, see `_src/padding.py`);
  from 2^16 rows on, M is rounded up to a multiple of 1024 (ROW_ALIGN). Padded rows are zero on
  input and come out zero (plus whatever row-wise layers add: they are never read as columns, and a
  loss must skip them: `row_mask`).
- Values: `[P * nnz_pad]` (or `[H, P * nnz_pad]`), sharded along the last axis; shard p's values
  are its local matrix's format order, its real ones first (`nnz[p]`), then zeros.
- Local matrices: shard p's `M x n_ext` matrix. Its columns ("ext" space) depend on the exchange:
  * "allgather": ext = the padded global node space (`n_ext = P * M`); a shard all-gathers X.
  * "halo": ext = `[own M rows | P chunks of c halo rows]` (`n_ext = M + P * c`): chunk q holds, in
    ascending order, the rows of shard q that shard p reads, padded to c (the largest such
    count); one `all_to_all` of the rows each shard needs (`send[q]` lists, per destination, the
    local rows shard q sends) fills it.
  * "none": no shard reads another's rows (one shard, or a block-diagonal graph): ext = own rows.

The exchange is chosen at build: "auto" takes "halo" when c <= halo_threshold * M (a shard then
receives at most that fraction of what an all-gather would bring), else "allgather".

Parts. By default each shard holds one local matrix (part "all"). With `overlap=True` it holds
two: "own" (the entries whose column is one of the shard's own rows: M x M, local columns) and
"remote" (the others), so that SpMM multiplies the own part while the exchange of the other rows
is in flight (XLA schedules the collective asynchronously around the independent kernel) and adds
the remote part's product after. The remote part's columns index what the collective returns as
it is: the all-gathered rows (P * M columns) or the halo exchange's received chunks (P * c
columns, chunk p, the shard's own, empty); so no copy joins the shard's rows to the received
ones. Each part is padded on its own; a shard's values
are its parts' values one after the other. Row-wise operators (edge softmax, attention) need a
row's entries in one pattern, so they take single-part matrices only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxsparse_tc import sparse_matrix as sm
from jaxsparse_tc._src import checks, padding
from jaxsparse_tc._src import pattern as pattern_lib
from jaxsparse_tc._src.pattern import Pattern
from jaxsparse_tc.options import FormatOptions

__all__ = [
  "ShardedMatrix",
  "ShardLayout",
  "ShardArrays",
  "PartLayout",
  "PartArrays",
  "make_mesh",
  "check_host_mesh",
  "partition_rows",
  "shard_coo",
  "shard_matrix",
  "shard_scipy",
  "DEFAULT_AXIS",
  "EXCHANGES",
]

DEFAULT_AXIS = "shards"
EXCHANGES = ("auto", "allgather", "halo")
DEFAULT_HALO_THRESHOLD = 0.5
# Large shards take a multiple of ROW_ALIGN rows: XLA pads a matmul's contracted dimension to its
# tile, so the weight gradients of a layer (h^T g, contracted over the rows) copied [M, d]
# operands into padded ones when M was only a multiple of 8 (three copies of [2.1M, 128] float32
# per GCN step on 2 H100s, 0.7-0.8 ms each).
ROW_ALIGN, ROW_ALIGN_FROM = 1024, 1 << 16


def make_mesh(devices=None, axis_name: str = DEFAULT_AXIS) -> Mesh:
  """A 1-D mesh over `devices`: None (all of jax.devices()), a count N (the first N) or a list."""
  if devices is None:
    devs = jax.devices()
  elif isinstance(devices, (int, np.integer)):
    all_devs = jax.devices()
    if not 1 <= int(devices) <= len(all_devs):
      raise ValueError(
        f"asked for {devices} devices; {len(all_devs)} are visible "
        f"({all_devs[0].platform}); on CPU, force more with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=N before jax starts"
      )
    devs = all_devs[: int(devices)]
  else:
    devs = list(devices)
  mesh = Mesh(np.array(devs), (axis_name,))
  check_host_mesh(mesh, "make_mesh")
  return mesh


# XLA's CPU client runs every device's part of a multi-device step as a task on one pool of T
# threads, T = max(PJRT_NPROC, else NPROC, else the schedulable CPUs; the CPU device count), sized
# when JAX starts its CPU backend. A step's collectives wait until the tasks of all N devices run
# at once. The task that dispatches a step onto a device first waits, on a pool thread, while 32
# steps are in flight on that device; so a loop that runs more than 32 steps ahead (nothing
# blocks on its results) holds up to N pool threads in that wait, and with T < 2 N the oldest
# step never gets its N threads: its collective waits for ever, and XLA aborts the process after
# 40 s ("Termination timeout for all gather ... only K of them arrived", K = T - blocked). This is
# XLA's, not the kernels': a plain JAX loop (shard_map + all_gather) hangs the same way, and with
# 2 N threads both run through. So host meshes are refused where T < 2 N.
_CPU_INFLIGHT_STEPS = 32  # XLA's max_inflight_computations_per_device


def _cpu_client_threads(cpu_devices: int) -> tuple[int, str]:
  """XLA's CPU client pool size T (above), as XLA computes it, and where it comes from."""
  for var in ("PJRT_NPROC", "NPROC"):
    value = os.environ.get(var)
    if value is None:
      continue
    try:
      threads = max(int(value), 0)
    except ValueError:
      continue
    return max(threads, cpu_devices), f"{var}={value}, {cpu_devices} CPU devices"
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  return max(cpus, cpu_devices), f"{cpus} schedulable CPUs, {cpu_devices} CPU devices"


def check_host_mesh(mesh: Mesh, op: str = "distributed") -> None:
  """Raises ValueError where a mesh of host (CPU) devices can deadlock XLA's CPU client: N >= 2
  devices of this process need a client pool of 2 N threads (the comment above says why)."""
  here = jax.process_index()
  n = sum(d.platform == "cpu" and d.process_index == here for d in np.asarray(mesh.devices).flat)
  if n < 2:
    return
  threads, source = _cpu_client_threads(len(jax.local_devices(backend="cpu")))
  if threads >= 2 * n:
    return
  fewer = f", or shard over at most {threads // 2} devices" if threads >= 4 else ""
  raise ValueError(
    f"{op}: a mesh of {n} host (CPU) devices needs XLA's CPU client to run on at least {2 * n} "
    f"threads; it has {threads} (the larger of {source}). Each device's part of a step takes "
    f"one of those threads, a step's collectives wait until all {n} run, and a step dispatched "
    f"while {_CPU_INFLIGHT_STEPS} are in flight on a device holds one more thread waiting: with "
    f"fewer than 2 x {n} threads a loop that runs more than {_CPU_INFLIGHT_STEPS} steps ahead "
    "of the devices deadlocks (XLA aborts after 40 s: 'Termination timeout for all gather'). "
    f"Start the process with PJRT_NPROC={2 * n} in its environment (XLA reads it when JAX "
    f"starts its CPU backend){fewer}"
  )


def partition_rows(row_nnz, num_shards: int, *, row_weight: float = 1.0) -> np.ndarray:
  """Contiguous row blocks balanced by nonzeros: bounds [num_shards + 1], shard p owning rows
  bounds[p] .. bounds[p+1].

  `row_nnz`: nonzeros per row ([n]; `np.diff(csr.indptr)`). Each row weighs its nonzeros plus
  `row_weight` (a row's dense work: its output row, its share of the row-wise layers).
  Contiguous ranges keep neighbours together after a locality reordering (reorder first, then
  partition).
  """
  counts = np.asarray(row_nnz, np.float64)
  if counts.ndim != 1:
    raise ValueError(f"row_nnz must be one-dimensional; got shape {counts.shape}")
  if counts.size and not (np.all(np.isfinite(counts)) and counts.min() >= 0):
    raise ValueError(
      f"row_nnz must be finite counts >= 0; got values from {counts.min()} to {counts.max()}"
    )
  if num_shards < 1:
    raise ValueError(f"num_shards must be at least 1; got {num_shards}")
  n = counts.shape[0]
  cum = np.zeros(n + 1)
  np.cumsum(counts + row_weight, out=cum[1:])
  targets = cum[-1] * np.arange(1, num_shards) / num_shards
  inner = np.searchsorted(cum, targets, side="left")
  # Round each cut to the nearer of the two candidate rows.
  lower = np.maximum(inner - 1, 0)
  pick_lower = np.abs(cum[lower] - targets) <= np.abs(cum[np.minimum(inner, n)] - targets)
  inner = np.where(pick_lower, lower, inner)
  bounds = np.concatenate([[0], np.maximum.accumulate(inner), [n]]).astype(np.int64)
  return np.minimum(bounds, n)


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
  # SpMM S G (XLA's scatter-add of G took 1.5 ms of a 2-GPU GCN step on R-MAT 2^22; halo only,
  # else None).
  send_select: Any = None


def _edge_spec(ndim: int, axis: str) -> PartitionSpec:
  return PartitionSpec(*([None] * (ndim - 1)), axis)


def _node_spec(ndim: int, axis: str) -> PartitionSpec:
  """Dense operands: [P*M], [P*M, d] (node axis 0) or [H, P*M, d] (node axis 1)."""
  if ndim <= 2:
    return PartitionSpec(axis, *([None] * (ndim - 1)))
  return PartitionSpec(*([None] * (ndim - 2)), axis, None)


def _node_axis(ndim: int) -> int:
  return 0 if ndim <= 2 else ndim - 2


@jax.tree_util.register_pytree_node_class
class ShardedMatrix(sm.SparseMatrix):
  """A square n x n sparse matrix, row-partitioned over a mesh axis (module docstring).

  Build with `shard_coo`, `shard_matrix` or `shard_scipy`. Works with the library's operators
  (`jst.spmm`, `jst.sddmm`, `jst.edge_softmax`, `jst.sparse_attention` dispatch here, so the GNN
  layers of jaxsparse_tc.nn take it in place of a SparseMatrix: it is one, to isinstance) on
  dense operands in the padded node layout (`shard_rows`). Shapes, as the operators see them:
  `shape == (P*M, P*M)`, `nnz == P * nnz_pad`; `rows`/`cols` are padded global node positions
  (a padded value sits on the diagonal of its shard's last, empty, padding row).
  What needs one whole pattern (`pattern`, `operands()`, `T`) is not available; `todense()`
  is the padded [P*M, P*M] matrix and `to_scipy()` the global n x n one.
  """

  def __init__(self, values, arrays: ShardArrays, layout: ShardLayout):
    self.values = values
    self.arrays = arrays
    self.layout = layout

  # -- pytree ---------------------------------------------------------------------------------
  def tree_flatten(self):
    return (self.values, self.arrays), self.layout

  @classmethod
  def tree_unflatten(cls, layout, children):
    return cls(*children, layout)

  # -- shape and values -----------------------------------------------------------------------
  @property
  def mesh(self) -> Mesh:
    return self.layout.mesh

  @property
  def axis_name(self) -> str:
    return self.layout.axis_name

  @property
  def num_shards(self) -> int:
    return self.layout.num_shards

  @property
  def num_nodes(self) -> int:
    return self.layout.num_nodes

  @property
  def shape(self) -> tuple[int, int]:
    n = self.layout.padded_rows
    return (n, n)

  @property
  def nnz(self) -> int:
    return self.num_shards * self.layout.nnz_per_shard

  @property
  def dtype(self):
    return self.values.dtype

  @property
  def num_heads(self) -> int | None:
    return self.values.shape[0] if jnp.ndim(self.values) == 2 else None

  @property
  def grouped(self) -> tuple:
    return self.layout.grouped

  def with_values(self, values) -> "ShardedMatrix":
    """The same shards with new values ([P*nnz_pad] or [H, P*nnz_pad], sharded layout)."""
    values = jnp.asarray(values)
    if values.ndim not in (1, 2) or values.shape[-1] != self.nnz:
      raise checks.OperandError(
        f"with_values: values must have shape [{self.nnz}] or [H, {self.nnz}] (the sharded "
        f"layout: {self.num_shards} shards x {self.layout.nnz_per_shard}); got "
        f"{values.shape}{self._value_hint(values.shape)}"
      )
    if not jnp.issubdtype(values.dtype, jnp.floating):
      raise checks.OperandError(
        f"with_values: values (shape {values.shape}) have non-float dtype {values.dtype}"
      )
    return ShardedMatrix(values, self.arrays, self.layout)

  def _value_hint(self, shape) -> str:
    """Names the other value layout where `shape` has its length."""
    pos = self.layout.input_positions
    if pos is not None and shape[-1:] == (len(pos),) != (self.nnz,):
      return f" (the builder's input order, {len(pos)} entries: values_from_input maps it)"
    return ""

  def _per_part(self, fn):
    """fn(part layout, part arrays) -> [P, part nnz], concatenated over parts, flattened."""
    outs = [fn(pl, pa) for pl, pa in zip(self.layout.parts, self.arrays.parts)]
    return (outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)).reshape(-1)

  def value_mask(self):
    """[P*nnz_pad] booleans: True at real values, False at padding."""
    return self._per_part(
      lambda pl, pa: jnp.arange(pl.nnz, dtype=jnp.int32)[None, :] < jnp.asarray(pa.nnz)[:, None]
    )

  def _offsets(self):
    return (jnp.arange(self.num_shards, dtype=jnp.int32) * self.layout.rows_per_shard)[:, None]

  @property
  def rows(self):
    """Row of each value, as a padded global node position ([P*nnz_pad])."""
    return self._per_part(lambda pl, pa: jnp.asarray(pa.a.rows) + self._offsets())

  @property
  def cols(self):
    """Column of each value, as a padded global node position ([P*nnz_pad])."""
    lay = self.layout

    def part_cols(pl, pa):
      c = jnp.asarray(pa.a.cols)
      if pl.kind == "own" or lay.exchange == "none":
        return c + self._offsets()
      if lay.exchange == "allgather":
        return c
      e2g = jnp.asarray(self.arrays.ext_to_global)
      if pl.kind == "remote":  # columns of the received chunks
        e2g = e2g[:, lay.rows_per_shard :]
      return jnp.take_along_axis(e2g, c, axis=1)

    return self._per_part(part_cols)

  @property
  def input_to_format(self):
    """Flat sharded position of each of the builder's input entries ([E])."""
    return jnp.asarray(self._input_positions())

  def _whole(self, what: str):
    raise NotImplementedError(
      f"ShardedMatrix.{what}: a sharded matrix has no single pattern; its shards' arrays are "
      f"ShardedMatrix.arrays (stacked on the shard axis)"
    )

  pattern = property(lambda self: self._whole("pattern"))
  pattern_t = property(lambda self: self._whole("pattern_t"))
  perm_t = property(lambda self: self._whole("perm_t"))
  perm_t_inv = property(lambda self: self._whole("perm_t_inv"))

  def operands(self):
    self._whole("operands()")

  def pattern_operands(self):
    self._whole("pattern_operands()")

  def to_scipy(self):
    """scipy CSR of the global n x n matrix (values as float32 when bfloat16)."""
    import scipy.sparse as sp

    v = np.asarray(self.values)
    if v.ndim != 1:
      raise ValueError(f"to_scipy needs one value set; values have shape {v.shape}")
    keep = np.asarray(self.value_mask())
    src, _ = self._row_source()
    r, c = src[np.asarray(self.rows)[keep]], src[np.asarray(self.cols)[keep]]
    n = self.num_nodes
    return sp.csr_matrix(
      (v[keep].astype(np.float32) if v.dtype == jnp.bfloat16 else v[keep], (r, c)), shape=(n, n)
    )

  @property
  def T(self):
    raise NotImplementedError(
      "ShardedMatrix.T: the transpose of a row-partitioned matrix is column-partitioned; "
      "build the transposed graph's ShardedMatrix instead (gradients need no transpose: "
      "the operators' rules use each shard's local A^T)"
    )

  def _input_positions(self):
    pos = self.layout.input_positions
    if pos is None:
      raise ValueError("this ShardedMatrix has no input map (built by another route)")
    if pos.dtype == np.int64 and not jax.config.jax_enable_x64:
      raise ValueError(
        f"the sharded layout holds {self.nnz} values, past int32 positions: "
        "map input-order values with jax_enable_x64, or build the values "
        "shard by shard"
      )
    return pos

  def values_from_input(self, values) -> jax.Array:
    """Values in the builder's input order ([E] or [H, E]; duplicates add up) to the sharded
    layout."""
    pos = self._input_positions()
    values = jnp.asarray(values)
    if values.ndim not in (1, 2) or values.shape[-1] != len(pos):
      also = (
        " (the sharded layout's length: already mapped?)"
        if values.shape[-1:] == (self.nnz,)
        else ""
      )
      raise checks.OperandError(
        f"values_from_input: this ShardedMatrix was built from {len(pos)} entries, so values "
        f"must have shape [{len(pos)}] or [H, {len(pos)}] (the builder's input order); got "
        f"{values.shape}{also}"
      )
    out = jnp.zeros(values.shape[:-1] + (self.nnz,), values.dtype)
    out = out.at[..., pos].add(values)
    return jax.device_put(out, NamedSharding(self.mesh, _edge_spec(out.ndim, self.axis_name)))

  def values_to_input(self, values=None) -> jax.Array:
    """Sharded-layout values (default: this matrix's) in the builder's input order."""
    pos = self._input_positions()
    values = self.values if values is None else jnp.asarray(values)
    if values.ndim not in (1, 2) or values.shape[-1] != self.nnz:
      raise checks.OperandError(
        f"values_to_input: values must have shape [{self.nnz}] or [H, {self.nnz}] (the sharded "
        f"layout: {self.num_shards} shards x {self.layout.nnz_per_shard}); got "
        f"{values.shape}{self._value_hint(values.shape)}"
      )
    return values[..., pos]

  # -- the padded node layout -----------------------------------------------------------------
  def node_positions(self, nodes) -> np.ndarray:
    """Padded positions (int32, host) of global node ids `nodes`."""
    nodes = np.asarray(nodes)
    if nodes.size:
      if not np.issubdtype(nodes.dtype, np.integer):
        raise ValueError(
          f"node_positions: node ids must be integers; got dtype {nodes.dtype} (shape "
          f"{nodes.shape})"
        )
      lo, hi = int(nodes.min()), int(nodes.max())
      if lo < 0 or hi >= self.layout.num_nodes:
        raise ValueError(
          f"node_positions: node ids must be in [0, {self.layout.num_nodes}) (the graph's "
          f"nodes); got ids from {lo} to {hi}"
        )
    nodes = nodes.astype(np.int64)
    b = np.asarray(self.layout.bounds, np.int64)
    owner = np.searchsorted(b, nodes, side="right") - 1
    return (owner * self.layout.rows_per_shard + nodes - b[owner]).astype(np.int32)

  def _row_source(self):
    """(node id of each padded position, 0 for padding; validity mask), host numpy."""
    lay = self.layout
    M, P = lay.rows_per_shard, lay.num_shards
    b = np.asarray(lay.bounds, np.int64)
    pos = np.arange(P * M, dtype=np.int64)
    shard, off = pos // M, pos % M
    valid = off < (b[1:] - b[:-1])[shard]
    src = np.where(valid, b[:-1][shard] + off, 0)
    return src, valid

  def row_mask(self) -> jax.Array:
    """[P*M] booleans, True at the rows of real nodes (sharded like dense operands)."""
    _, valid = self._row_source()
    return jax.device_put(valid, NamedSharding(self.mesh, _node_spec(1, self.axis_name)))

  def shard_rows(self, x, fill=0):
    """Dense node data in global order ([n, ...], or [H, n, d]) to the padded sharded layout
    ([P*M, ...] / [H, P*M, d]); padded rows get `fill`. numpy input is sliced on the host and
    each shard's rows go straight to their device."""
    lay = self.layout
    src, valid = self._row_source()
    host = isinstance(x, np.ndarray)
    ndim = np.ndim(x)
    ax = _node_axis(ndim)
    if ndim == 0 or np.shape(x)[ax] != lay.num_nodes:
      also = (
        f" (the padded layout's {lay.padded_rows} rows: already sharded?)"
        if ndim and np.shape(x)[ax] == lay.padded_rows
        else ""
      )
      raise checks.OperandError(
        f"shard_rows: x must hold the graph's {lay.num_nodes} nodes in global order, shape "
        f"[{lay.num_nodes}, ...] or [H, {lay.num_nodes}, d]; got shape {np.shape(x)}{also}"
      )
    shape = [1] * ndim
    shape[ax] = src.size
    mask = valid.reshape(shape)
    if host:
      out = np.where(mask, np.take(x, src, axis=ax), np.asarray(fill, x.dtype))
    else:
      x = jnp.asarray(x)
      out = jnp.where(
        mask, jnp.take(x, jnp.asarray(src, jnp.int32), axis=ax), jnp.asarray(fill, x.dtype)
      )
    sharding = NamedSharding(self.mesh, _node_spec(ndim, self.axis_name))
    if isinstance(out, jax.core.Tracer):
      return jax.lax.with_sharding_constraint(out, sharding)
    return jax.device_put(out, sharding)

  def unshard_rows(self, y):
    """The inverse of shard_rows: [P*M, ...] / [H, P*M, d] to global order [n, ...]."""
    lay = self.layout
    shape, ndim = np.shape(y), np.ndim(y)
    rows = lay.padded_rows
    if ndim == 0 or shape[_node_axis(ndim)] != rows:
      got = shape[_node_axis(ndim)] if ndim else None
      also = {
        lay.num_nodes: f" (the graph's {lay.num_nodes} nodes: already in global order?)",
        self.exchanged_rows: " (an exchanged operand, distributed.exchange's result: unshard "
        "the rows it was made from)",
      }.get(got, "")
      raise checks.OperandError(
        f"unshard_rows: y must be in this ShardedMatrix's padded layout, shape [{rows}, ...] "
        f"or [H, {rows}, d] ({lay.num_shards} shards x {lay.rows_per_shard} rows); got shape "
        f"{shape}{also}"
      )
    pos = self.node_positions(np.arange(lay.num_nodes))
    if isinstance(y, np.ndarray):
      return np.take(y, pos, axis=_node_axis(ndim))
    return jnp.take(jnp.asarray(y), jnp.asarray(pos), axis=_node_axis(ndim))

  @property
  def exchanged_rows(self) -> int:
    """Rows of an exchanged dense operand (`distributed.exchange`'s result): P * n_ext."""
    return self.num_shards * self.layout.ext_cols

  def is_exchanged(self, x) -> bool:
    """Whether dense operand x ([rows, d] or [H, rows, d]) is already exchanged: it has
    exchanged_rows rows, and those differ from the padded layout's (no exchange: the same)."""
    shape = np.shape(x)
    rows = self.exchanged_rows
    return len(shape) in (2, 3) and shape[-2] == rows != self.layout.padded_rows

  def exchange_bytes(self, features: int, itemsize: int = 4, exchange: str | None = None) -> int:
    """Bytes one shard receives per exchange of a [*, features] operand."""
    return self.layout.exchange_rows(exchange) * int(features) * int(itemsize)

  # -- operators ------------------------------------------------------------------------------
  def __jaxsparse_tc_op__(self, name: str, *args, **kwargs):
    """Entry point of the library's operators (jst.spmm etc.) for a sharded matrix."""
    from jaxsparse_tc.distributed import ops

    return getattr(ops, name)(self, *args, **kwargs)

  def __matmul__(self, x):
    from jaxsparse_tc.distributed import ops

    return ops.spmm(self, x)

  def __repr__(self) -> str:
    lay = self.layout
    return (
      f"ShardedMatrix(nodes={lay.num_nodes}, shards={lay.num_shards}, "
      f"rows_per_shard={lay.rows_per_shard}, nnz_per_shard={lay.nnz_per_shard}, "
      f"exchange={lay.exchange!r}, halo_rows={lay.halo_rows}, "
      f"parts={tuple(p.kind for p in lay.parts)}, dtype={self.values.dtype})"
    )


# -- building -----------------------------------------------------------------------------------
def _build_local(rows: np.ndarray, cols: np.ndarray, m: int, n: int, format_options):
  """Both orientations of one shard's pattern (numpy, as SparseMatrix.from_coo builds them):
  (pattern, pattern_t, perm_t, perm_t_inv, input_to_format)."""
  return sm.build_orientations(rows, cols, m, n, format_options)[:5]


def _check_bounds(bounds, n: int, P: int) -> np.ndarray:
  b = np.asarray(bounds, np.int64)
  if b.shape != (P + 1,) or b[0] != 0 or b[-1] != n or np.any(np.diff(b) < 0):
    raise ValueError(
      f"bounds must be {P + 1} non-decreasing row indices from 0 to {n}; got "
      f"{np.asarray(bounds).tolist()}"
    )
  return b


def _build_part(kind, shard_entries, M, n_cols, fill_col, split_blocks, empty_col_window=None):
  """One part of every shard: shard_entries[p] = (local rows, part columns, entry selection).
  fill_col(p): a column of shard p's part that no entry uses; empty_col_window(p): a window of 8
  such columns (default M // 8 - 1, the columns of shard 0's spare rows).
  Returns (PartLayout, stacked padded numpy PartArrays fields, per-shard input_to_format)."""
  fmt = None if split_blocks is None else FormatOptions(split_blocks=split_blocks)
  # The builder releases the GIL (and builds each shard's two orientations on two threads).
  with concurrent.futures.ThreadPoolExecutor(max(1, min(len(shard_entries), 8))) as pool:
    built = list(pool.map(lambda e: _build_local(e[0], e[1], M, n_cols, fmt), shard_entries))
  nnz_pad = max(1, max(bt[0].rows.shape[0] for bt in built))
  grouped_a = split_blocks is None and all(
    pattern_lib.grouped_schedule_fits(bt[0].window_block_ptr, nnz_pad) for bt in built
  )
  grouped_t = split_blocks is None and all(
    pattern_lib.grouped_schedule_fits(bt[1].window_block_ptr, nnz_pad) for bt in built
  )
  pats_a = [padding.reschedule(bt[0], M, nnz_pad, grouped_a, split_blocks) for bt in built]
  pats_t = [padding.reschedule(bt[1], n_cols, nnz_pad, grouped_t, split_blocks) for bt in built]
  size_a = padding.max_sizes([padding.pattern_sizes(p) for p in pats_a])._replace(nnz=nnz_pad)
  size_t = padding.max_sizes([padding.pattern_sizes(p) for p in pats_t])._replace(nnz=nnz_pad)
  # Padding entries sit at the shard's spare row (the last row of its spare window, empty in A)
  # and an unused column fill_col(p) (M - 1 in a local column space, p * M + M - 1 in the
  # allgather space, the last slot of the shard's own chunk in the halo's received space), which
  # is an empty row of A^T.
  spare, empty_window = M - 1, M // 8 - 1
  if empty_col_window is None:
    empty_col_window = lambda p: empty_window  # noqa: E731

  def stacked(pats, sizes, pad_args):
    """The shards' patterns padded to `sizes`, written straight into [P, ...] arrays: shard 0
    padded on its own gives the shapes, the others are padded in place."""
    first = padding.pad_pattern(pats[0], sizes, **pad_args(0))
    out = Pattern(*(np.empty((len(pats),) + f.shape, f.dtype) for f in first))
    for field, f in zip(out, first):
      field[0] = f
    for p in range(1, len(pats)):
      padding.pad_pattern(pats[p], sizes, **pad_args(p), out=Pattern(*(f[p] for f in out)))
    return out

  def permutations(which):
    out = np.empty((len(built), nnz_pad), np.int32)
    for p, bt in enumerate(built):
      padding.pad_permutation(bt[which], nnz_pad, out=out[p])
    return out

  arrays = PartArrays(
    a=stacked(
      pats_a,
      size_a,
      lambda p: dict(empty_window=empty_window, empty_row=spare, fill_col=fill_col(p)),
    ),
    t=stacked(
      pats_t,
      size_t,
      lambda p: dict(empty_window=empty_col_window(p), empty_row=fill_col(p), fill_col=spare),
    ),
    perm_t=permutations(2),
    perm_t_inv=permutations(3),
    nnz=np.array([bt[0].rows.shape[0] for bt in built], np.int32),
  )
  layout = PartLayout(kind, nnz_pad, n_cols, (bool(grouped_a), bool(grouped_t)))
  return layout, arrays, [bt[4] for bt in built]


def shard_coo(
  rows,
  cols,
  values=None,
  *,
  num_nodes: int,
  mesh: Mesh | None = None,
  axis_name: str | None = None,
  bounds=None,
  exchange: str = "auto",
  halo_threshold: float = DEFAULT_HALO_THRESHOLD,
  overlap: bool = False,
  split_blocks: int | None = None,
  row_weight: float = 1.0,
) -> ShardedMatrix:
  """Builds a ShardedMatrix from COO entries of a square num_nodes x num_nodes matrix (any order,
  duplicates summed; `values` None means ones, [E] or [H, E]).

  mesh: a Mesh (default: `make_mesh()`, all devices); axis_name: its axis to shard over
  (default: the mesh's first). bounds: explicit row blocks ([P + 1], contiguous; empty shards
  allowed), default `partition_rows` of the row counts. exchange: "auto", "allgather" or "halo"
  (module docstring); "auto" picks "halo" when each shard's halo chunk is at most
  `halo_threshold` times its rows. overlap: split each shard into an own and a remote part
  (module docstring: SpMM overlaps the exchange; edge softmax and attention refuse it).
  split_blocks: the window schedule's piece size (None: the builder's rule for the padded nnz).
  """
  if exchange not in EXCHANGES:
    raise ValueError(f"exchange must be one of {EXCHANGES}; got {exchange!r}")
  mesh = make_mesh() if mesh is None else mesh
  axis = mesh.axis_names[0] if axis_name is None else axis_name
  if axis not in mesh.axis_names:
    raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}")
  if not halo_threshold >= 0:
    raise ValueError(f"halo_threshold must be >= 0; got {halo_threshold}")
  check_host_mesh(mesh, "shard_coo")
  P = int(mesh.shape[axis])
  n = int(num_nodes)
  rows, cols = sm._index_array("rows", rows), sm._index_array("cols", cols)
  sm._check_indices(rows, cols, (n, n))
  v = sm._input_values(values, rows.size)
  if bounds is None:
    bounds = partition_rows(np.bincount(rows, minlength=n), P, row_weight=row_weight)
  b = _check_bounds(bounds, n, P)
  counts = np.diff(b)
  M = 8 * (-(-int(counts.max(initial=0)) // 8)) + 8
  if M >= ROW_ALIGN_FROM:
    M = ROW_ALIGN * -(-M // ROW_ALIGN)

  # Owners by table lookup (a gather per entry, not a binary search), as 16-bit integers so
  # that the stable argsort below is numpy's radix sort.
  owner_table = np.repeat(np.arange(P, dtype=np.int16), counts)
  row_owner = owner_table[rows]
  col_owner = owner_table[cols]
  order = np.argsort(row_owner, kind="stable")
  starts = np.concatenate([[0], np.cumsum(np.bincount(row_owner, minlength=P))])
  shard_sel = [order[starts[p] : starts[p + 1]] for p in range(P)]

  # Halo lists: recv[p][q] = sorted rows of shard q read by shard p (a mark per node: linear in
  # the entries and nodes, where a unique per pair sorted or hashed).
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
    mode = "halo" if c <= halo_threshold * M else "allgather"
  else:
    mode = exchange
  # Chunks of a multiple of 8 rows: the remote part's own chunk is then whole empty windows of
  # its transpose (the padding's anchor).
  halo = 8 * -(-c // 8) if mode == "halo" else 0
  n_ext = {"none": M, "allgather": P * M, "halo": M + P * halo}[mode]

  def ext_cols(p, cc, qo):
    """Columns cc (owners qo) of shard p's entries in the ext space."""
    if mode == "allgather":
      return qo.astype(np.int64) * M + (cc - b[qo])
    if mode == "none":
      return cc - b[p]
    # halo: a position per node read (own rows, then each chunk's), looked up per entry
    where = np.zeros(n, np.int64)
    where[b[p] : b[p + 1]] = np.arange(counts[p])
    for q in range(P):
      if recv[p][q].size:
        where[recv[p][q]] = M + q * halo + np.arange(recv[p][q].size)
    return where[cc]

  spare = M - 1
  fill_ext = lambda p: p * M + spare if mode == "allgather" else spare  # noqa: E731
  fill_local = lambda p: spare  # noqa: E731
  specs = []  # (kind, entries per shard, columns, fill column)
  if overlap and mode != "none":
    own, remote = [], []
    for p, sel in enumerate(shard_sel):
      mine = col_owner[sel] == p
      s_own, s_rem = sel[mine], sel[~mine]
      own.append((rows[s_own] - b[p], cols[s_own] - b[p], s_own))
      received = ext_cols(p, cols[s_rem], col_owner[s_rem]).astype(np.int64)
      if mode == "halo":
        received -= M  # columns of the received chunks alone
      remote.append((rows[s_rem] - b[p], received, s_rem))
    if mode == "halo":
      # The own chunk's last slot and window: shard p receives nothing in chunk p.
      remote_spec = ("remote", remote, P * halo, lambda p: p * halo + halo - 1)
      remote_window = lambda p: (p * halo + halo) // 8 - 1  # noqa: E731
    else:
      remote_spec = ("remote", remote, n_ext, fill_ext)
      remote_window = None
    specs = [("own", own, M, fill_local, None), (*remote_spec, remote_window)]
  else:
    entries = [
      (rows[sel] - b[p], ext_cols(p, cols[sel], col_owner[sel]).astype(np.int64), sel)
      for p, sel in enumerate(shard_sel)
    ]
    specs = [("all", entries, n_ext, fill_ext, None)]

  part_layouts, part_arrays = [], []
  heads = v.shape[:-1]
  value_blocks = []
  input_positions = np.empty(rows.size, np.int64)
  offset = 0
  nnz_total = 0
  built_parts = []
  for kind, entries, ncols, fill, col_window in specs:
    pl, pa, to_formats = _build_part(kind, entries, M, ncols, fill, split_blocks, col_window)
    part_layouts.append(pl)
    part_arrays.append(pa)
    built_parts.append((pl, pa, entries, to_formats))
    nnz_total += pl.nnz
  for pl, pa, entries, to_formats in built_parts:
    vals = np.zeros(heads + (P, pl.nnz), v.dtype)
    for p, ((_, _, sel), to_format) in enumerate(zip(entries, to_formats)):
      nnz_p = int(pa.nnz[p])
      vals[..., p, :nnz_p] = sm._sum_into(v[..., sel], to_format, nnz_p)
      input_positions[sel] = p * nnz_total + offset + to_format
    value_blocks.append(vals)
    offset += pl.nnz
  vals = value_blocks[0] if len(value_blocks) == 1 else np.concatenate(value_blocks, axis=-1)
  vals = vals.reshape(heads + (P * nnz_total,))

  send = ext_to_global = send_layout = send_arrays = None
  if mode == "halo":
    send = np.zeros((P, P * halo), np.int32)  # send[q, p*halo + j]: local row of q for p
    ext_to_global = np.zeros((P, n_ext), np.int32)
    for p in range(P):
      ext_to_global[p, :M] = p * M + np.arange(M)
      ext_to_global[p, M:] = p * M + M - 1  # unused halo slots: p's spare row
      for q in range(P):
        r = recv[p][q]
        if r.size:
          send[q, p * halo : p * halo + r.size] = r - b[q]
          ext_to_global[p, M + q * halo : M + q * halo + r.size] = q * M + r - b[q]
    # S per shard q: an entry (sent row, slot) per real slot; the slots of q's own chunk (never
    # filled) are S's empty columns, its spare rows S's empty rows, as for the remote part.
    select = []
    for q in range(P):
      slots = np.concatenate(
        [p * halo + np.arange(recv[p][q].size, dtype=np.int64) for p in range(P)]
      )
      select.append((send[q, slots].astype(np.int64), slots, None))
    send_layout, send_arrays, _ = _build_part(
      "send",
      select,
      M,
      P * halo,
      lambda q: q * halo + halo - 1,
      None,
      lambda q: (q * halo + halo) // 8 - 1,
    )
  layout = ShardLayout(
    mesh=mesh,
    axis_name=axis,
    num_nodes=n,
    bounds=tuple(int(x) for x in b),
    rows_per_shard=M,
    nnz_per_shard=nnz_total,
    exchange=mode,
    halo_rows=halo,
    ext_cols=n_ext,
    parts=tuple(part_layouts),
    max_real_halo=int(c),
    send_part=send_layout,
    input_positions=(
      input_positions.astype(np.int32) if P * nnz_total < 2**31 else input_positions
    ),
  )
  sharded = NamedSharding(mesh, PartitionSpec(axis))
  put = lambda a: None if a is None else jax.device_put(a, sharded)  # noqa: E731
  put_part = lambda pa: PartArrays(  # noqa: E731
    a=Pattern(*map(put, pa.a)),
    t=Pattern(*map(put, pa.t)),
    perm_t=put(pa.perm_t),
    perm_t_inv=put(pa.perm_t_inv),
    nnz=put(pa.nnz),
  )
  arrays = ShardArrays(
    parts=tuple(put_part(pa) for pa in part_arrays),
    send=put(send),
    ext_to_global=put(ext_to_global),
    send_select=None if send_arrays is None else put_part(send_arrays),
  )
  values_dev = jax.device_put(vals, NamedSharding(mesh, _edge_spec(vals.ndim, axis)))
  return ShardedMatrix(values_dev, arrays, layout)


def shard_matrix(A, mesh: Mesh | None = None, **kwargs) -> ShardedMatrix:
  """A ShardedMatrix of a square SparseMatrix A (its values; input order = A's format order, so
  `values_from_input(A.values)` maps A's values to the sharded layout). kwargs: shard_coo's."""
  if A.shape[0] != A.shape[1]:
    raise ValueError(f"shard_matrix needs a square matrix; got shape {A.shape}")
  return shard_coo(
    np.asarray(A.rows),
    np.asarray(A.cols),
    np.asarray(A.values),
    num_nodes=A.shape[0],
    mesh=mesh,
    **kwargs,
  )


def shard_scipy(m, mesh: Mesh | None = None, **kwargs) -> ShardedMatrix:
  """A ShardedMatrix of a square scipy.sparse matrix (COO order is the input order)."""
  coo = m.tocoo()
  if coo.shape[0] != coo.shape[1]:
    raise ValueError(f"shard_scipy needs a square matrix; got shape {coo.shape}")
  return shard_coo(coo.row, coo.col, coo.data, num_nodes=coo.shape[0], mesh=mesh, **kwargs)
