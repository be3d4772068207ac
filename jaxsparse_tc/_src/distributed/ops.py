"""The library's operators over a ShardedMatrix: one `shard_map` each, in which every device sees
its local matrix (M x n_ext), exchanges the dense rows it reads (all_gather, or all_to_all of
the halo) and runs the ordinary single-device operator.

Gradients come from JAX's transposes of the collectives (all_gather -> reduce-scatter,
all_to_all -> all_to_all, the halo's row gather -> scatter-add) and the primitives' own rules
on the local matrices. Padded value positions: inputs' cotangents there are zeroed
(`_mask_cotangent`); outputs' padded values (which kernels never write) are zeroed.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from jaxsparse_tc._src import checks
from jaxsparse_tc._src.attention import sparse_attention as _attention
from jaxsparse_tc._src.distributed.layout import edge_spec, node_spec
from jaxsparse_tc._src.distributed.sharded_matrix import ShardedMatrix
from jaxsparse_tc._src.edge_softmax import edge_softmax as _edge_softmax
from jaxsparse_tc._src.padding import valid_mask
from jaxsparse_tc._src.sddmm import sddmm as _sddmm
from jaxsparse_tc._src.sparse_matrix import SparseMatrix
from jaxsparse_tc._src.spmm import spmm as _spmm
from jaxsparse_tc._src.spmm import spmm_extremum_positions
from jaxsparse_tc._src.spmm_extremum import REDUCTIONS

__all__ = ["spmm", "sddmm", "edge_softmax", "sparse_attention", "exchange", "shard_map_compat"]


def shard_map_compat(f, mesh, in_specs, out_specs):
  """jax.shard_map (jax >= 0.7) or jax.experimental.shard_map, without replication checks
  (every operand here is sharded along the mesh axis, none replicated)."""
  sm = getattr(jax, "shard_map", None)
  if sm is not None:
    try:
      return sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    except TypeError:
      return sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)
  from jax.experimental.shard_map import shard_map  # pragma: no cover (older jax)

  return shard_map(f, mesh, in_specs, out_specs, check_rep=False)


@jax.custom_vjp
def _mask_cotangent(v, count):
  """Identity; its cotangent is zeroed past the first `count` positions of the last axis (the
  padded values, whose cotangents the kernels leave unwritten)."""
  return v


def _mask_fwd(v, count):
  return v, count


def _mask_bwd(count, ct):
  return jnp.where(valid_mask(count, ct.shape[-1]), ct, jnp.zeros((), ct.dtype)), None


_mask_cotangent.defvjp(_mask_fwd, _mask_bwd)


def _mask_values(v, count):
  """Zeroes the padded positions (outputs: kernels never write them)."""
  return jnp.where(valid_mask(count, v.shape[-1]), v, jnp.zeros((), v.dtype))


def _local(arrays):
  """A shard's arrays without the leading shard axis (of length 1 inside shard_map)."""
  return jax.tree_util.tree_map(lambda a: a[0], arrays)


def _local_matrix(layout, part_layout, part, values) -> SparseMatrix:
  return SparseMatrix(
    values,
    part.a,
    part.t,
    part.perm_t,
    part.perm_t_inv,
    part.perm_t,
    (layout.rows_per_shard, part_layout.cols),
    part_layout.grouped,
    padded=True,
  )


def _split_parts(layout, v):
  """A shard's values [.., nnz_pad] -> one array per part."""
  out, at = [], 0
  for pl in layout.parts:
    out.append(v[..., at : at + pl.nnz])
    at += pl.nnz
  return out


def _join_parts(vs):
  return vs[0] if len(vs) == 1 else jnp.concatenate(vs, axis=-1)


def _single_part(op: str, SA) -> None:
  if SA.layout.overlap:
    raise NotImplementedError(
      f"{op}: this ShardedMatrix was built with overlap=True (own and remote parts); "
      f"{op} needs each row's entries in one pattern: build it with overlap=False"
    )


