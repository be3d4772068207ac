"""Building a ShardedMatrix from COO entries: the row partition, the exchange plan, each shard's
padded parts (both orientations, as SparseMatrix builds them) and the values in the sharded
layout, put on the mesh's devices."""

from __future__ import annotations

import concurrent.futures

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from jaxsparse_tc._src import integrity, padding
from jaxsparse_tc._src import pattern as pattern_lib
from jaxsparse_tc._src import sparse_matrix as sm
from jaxsparse_tc._src.distributed import multihost
from jaxsparse_tc._src.distributed.halo import (
  DEFAULT_HALO_THRESHOLD,
  EXCHANGES,
  ExchangePlan,
  plan_exchange,
)
from jaxsparse_tc._src.distributed.layout import (
  PartArrays,
  PartLayout,
  ShardArrays,
  ShardLayout,
  edge_spec,
)
from jaxsparse_tc._src.distributed.mesh import check_host_mesh, make_mesh
from jaxsparse_tc._src.distributed.multihost import local_row_range, process_scope, whole_scope
from jaxsparse_tc._src.distributed.partition import (
  check_bounds,
  check_padded_nodes,
  check_shard_entries,
  partition_rows,
  plan_rows,
  rows_per_shard,
  shard_entries,
  shard_nnz,
  value_offsets,
)
from jaxsparse_tc._src.distributed.sharded_matrix import ShardedMatrix
from jaxsparse_tc._src.options import FormatOptions
from jaxsparse_tc._src.pattern import Pattern


def _build_local(rows: np.ndarray, cols: np.ndarray, m: int, n: int, format_options):
  """Both orientations of one shard's pattern (numpy, as SparseMatrix.from_coo builds them):
  (pattern, pattern_t, perm_t, perm_t_inv, input_to_format)."""
  return sm.build_orientations(rows, cols, m, n, format_options)[:5]


