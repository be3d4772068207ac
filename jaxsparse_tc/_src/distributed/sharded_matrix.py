"""ShardedMatrix: a square sparse matrix row-partitioned over a mesh axis, each shard a local
SparseMatrix (jaxsparse_tc.distributed.matrix describes the layout). Its operators are
jaxsparse_tc._src.distributed.ops, bound here by `bind_operators` when jaxsparse_tc.distributed is
imported (that module imports this one)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxsparse_tc._src import checks
from jaxsparse_tc._src import sparse_matrix as sm
from jaxsparse_tc._src.distributed.layout import (
  ShardArrays,
  ShardLayout,
  edge_spec,
  node_axis,
  node_spec,
)

_operators = None  # the module of the operators on a ShardedMatrix, once bound


def bind_operators(ops) -> None:
  """Binds the operators on a ShardedMatrix: a module with spmm, sddmm, edge_softmax and
  sparse_attention taking the matrix first (jaxsparse_tc._src.distributed.ops)."""
  global _operators
  _operators = ops


def _ops():
  if _operators is None:
    raise RuntimeError(
      "the operators on a ShardedMatrix are bound when jaxsparse_tc.distributed is imported; "
      "import jaxsparse_tc (or jaxsparse_tc.distributed) first"
    )
  return _operators


@jax.tree_util.register_pytree_node_class
class ShardedMatrix(sm.SparseMatrix):
  """A square n x n sparse matrix, row-partitioned over a mesh axis (the layout:
  jaxsparse_tc.distributed.matrix).

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
      raise ValueError(
        "this ShardedMatrix has no input map (built by another route, or by shard_coo_local "
        "over several processes: each holds only its own entries; pass the values to the "
        "builder)"
      )
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
    return jax.device_put(out, NamedSharding(self.mesh, edge_spec(out.ndim, self.axis_name)))

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
    return jax.device_put(valid, NamedSharding(self.mesh, node_spec(1, self.axis_name)))

  def shard_rows(self, x, fill=0):
    """Dense node data in global order ([n, ...], or [H, n, d]) to the padded sharded layout
    ([P*M, ...] / [H, P*M, d]); padded rows get `fill`. numpy input is sliced on the host and
    each shard's rows go straight to their device."""
    lay = self.layout
    src, valid = self._row_source()
    host = isinstance(x, np.ndarray)
    ndim = np.ndim(x)
    ax = node_axis(ndim)
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
    sharding = NamedSharding(self.mesh, node_spec(ndim, self.axis_name))
    if isinstance(out, jax.core.Tracer):
      return jax.lax.with_sharding_constraint(out, sharding)
    return jax.device_put(out, sharding)

  @property
  def local_shards(self) -> range:
    """The shards (positions along the mesh axis) with a device of this process: all of them
    in a single-process run."""
    from jaxsparse_tc._src.distributed.multihost import local_shards

    return local_shards(self.mesh, self.axis_name)

  @property
  def local_row_range(self) -> tuple[int, int]:
    """(start, stop): the global rows of this process's shards (shard_coo_local's rows)."""
    shards = self.local_shards
    return self.layout.bounds[shards.start], self.layout.bounds[shards.stop]

  def shard_local_rows(self, x, fill=0):
    """shard_rows for several processes: this process's rows only (`x` [stop - start, ...] or
    [H, stop - start, d], the rows of `local_row_range` in order) to the global padded layout
    [P*M, ...] / [H, P*M, d], of which this process holds its shards' rows. Every process calls
    it with its own rows."""
    from jaxsparse_tc._src.distributed.multihost import BuildScope, global_array

    lay = self.layout
    shards = self.local_shards
    start, stop = self.local_row_range
    ndim = np.ndim(x)
    ax = node_axis(ndim)
    if ndim == 0 or np.shape(x)[ax] != stop - start:
      raise checks.OperandError(
        f"shard_local_rows: x must hold this process's {stop - start} rows (global rows "
        f"{start} .. {stop - 1}, local_row_range) in order, shape [{stop - start}, ...] or "
        f"[H, {stop - start}, d]; got shape {np.shape(x)}"
      )
    x = np.asarray(x)
    M = lay.rows_per_shard
    src, valid = self._row_source()
    src, valid = src[shards.start * M : shards.stop * M], valid[shards.start * M : shards.stop * M]
    shape = [1] * ndim
    shape[ax] = src.size
    local = np.where(
      valid.reshape(shape), np.take(x, np.where(valid, src - start, 0), axis=ax), fill
    ).astype(x.dtype)
    scope = BuildScope(shards, lay.num_shards, jax.process_count() > 1)
    return global_array(local, self.mesh, node_spec(ndim, self.axis_name), ax, scope)

  def unshard_rows(self, y):
    """The inverse of shard_rows: [P*M, ...] / [H, P*M, d] to global order [n, ...]."""
    lay = self.layout
    shape, ndim = np.shape(y), np.ndim(y)
    rows = lay.padded_rows
    if ndim == 0 or shape[node_axis(ndim)] != rows:
      got = shape[node_axis(ndim)] if ndim else None
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
      return np.take(y, pos, axis=node_axis(ndim))
    return jnp.take(jnp.asarray(y), jnp.asarray(pos), axis=node_axis(ndim))

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
    return getattr(_ops(), name)(self, *args, **kwargs)

  def __matmul__(self, x):
    return _ops().spmm(self, x)

  def __repr__(self) -> str:
    lay = self.layout
    return (
      f"ShardedMatrix(nodes={lay.num_nodes}, shards={lay.num_shards}, "
      f"rows_per_shard={lay.rows_per_shard}, nnz_per_shard={lay.nnz_per_shard}, "
      f"exchange={lay.exchange!r}, halo_rows={lay.halo_rows}, "
      f"parts={tuple(p.kind for p in lay.parts)}, dtype={self.values.dtype})"
    )