def _receive(layout, arrays, x):
  """What the exchange brings a shard: every shard's rows [.., P*M, d] (all-gather) or the halo
  chunks [.., P*c, d] (chunk q from shard q). A remote part's columns index it as it is."""
  axis = layout.axis_name
  node = x.ndim - 2
  if layout.exchange == "allgather":
    return jax.lax.all_gather(x, axis, axis=node, tiled=True)
  return jax.lax.all_to_all(_send_rows(layout, arrays, x), axis, node, node, tiled=True)


def _send_rows(layout, arrays, x):
  """The rows a shard sends, [.., P*c, d] (chunk p for shard p): XLA's gather of the send lists;
  its transpose, which adds up the returned cotangents of rows sent to several shards, is the
  SpMM S G with S the 0/1 selection matrix of the send lists (XLA's scatter-add took 1.5 ms of
  a 2-GPU GCN step on R-MAT 2^22; the SpMM as the forward gather cost more than XLA's). Exact:
  one product by 1 per term (float32 asks for exact math). Other dtypes: XLA's rules."""
  node = x.ndim - 2
  sel = arrays.send_select
  if sel is None or not checks.is_supported_float(x.dtype) or x.dtype == jnp.float64:
    return jnp.take(x, arrays.send, axis=node)
  return _gather_rows(layout, arrays.send, sel, x)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gather_rows(layout, send, sel, x):
  """x's rows `send` (along the node axis); sel: the send lists' selection matrix's arrays."""
  del layout, sel
  return jnp.take(x, send, axis=x.ndim - 2)


def _gather_fwd(layout, send, sel, x):
  return _gather_rows(layout, send, sel, x), sel


def _gather_bwd(layout, sel, ct):
  pl = layout.send_part
  S = _local_matrix(layout, pl, sel, valid_mask(sel.nnz, pl.nnz).astype(ct.dtype))
  return None, None, _spmm(S, ct, precision=jax.lax.Precision.HIGHEST)


_gather_rows.defvjp(_gather_fwd, _gather_bwd)


def _exchange(layout, arrays, x):
  """A shard's rows [.., M, d] -> the rows its local matrix's columns index [.., n_ext, d]."""
  if layout.exchange == "none":
    return x
  recv = _receive(layout, arrays, x)
  if layout.exchange == "allgather":
    return recv
  return jnp.concatenate([x, recv], axis=x.ndim - 2)


def _part_operand(layout, arrays, part_layout, x, exchanged=False):
  """The rows a part's columns index: the shard's own (own), the exchange's result as it is
  (remote), or both joined (all). `exchanged`: x is already a shard's ext rows
  ([.., n_ext, d], `exchange`'s result), sliced here instead of exchanged."""
  if not exchanged:
    if part_layout.kind == "own":
      return x
    if part_layout.kind == "remote":
      return _receive(layout, arrays, x)
    return _exchange(layout, arrays, x)
  node, M = x.ndim - 2, layout.rows_per_shard
  if part_layout.kind == "all" or (part_layout.kind == "remote" and layout.exchange == "allgather"):
    return x
  if layout.exchange == "allgather":  # own rows: this shard's block of the gathered rows
    start = jax.lax.axis_index(layout.axis_name) * M
    return jax.lax.dynamic_slice_in_dim(x, start, M, axis=node)
  rows = slice(0, M) if part_layout.kind == "own" else slice(M, None)
  return x[(slice(None),) * node + (rows,)]