def _build_part(
  kind, shard_entries, M, n_cols, fill_col, split_blocks, empty_col_window=None, scope=None
):
  """One part of every shard of `scope` (default: all): shard_entries[i] = (local rows, part
  columns, entry selection) of shard scope.shards[i]. fill_col(p): a column of shard p's part
  that no entry uses; empty_col_window(p): a window of 8 such columns (default M // 8 - 1, the
  columns of shard 0's spare rows). The padded sizes and schedules are agreed over the scope's
  processes. Returns (PartLayout, stacked padded numpy PartArrays fields of the scope's shards,
  per-shard input_to_format)."""
  scope = whole_scope(len(shard_entries)) if scope is None else scope
  fmt = None if split_blocks is None else FormatOptions(split_blocks=split_blocks)
  # The builder releases the GIL (and builds each shard's two orientations on two threads).
  with concurrent.futures.ThreadPoolExecutor(max(1, min(len(shard_entries), 8))) as pool:
    built = list(pool.map(lambda e: _build_local(e[0], e[1], M, n_cols, fmt), shard_entries))
  nnz_pad = int(scope.agree_max([max(1, max(bt[0].rows.shape[0] for bt in built))])[0])
  grouped_a, grouped_t = (
    bool(g)
    for g in scope.agree_all(
      [
        split_blocks is None
        and all(pattern_lib.grouped_schedule_fits(bt[k].window_block_ptr, nnz_pad) for bt in built)
        for k in (0, 1)
      ]
    )
  )
  pats_a = [padding.reschedule(bt[0], M, nnz_pad, grouped_a, split_blocks) for bt in built]
  pats_t = [padding.reschedule(bt[1], n_cols, nnz_pad, grouped_t, split_blocks) for bt in built]
  sizes = scope.agree_max(
    [padding.max_sizes([padding.pattern_sizes(p) for p in pats]) for pats in (pats_a, pats_t)]
  )
  size_a, size_t = (padding.PadSizes(*map(int, row))._replace(nnz=nnz_pad) for row in sizes)
  # Padding entries sit at the shard's spare row (the last row of its spare window, empty in A)
  # and an unused column fill_col(p) (M - 1 in a local column space, p * M + M - 1 in the
  # allgather space, the last slot of the shard's own chunk in the halo's received space), which
  # is an empty row of A^T.
  spare, empty_window = M - 1, M // 8 - 1
  if empty_col_window is None:
    empty_col_window = lambda p: empty_window  # noqa: E731

  def stacked(pats, sizes, pad_args):
    """The shards' patterns padded to `sizes`, written straight into [P, ...] arrays: the first
    padded on its own gives the shapes, the others are padded in place."""
    first = padding.pad_pattern(pats[0], sizes, **pad_args(scope.shards[0]))
    out = Pattern(*(np.empty((len(pats),) + f.shape, f.dtype) for f in first))
    for field, f in zip(out, first):
      field[0] = f
    for i in range(1, len(pats)):
      pad = pad_args(scope.shards[i])
      padding.pad_pattern(pats[i], sizes, **pad, out=Pattern(*(f[i] for f in out)))
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
  (jaxsparse_tc.distributed.matrix describes them); "auto" picks "halo" when each shard's halo
  chunk is at most `halo_threshold` times its rows. overlap: split each shard into an own and a
  remote part (SpMM overlaps the exchange; edge softmax and attention refuse it).
  split_blocks: the window schedule's piece size (None: the builder's rule for the padded nnz).
  """
  mesh, axis = _mesh_axis(mesh, axis_name, exchange, halo_threshold, "shard_coo")
  P = int(mesh.shape[axis])
  n, rows, cols, v = _entries(rows, cols, values, num_nodes)
  b, _, M = plan_rows(np.bincount(rows, minlength=n), P, bounds, row_weight=row_weight)
  scope = whole_scope(P)
  return _build(
    rows, cols, v, n, mesh, axis, b, M, scope, exchange, halo_threshold, overlap, split_blocks
  )


def shard_coo_local(
  rows,
  cols,
  values=None,
  *,
  num_nodes: int,
  mesh: Mesh | None = None,
  axis_name: str | None = None,
  row_range=None,
  bounds=None,
  exchange: str = "auto",
  halo_threshold: float = DEFAULT_HALO_THRESHOLD,
  overlap: bool = False,
  split_blocks: int | None = None,
  row_weight: float = 1.0,
) -> ShardedMatrix:
  """This process's part of a ShardedMatrix over the processes of a multi-process run
  (`jax.distributed.initialize`; docs/DISTRIBUTED.md): every process calls it, with the entries
  of its own rows only, and gets the same global ShardedMatrix, whose arrays hold on each
  process only the shards of its own devices (no process holds the whole graph). With one
  process it builds what `shard_coo` builds.

  rows, cols: global ids (rows within this process's row range, cols any node); values: as
  shard_coo's. The mesh (default `make_mesh()`: every device of every process) must give each
  process consecutive shards of the axis. The rows each process holds:
  - bounds (the global row blocks [P + 1], the same in every process): its shards' blocks;
  - else row_range = (start, stop) (default `local_row_range`: the rows cut evenly by count):
    the processes' ranges must tile 0 .. num_nodes in process order; each process's shards
    split its range balanced by nonzeros (`partition_rows`).
  The layout's global sizes (padded rows, nonzeros, halo, exchange) are agreed across the
  processes, and each shard's halo send lists reach it through an all_to_all on the mesh.
  The other options are shard_coo's. `values_from_input` is available only where one process
  holds every shard (it maps the input order of all entries).
  """
  mesh, axis = _mesh_axis(mesh, axis_name, exchange, halo_threshold, "shard_coo_local")
  scope = process_scope(mesh, axis)
  P, shards = scope.num_shards, scope.shards
  n, rows, cols, v = _entries(rows, cols, values, num_nodes)
  if bounds is not None:
    b = check_bounds(bounds, n, P)
    start, stop = local_row_range(n, mesh, axis, bounds=b)
  else:
    if row_range is None:
      start, stop = local_row_range(n, mesh, axis)
    else:
      start, stop = (int(r) for r in row_range)
      if not 0 <= start <= stop <= n:
        raise ValueError(
          f"row_range must be (start, stop) with 0 <= start <= stop <= num_nodes={n}; got "
          f"{tuple(row_range)}"
        )
  if rows.size and (rows.min() < start or rows.max() >= stop):
    raise ValueError(
      f"shard_coo_local: this process (index {jax.process_index()}) holds rows {start} .. "
      f"{stop - 1}; got entries of rows {int(rows.min())} .. {int(rows.max())}"
    )
  row_nnz = np.bincount(rows - start, minlength=stop - start)
  if bounds is None:
    mine = partition_rows(row_nnz, len(shards), row_weight=row_weight) + start
    # Every process's block starts and stops, -1 where another process tells them.
    ends = np.full((2, P), -1, np.int64)
    ends[0, shards.start : shards.stop] = mine[:-1]
    ends[1, shards.start : shards.stop] = mine[1:]
    ends = scope.agree_max(ends)
    if ends.min() < 0 or ends[0, 0] != 0 or ends[1, -1] != n or np.any(ends[1, :-1] != ends[0, 1:]):
      raise ValueError(
        f"shard_coo_local: the processes' row ranges must tile the {n} rows in process (shard) "
        f"order; their shards' row blocks start at {ends[0].tolist()} and stop at "
        f"{ends[1].tolist()}"
      )
    b = np.concatenate([ends[0], [n]])
  check_shard_entries(shard_nnz(row_nnz, b[shards.start : shards.stop + 1] - start))
  M = rows_per_shard(np.diff(b))
  check_padded_nodes(P, M)
  return _build(
    rows, cols, v, n, mesh, axis, b, M, scope, exchange, halo_threshold, overlap, split_blocks
  )


def _mesh_axis(mesh, axis_name, exchange, halo_threshold, op):
  if exchange not in EXCHANGES:
    raise ValueError(f"exchange must be one of {EXCHANGES}; got {exchange!r}")
  mesh = make_mesh() if mesh is None else mesh
  axis = mesh.axis_names[0] if axis_name is None else axis_name
  if axis not in mesh.axis_names:
    raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}")
  if not halo_threshold >= 0:
    raise ValueError(f"halo_threshold must be >= 0; got {halo_threshold}")
  check_host_mesh(mesh, op)
  return mesh, axis


def _entries(rows, cols, values, num_nodes):
  """(n, rows, cols, values) checked: COO entries of an n x n matrix."""
  n = int(num_nodes)
  integrity.check_dims(n, n, "num_nodes gives the shape")
  rows, cols = integrity.index_array("rows", rows), integrity.index_array("cols", cols)
  # The whole graph may hold more entries than one format: plan_rows checks each shard's.
  sm._check_indices(rows, cols, (n, n), limit_entries=False)
  return n, rows, cols, sm._input_values(values, rows.size)


def _build(
  rows, cols, v, n, mesh, axis, b, M, scope, exchange, halo_threshold, overlap, split_blocks
) -> ShardedMatrix:
  """The ShardedMatrix of the row blocks b (M padded rows each), built for the shards of
  `scope` from their entries (rows, cols global ids; values v [..., E])."""
  P, shards = scope.num_shards, scope.shards
  col_owner, shard_sel = shard_entries(rows, cols, np.diff(b))
  shard_sel = [shard_sel[p] for p in shards]
  plan = plan_exchange(cols, shard_sel, b, M, exchange, halo_threshold, shards, scope.agree_max)
  check_padded_nodes(P, M, plan.ext_cols)
  specs = _part_specs(plan, rows, cols, col_owner, shard_sel, overlap, shards)
  parts = [
    (_build_part(kind, entries, M, ncols, fill, split_blocks, col_window, scope), entries)
    for kind, entries, ncols, fill, col_window in specs
  ]
  vals, input_positions, nnz_total = _shard_values(parts, v, rows.size, P, shards)
  send = ext_to_global = send_layout = send_arrays = None
  if plan.mode == "halo":
    halo = plan.halo_rows
    transpose = None
    if not scope.whole:

      def transpose(recv_rows, counts):
        every = np.zeros((P, P), np.int64)
        every[shards.start : shards.stop] = counts
        send = multihost.transpose_send_lists(recv_rows, mesh, axis, scope, halo)
        return send, scope.agree_max(every)

    send, ext_to_global, _, select = plan.send_lists(shards, transpose)
    send_layout, send_arrays, _ = _build_part(
      "send",
      select,
      M,
      P * halo,
      lambda q: q * halo + halo - 1,
      None,
      lambda q: (q * halo + halo) // 8 - 1,
      scope,
    )
  if not scope.whole:
    input_positions = None  # the other processes' entries are not here
  elif P * nnz_total < 2**31:
    input_positions = input_positions.astype(np.int32)
  layout = ShardLayout(
    mesh=mesh,
    axis_name=axis,
    num_nodes=n,
    bounds=tuple(int(x) for x in b),
    rows_per_shard=M,
    nnz_per_shard=nnz_total,
    exchange=plan.mode,
    halo_rows=plan.halo_rows,
    ext_cols=plan.ext_cols,
    parts=tuple(pl for (pl, _, _), _ in parts),
    max_real_halo=int(plan.max_halo),
    send_part=send_layout,
    input_positions=input_positions,
  )
  spec = PartitionSpec(axis)
  put = lambda a: None if a is None else multihost.global_array(a, mesh, spec, 0, scope)  # noqa: E731
  put_part = lambda pa: PartArrays(  # noqa: E731
    a=Pattern(*map(put, pa.a)),
    t=Pattern(*map(put, pa.t)),
    perm_t=put(pa.perm_t),
    perm_t_inv=put(pa.perm_t_inv),
    nnz=put(pa.nnz),
  )
  arrays = ShardArrays(
    parts=tuple(put_part(pa) for (_, pa, _), _ in parts),
    send=put(send),
    ext_to_global=put(ext_to_global),
    send_select=None if send_arrays is None else put_part(send_arrays),
  )
  values_dev = multihost.global_array(vals, mesh, edge_spec(vals.ndim, axis), vals.ndim - 1, scope)
  return ShardedMatrix(values_dev, arrays, layout)


def _part_specs(plan: ExchangePlan, rows, cols, col_owner, shard_sel, overlap: bool, shards):
  """The parts of the local matrices of `shards` (shard_sel[i]: shards[i]'s entries): (kind,
  per shard (local rows, part columns, entry selection), columns, fill column of shard p, empty
  column window of shard p or None).
  One part "all" in the ext space; with overlap (and an exchange), "own" (the shard's own
  columns, local) and "remote" (the received rows' columns)."""
  b, M, P, mode = plan.bounds, plan.rows_per_shard, plan.num_shards, plan.mode
  halo, n_ext = plan.halo_rows, plan.ext_cols
  spare = M - 1
  fill_ext = lambda p: p * M + spare if mode == "allgather" else spare  # noqa: E731
  fill_local = lambda p: spare  # noqa: E731
  if overlap and mode != "none":
    own, remote = [], []
    for p, sel in zip(shards, shard_sel):
      mine = col_owner[sel] == p
      s_own, s_rem = sel[mine], sel[~mine]
      own.append((rows[s_own] - b[p], cols[s_own] - b[p], s_own))
      received = plan.ext_columns(p, cols[s_rem], col_owner[s_rem]).astype(np.int64)
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
    return [("own", own, M, fill_local, None), (*remote_spec, remote_window)]
  entries = [
    (rows[sel] - b[p], plan.ext_columns(p, cols[sel], col_owner[sel]).astype(np.int64), sel)
    for p, sel in zip(shards, shard_sel)
  ]
  return [("all", entries, n_ext, fill_ext, None)]


def _shard_values(parts, v, num_entries: int, P: int, shards):
  """The values of `shards` in the sharded layout ([..., len(shards) * nnz_total]: per shard
  its parts' padded values one after the other; duplicates summed), the flat position of each
  input entry in the layout of all P shards, and nnz_total (padded values per shard, all
  parts)."""
  heads = v.shape[:-1]
  part_nnz = [pl.nnz for (pl, _, _), _ in parts]
  nnz_total = sum(part_nnz)
  starts = value_offsets(P, part_nnz)  # int64: P * nnz_total may pass 2^31
  value_blocks = []
  input_positions = np.empty(num_entries, np.int64)
  for i, ((pl, pa, to_formats), entries) in enumerate(parts):
    vals = np.zeros(heads + (len(shards), pl.nnz), v.dtype)
    for j, (p, (_, _, sel), to_format) in enumerate(zip(shards, entries, to_formats)):
      nnz_p = int(pa.nnz[j])
      vals[..., j, :nnz_p] = sm._sum_into(v[..., sel], to_format, nnz_p)
      input_positions[sel] = starts[p, i] + to_format.astype(np.int64)
    value_blocks.append(vals)
  vals = value_blocks[0] if len(value_blocks) == 1 else np.concatenate(value_blocks, axis=-1)
  return vals.reshape(heads + (len(shards) * nnz_total,)), input_positions, nnz_total


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