def _check_devices(op: str, name: str, SA: ShardedMatrix, x) -> None:
  """An array committed to devices other than SA's mesh (another mesh's ShardedMatrix built it,
  say) is refused by name, where jit would name only its position in a flattened call."""
  if isinstance(x, jax.core.Tracer) or not isinstance(x, jax.Array) or not x.committed:
    return
  mesh_devices = tuple(SA.mesh.devices.flat)
  sharding = x.sharding
  named = isinstance(sharding, NamedSharding)
  devices = tuple(sharding.mesh.devices.flat if named else sharding.device_set)
  same = sharding.device_set == set(mesh_devices)
  if same and named:  # jit also needs the devices in the mesh's order
    same = devices == mesh_devices
  if not same:
    ids = lambda ds: [d.id for d in ds]  # noqa: E731
    got = ids(devices) if named else sorted(ids(devices))
    raise checks.OperandError(
      f"{op}: {name} (shape {x.shape}) lives on devices {got}, but this ShardedMatrix is "
      f"sharded over devices {ids(mesh_devices)} in that order (mesh axis {SA.axis_name!r}); "
      "build its operands with ShardedMatrix.shard_rows"
    )


def _check_edge(op: str, name: str, SA: ShardedMatrix, v) -> None:
  """Values-like operands: [P*nnz_pad] or [H, P*nnz_pad], the sharded value layout."""
  if v.ndim not in (1, 2) or v.shape[-1] != SA.nnz:
    raise checks.OperandError(
      f"{op}: a ShardedMatrix with {SA.nnz} (padded) nonzeros takes {name} [{SA.nnz}] or "
      f"[H, {SA.nnz}] in its sharded value layout; got {name} with shape {v.shape}"
      f"{SA._value_hint(v.shape)}"
    )
  _check_devices(op, name, SA, v)


def _check_dense(op: str, name: str, SA: ShardedMatrix, x, exchanged_ok: bool = False) -> bool:
  """Checks a dense operand's layout; True where it is already exchanged (exchanged_ok: the
  operand is one whose rows the local matrices' columns index, and has SA.exchanged_rows)."""
  _check_devices(op, name, SA, x)
  rows = SA.layout.padded_rows
  if x.ndim in (2, 3) and x.shape[-2] == rows:
    return False
  if exchanged_ok and SA.is_exchanged(x):
    return True
  also = (
    f", or already exchanged, [{SA.exchanged_rows}, d] (distributed.exchange)"
    if exchanged_ok and SA.exchanged_rows != rows
    else ""
  )
  raise checks.OperandError(
    f"{op}: a ShardedMatrix of {SA.num_nodes} nodes on {SA.num_shards} shards takes dense "
    f"operands in its padded layout, [{rows}, d] or [H, {rows}, d] (ShardedMatrix."
    f"shard_rows){also}; got {name} with shape {x.shape}"
  )


def _run(SA: ShardedMatrix, body, edge_args, node_args, out_specs):
  """shard_map of body(arrays, *edge_args, *node_args) over SA's mesh axis."""
  axis = SA.axis_name
  in_specs = (
    PartitionSpec(axis),
    *(edge_spec(a.ndim, axis) for a in edge_args),
    *(node_spec(a.ndim, axis) for a in node_args),
  )
  f = shard_map_compat(body, SA.mesh, in_specs, out_specs)
  return f(SA.arrays, *edge_args, *node_args)


def exchange(SA: ShardedMatrix, x):
  """The rows each shard's local matrix reads: [P*M, d] -> [P*n_ext, d] (shard p's block holds
  its ext rows: its own, then its halo or every shard's rows; n_ext = M where no shard reads
  another's rows). `spmm` takes the result in place of X (and `sddmm` in place of Y) and then
  exchanges nothing: exchange a step's constant operands (input features) once, outside it."""
  x = jnp.asarray(x)
  _check_dense("exchange", "X", SA, x)
  lay = SA.layout

  def body(arrays, x):
    return _exchange(lay, _local(arrays), x)

  return _run(SA, body, (), (x,), node_spec(x.ndim, SA.axis_name))


def spmm(SA: ShardedMatrix, x, *, reduce="sum", precision=None, options=None):
  """SA @ X over the shards: X [P*M, d] or [H, P*M, d] (padded layout) -> the same layout. X may
  also be `exchange(SA, X)` ([P*n_ext, d]): then nothing is exchanged. reduce: "sum", "max" or
  "min", as the single-device spmm; with overlap=True a row's entries lie in two parts (own and
  remote columns), whose maxima (minima) are combined where both parts hold entries of the row
  (a NaN wins; on a tie the own part's entry takes the gradient)."""
  if reduce not in REDUCTIONS:
    raise ValueError(f"spmm: reduce must be one of {REDUCTIONS}; got {reduce!r}")
  x = jnp.asarray(x)
  exchanged = _check_dense("spmm", "X", SA, x, exchanged_ok=True)
  dtype = checks.promoted_dtype("spmm", SA, x)  # as the single-device spmm
  values, x = SA.values.astype(dtype), x.astype(dtype)
  lay = SA.layout

  def body(arrays, values, x):
    arrays = _local(arrays)
    out = held = None
    # Own part first (no exchange): XLA overlaps the exchange for the remote part with it.
    for pl, part, v in zip(lay.parts, arrays.parts, _split_parts(lay, values)):
      A = _local_matrix(lay, pl, part, _mask_cotangent(v, part.nnz))
      xp = _part_operand(lay, arrays, pl, x, exchanged)
      if reduce == "sum":
        y = _spmm(A, xp, precision=precision, options=options)
        out = y if out is None else out + y
        continue
      y, arg = spmm_extremum_positions(A, xp, reduce)
      if out is None:
        out, held = y, arg >= 0
      else:
        out, held = _combine_extrema(reduce, out, held, y, arg >= 0)
    return out

  out_ndim = 3 if values.ndim == 2 or x.ndim == 3 else 2
  return _run(SA, body, (values,), (x,), node_spec(out_ndim, SA.axis_name))


def _combine_extrema(reduce, a, a_held, b, b_held):
  """The max (min) over two parts' results a, b [.., M, d], each 0 in rows its part lacks
  (a_held, b_held: where the part had an entry, from the winning positions): a where b's part
  lacks the row or a wins (NaN included, ties to a)."""
  wins = (a >= b) if reduce == "max" else (a <= b)
  take_a = ~b_held | (a_held & (wins | jnp.isnan(a)))
  return jnp.where(take_a, a, b), a_held | b_held


def sddmm(
  SA: ShardedMatrix,
  x,
  y,
  *,
  scale_by_values: bool = False,
  precision=None,
  preferred_element_type=None,
  options=None,
) -> ShardedMatrix:
  """(X @ Y.T) at SA's nonzeros, as a ShardedMatrix: X, Y [P*M, d] or [H, P*M, d]. Y (the
  columns' side) may also be `exchange(SA, Y)`: then nothing is exchanged."""
  x, y = jnp.asarray(x), jnp.asarray(y)
  _check_dense("sddmm", "X", SA, x)
  y_exchanged = _check_dense("sddmm", "Y", SA, y, exchanged_ok=True)
  if scale_by_values:  # the single-device sddmm's rule: the product in the promoted dtype
    hv = SA.values.shape[0] if SA.values.ndim == 2 else 1
    h = max(x.shape[0] if x.ndim == 3 else 1, y.shape[0] if y.ndim == 3 else 1)
    if hv > 1 and h > 1 and hv != h:
      raise checks.OperandError(
        f"sddmm: scale_by_values=True multiplies the products of X (shape {x.shape}) and Y "
        f"(shape {y.shape}), {h} heads, by SA's values of shape {SA.values.shape}, {hv} heads: "
        "head counts must be equal (or one of them absent)"
      )
    product = x.dtype if preferred_element_type is None else jnp.dtype(preferred_element_type)
    target = checks.promoted_dtype("sddmm", SA, x, product)
    if target != product:
      if x.dtype.itemsize == 2 and target == jnp.float32:
        preferred_element_type = jnp.float32
      else:
        x, y = x.astype(target), y.astype(target)
  lay = SA.layout

  def body(arrays, x, y):
    arrays = _local(arrays)
    outs = []
    for pl, part in zip(lay.parts, arrays.parts):
      A = _local_matrix(lay, pl, part, jnp.zeros((pl.nnz,), x.dtype))
      S = _sddmm(
        A,
        x,
        _part_operand(lay, arrays, pl, y, y_exchanged),
        precision=precision,
        preferred_element_type=preferred_element_type,
        options=options,
      )
      outs.append(_mask_values(S.values, part.nnz))
    return _join_parts(outs)

  out_ndim = 2 if x.ndim == 3 or y.ndim == 3 else 1
  out = _run(SA, body, (), (x, y), edge_spec(out_ndim, SA.axis_name))
  if scale_by_values:
    out = out * SA.values.astype(out.dtype)
  return SA.with_values(out)


def edge_softmax(SA: ShardedMatrix, values=None) -> ShardedMatrix:
  """Row softmax over SA's nonzeros (its values, or `values` in the sharded layout)."""
  v = SA.values if values is None else jnp.asarray(values)
  _check_edge("edge_softmax", "values", SA, v)
  _single_part("edge_softmax", SA)
  lay = SA.layout

  def body(arrays, v):
    arrays = _local(arrays)
    part = arrays.parts[0]
    v = _mask_cotangent(v, part.nnz)
    out = _edge_softmax(_local_matrix(lay, lay.parts[0], part, v)).values
    return _mask_values(out, part.nnz)

  return SA.with_values(_run(SA, body, (v,), (), edge_spec(v.ndim, SA.axis_name)))


def sparse_attention(SA: ShardedMatrix, Q, K, V, *, scale=None, bias=None, options=None):
  """Fused sparse attention over the shards: Q, K [P*M, d], V [P*M, dv] (or with heads, padded
  layout); bias [P*nnz_pad] or [H, P*nnz_pad] in the sharded value layout. K and V travel in
  one exchange where their leading shapes and dtypes agree."""
  q, k, v = (jnp.asarray(a) for a in (Q, K, V))
  for name, a in (("Q", q), ("K", k), ("V", v)):
    _check_dense("sparse_attention", name, SA, a)
  if bias is not None:
    bias = jnp.asarray(bias)
    _check_edge("sparse_attention", "bias", SA, bias)
  _single_part("sparse_attention", SA)
  if q.shape[-1] == 0 or k.shape[-1] == 0:
    raise checks.OperandError(
      f"sparse_attention: Q (shape {q.shape}) and K (shape {k.shape}) have no features; "
      "attention needs d >= 1"
    )
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
  lay = SA.layout
  fuse = k.shape[:-1] == v.shape[:-1] and k.dtype == v.dtype
  dk = k.shape[-1]
  edge = () if bias is None else (jnp.asarray(bias),)

  def body(arrays, *args):
    arrays = _local(arrays)
    part = arrays.parts[0]
    b = None
    if edge:
      b, *args = args
      b = _mask_cotangent(b, part.nnz)
    q, k, v = args
    if fuse:
      kv = _exchange(lay, arrays, jnp.concatenate([k, v], axis=-1))
      k, v = kv[..., :dk], kv[..., dk:]
    else:
      k, v = _exchange(lay, arrays, k), _exchange(lay, arrays, v)
    A = _local_matrix(lay, lay.parts[0], part, jnp.zeros((lay.nnz_per_shard,), q.dtype))
    return _attention(A, q, k, v, scale=scale, bias=b, options=options)

  heads = q.ndim == 3 or k.ndim == 3 or v.ndim == 3 or (bias is not None and edge[0].ndim == 2)
  return _run(SA, body, edge, (q, k, v), node_spec(3 if heads else 2, SA.axis_name))
